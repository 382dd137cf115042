"""An installed plugin as docs/extending.md describes it, for the tests that need one."""

from __future__ import annotations

from pathlib import Path

# docs/extending.md's plugin: a distribution of its own whose `rlcore.objectives` entry point
# names the module that registers the objective, so that every process registers it.
PLUGIN = '''"""A plugin's objective: a third of the plain policy gradient."""
from rlcore.algo.objectives import pg
from rlcore.algo.registry import Objective, register


def third_pg(x, k):
    loss, stats = pg(x, k)
    return loss / 3, stats


register(Objective("third_pg", "a third of pg (a plugin)", "rlcore_toy_plugin:third_pg"))
'''


def install_plugin(site: Path) -> None:
    """What `pip install` of a package with the entry point leaves in site-packages."""
    (site / "rlcore_toy_plugin.py").write_text(PLUGIN)
    info = site / "rlcore_toy_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rlcore-toy-plugin\n"
                                   "Version: 0.1\n")
    (info / "entry_points.txt").write_text("[rlcore.objectives]\n"
                                           "third_pg = rlcore_toy_plugin\n")
