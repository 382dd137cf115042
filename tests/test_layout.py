"""The package layout: imports point down the layers, with no cycle, lazy and TYPE_CHECKING
imports included, and docs/layout.md names every package."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.import_graph import PACKAGE, ROOT, import_graph, imported, modules

# Bottom to top: a module may import from its own layer or from a layer below.
LAYERS = (
    "rlcore.errors",
    "rlcore.registry",
    "rlcore.allocator",
    "rlcore.code_digest",
    "rlcore.algo",
    # The suites' registry reads no suite (names and "module:attribute"), so the config may.
    "rlcore.tasks.registry",
    "rlcore.config",
    "rlcore.kernels",
    "rlcore.clock",
    "rlcore.tasks",
    "rlcore.policy",
    "rlcore.record",
    "rlcore.evaluation",
    "rlcore.runners",
    "rlcore.replay",
    "rlcore.plan",
    "rlcore.pipeline",
    "rlcore.analysis",
    "rlcore.measure",
    "rlcore.cli",
    "rlcore.launcher",
    "rlcore.__main__",
)
# What only reads finished runs imports no runtime (the runs' code digest leaves it out).
ANALYSIS_MAY_IMPORT = ("rlcore.errors", "rlcore.config", "rlcore.algo", "rlcore.record",
                       "rlcore.analysis")


def layer(module: str) -> int:
    for i, prefix in enumerate(LAYERS):
        if module == prefix or module.startswith(prefix + "."):
            return i
    raise AssertionError(f"{module} is in no layer of tests/test_layout.py: add it to LAYERS")


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def upward(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets
                  if a != "rlcore" and b != "rlcore" and layer(b) > layer(a))


class TestImports:
    def test_no_cycle(self):
        assert find_cycle(import_graph()) is None

    def test_imports_point_down(self):
        assert upward(import_graph()) == []

    def test_analysis_reads_finished_runs_only(self):
        wrong = [f"{a} -> {b}" for a, targets in import_graph().items()
                 if a.startswith("rlcore.analysis") for b in targets
                 if not b.startswith(ANALYSIS_MAY_IMPORT)]
        assert wrong == []

    def test_the_checks_see_cycles_upward_and_hidden_imports(self):
        assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c",
                                                                               "a"]
        assert find_cycle({"a": {"b"}, "b": set()}) is None
        assert upward({"rlcore.record.ledger": {"rlcore.runners.common"}}) == [
            "rlcore.record.ledger -> rlcore.runners.common"]
        source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                  "    from rlcore.cli import main\n"
                  "def f():\n    import rlcore.runners.sync\n"
                  "from .models import x\n")
        found = imported(ast.walk(ast.parse(source)), "rlcore.policy", modules())
        assert found >= {"rlcore.cli", "rlcore.runners.sync", "rlcore.policy"}


def test_the_layout_page_names_every_package():
    """docs/layout.md lists each package of rlcore/ (and nothing that is not one)."""
    section = (ROOT / "docs" / "layout.md").read_text()
    packages = {p.parent.relative_to(ROOT).as_posix() + "/"
                for p in PACKAGE.rglob("__init__.py")}
    named = set(re.findall(r"`(rlcore/(?:[a-z_]+/)*)`", section))
    assert packages - named == set(), "docs/layout.md omits these packages"
    assert named - packages == set(), "docs/layout.md names packages that do not exist"


def test_the_layout_page_names_every_module_in_its_package_row():
    """Each module of a package is named in that package's row of docs/layout.md."""
    rows = dict(re.findall(r"^\| `(rlcore/(?:[a-z_]+/)*)` \| (.*)\|\s*$",
                           (ROOT / "docs" / "layout.md").read_text(), re.MULTILINE))
    missing = [f"{init.parent.relative_to(ROOT).as_posix()}/{f.name}"
               for init in sorted(PACKAGE.rglob("__init__.py"))
               for f in sorted(init.parent.glob("*.py"))
               if f.name != "__init__.py"
               and f"`{f.name}`" not in rows.get(init.parent.relative_to(ROOT).as_posix() + "/",
                                                 "")]
    assert missing == [], "docs/layout.md: name these modules in their package's row"


def package_docstrings() -> dict[Path, str]:
    return {init.parent: ast.get_docstring(ast.parse(init.read_text())) or ""
            for init in sorted(PACKAGE.rglob("__init__.py"))}


def test_every_package_says_what_it_holds():
    """Each package's docstring says what it is for (docs/layout.md's row is the longer map)."""
    silent = [str(d.relative_to(ROOT)) for d, doc in package_docstrings().items()
              if len(doc.split()) < 5]
    assert silent == [], "give these packages a docstring"


def test_a_package_docstrings_module_table_lists_exactly_its_modules():
    """A docstring that maps its package's modules, one per line (`name.py  what it does`),
    names each module of the package and none that is gone."""
    wrong = {}
    for directory, doc in package_docstrings().items():
        listed = set(re.findall(r"^\s*([a-z_0-9]+\.py|[a-z_]+/)\s{2,}\S", doc, re.MULTILINE))
        if not listed:
            continue
        present = {f.name for f in directory.glob("*.py") if f.name != "__init__.py"}
        present |= {f"{d.name}/" for d in directory.iterdir() if (d / "__init__.py").is_file()}
        if listed != present:
            wrong[str(directory.relative_to(ROOT))] = {
                "not listed": sorted(present - listed), "gone": sorted(listed - present)}
    assert wrong == {}, wrong
