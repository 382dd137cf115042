"""The package's import graph, read from the sources (lazy and TYPE_CHECKING imports
included), for the layout and code-digest tests."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "rlcore"


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    """Every module of the package, by dotted name."""
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def resolve(name: str, known: Iterable[str]) -> str | None:
    """The module an imported name lives in: `rlcore.a.b.C` -> `rlcore.a.b`."""
    known = set(known)
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imported(nodes: Iterable[ast.AST], package: str, known: Iterable[str]) -> set[str]:
    """The rlcore modules named by the import statements among `nodes` (relative ones
    resolved against `package`)."""
    known = set(known)
    out: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0]
                base = f"{anchor}.{base}" if base else anchor
            names = [base, *(f"{base}.{a.name}" for a in node.names)]
        else:
            continue
        out |= {m for n in names if n.startswith("rlcore") and (m := resolve(n, known))}
    return out


def imports_of(path: Path, known: Iterable[str]) -> set[str]:
    """Every rlcore module the file at `path` imports, anywhere in it."""
    this = module_name(path) if path.is_relative_to(PACKAGE) else ""
    package = this if path.name == "__init__.py" else this.rpartition(".")[0]
    return imported(ast.walk(ast.parse(path.read_text())), package, known) - {this}


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(path, known) for name, path in known.items()}


def closure(start: Iterable[str], graph: dict[str, set[str]]) -> set[str]:
    """`start` and every module reachable from it; importing `a.b.c` runs the packages
    `a` and `a.b` first, so they count too."""
    seen: set[str] = set()
    todo = list(start)
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        parent = m.rpartition(".")[0]
        todo.extend([*graph.get(m, ()), *([parent] if parent in graph else [])])
    return seen
