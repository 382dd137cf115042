"""Which of the package's files each pipeline stage depends on, and their digest.

Snakemake does not see the modules a job imports, so each rule takes a digest of the code
its outputs depend on as a parameter, and an edit reruns what it can change. The parts are
packages, not lists of modules, so a new or moved module is counted without an edit:
  base      what `rlcore build-base` runs: `config/` with the registries it reads
            (`registry.py`, `algo/registry.py`, not the losses), `kernels.py`,
            `allocator.py`, `clock/`, `tasks/`, `policy/` and the command;
  runtime   every file of `rlcore/` (modules, the task data and the schemas it ships) except
            the packages that only read finished runs (`analysis/`), measure them
            (`measure/`), predict them (`plan/`), expand the grid into them (`pipeline/`,
            which only the Snakefile imports; a run's settings are its rule's parameter) or
            start them (`launcher/`, whose jobs
            match a cold `rlcore run` bit for bit: tests/test_launcher.py): the runs and the
            replays;
  launcher  the runtime part and `rlcore/launcher/`: what a warm launcher server has
            imported, so that an edit of either starts a new server;
  plan      the runtime part and `rlcore/plan/`: the planner's predictions, whose roles'
            twins use the runtime's scheduler, admission and rules;
  analysis  `rlcore/analysis/`: the tables and figures, with the rule's own script.
An installed plugin (docs/extending.md) is outside `rlcore/`: the runs and the base model
whose config names one of its objectives or suites add the digest of its top-level package
(`plugin_digest`), so an edit of it reruns those and nothing else.
What analysis imports from below it (`algo/`, `record/`, `config/`) is runtime code, whose
edits rerun the runs that every table and figure takes as input. `tests/test_code_digest.py`
checks that each rule's imports stay within these parts.
"""

from __future__ import annotations

import hashlib
import importlib.util
from collections.abc import Iterable
from pathlib import Path

PACKAGE = "rlcore"
# packages no run, replay or base-model job imports
NOT_RUNTIME = ("analysis", "measure", "plan", "launcher", "pipeline")
# The command and the packages that building the base model imports.
BASE = ("__init__.py", "__main__.py", "cli.py", "errors.py", "registry.py", "kernels.py",
        "allocator.py", "algo/__init__.py", "algo/registry.py", "config", "clock", "tasks",
        "policy")


def _package_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")


def base_files(root: Path) -> list[Path]:
    """The files the embedded base model depends on, below the source tree `root`."""
    package = root / PACKAGE
    return [p for p in _package_files(package)
            if p.relative_to(package).parts[0] in BASE
            or p.relative_to(package).as_posix() in BASE]


def runtime_files(root: Path) -> list[Path]:
    """The files a run's results depend on, below the source tree `root`."""
    package = root / PACKAGE
    skip = tuple(package / name for name in NOT_RUNTIME)
    return [p for p in _package_files(package)
            if not any(p.is_relative_to(s) for s in skip)]


def plan_files(root: Path) -> list[Path]:
    """The files a plan depends on, below the source tree `root`."""
    return runtime_files(root) + _package_files(root / PACKAGE / "plan")


def launcher_files(root: Path) -> list[Path]:
    """The files a warm launcher server runs jobs with, below the source tree `root`."""
    return runtime_files(root) + _package_files(root / PACKAGE / "launcher")


def analysis_files(root: Path) -> list[Path]:
    """The files tables and figures are drawn by, below the source tree `root`."""
    return _package_files(root / PACKAGE / "analysis")


def digest(root: Path, paths: Iterable[Path]) -> str:
    """A short digest of the files' paths (relative to `root`) and contents."""
    h = hashlib.sha256()
    for path in sorted(paths):
        h.update(path.relative_to(root).as_posix().encode())
        h.update(b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def package_files(module: str) -> tuple[Path, list[Path]]:
    """(the directory it sits in, its files) for the installed top-level package or module
    that `module` belongs to, found without importing it."""
    top = module.partition(".")[0]
    spec = importlib.util.find_spec(top)
    if spec is None:
        raise ModuleNotFoundError(f"no installed module {top!r} (named by {module!r})")
    if spec.submodule_search_locations:
        where = Path(next(iter(spec.submodule_search_locations)))
        return where.parent, _package_files(where)
    if spec.origin is None:
        raise ModuleNotFoundError(f"module {top!r} has no file to digest")
    return Path(spec.origin).parent, [Path(spec.origin)]


def plugin_digest(modules: Iterable[str]) -> str:
    """'package:digest' of each top-level package the plugin `modules` belong to, joined by
    '+' (paths relative to where each is installed); '' for none."""
    tops = sorted({m.partition(".")[0] for m in modules})
    return "+".join(f"{t}:{digest(*package_files(t))}" for t in tops)
