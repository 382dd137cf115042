"""Each pipeline job's code digest covers every module the job can import.

The digests (`rlcore/code_digest.py`) hash packages; these tests follow the imports, lazy
ones included, from what each rule runs and fail when one leaves the rule's part. The
pipeline tests (`tests/test_workflow.py`) show what an edit of each part reruns.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlcore.code_digest import (
    analysis_files,
    base_files,
    digest,
    launcher_files,
    plan_files,
    runtime_files,
)
from tests.import_graph import ROOT, closure, import_graph, imported, module_name, modules

# The functions of rlcore/cli.py each job's command runs (besides main, entry and the parser),
# or the module cli.py imports for it by name (cli.ELSEWHERE).
COMMANDS = {"run": ("_run",), "replay": ("_replay",), "base_model": ("_build_base",),
            "plan": ("rlcore.plan.command",)}
ALWAYS = ("main", "entry", "build_parser")


def command_imports(functions: tuple[str, ...]) -> set[str]:
    """The rlcore modules `rlcore <command>` imports directly: cli's module-level imports,
    those inside the named functions and the named modules (cli.py itself is in every
    part)."""
    tree = ast.parse((ROOT / "rlcore" / "cli.py").read_text())
    nodes = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    for fn in tree.body:
        if isinstance(fn, ast.FunctionDef) and fn.name in (*functions, *ALWAYS):
            nodes += list(ast.walk(fn))
    by_name = {f for f in functions if f.startswith("rlcore.")}
    return (imported(nodes, "rlcore", modules()) | by_name) - {"rlcore.cli"}


def test_commands_named_elsewhere_are_in_packages_no_job_imports():
    """cli.py imports a command's module by name only for the commands of packages outside
    the runtime part: a job's own command never loads them."""
    from rlcore.cli import ELSEWHERE

    runtime = set(runtime_files(ROOT))
    for module, _ in ELSEWHERE.values():
        assert modules()[module] not in runtime, module


def outside(names: set[str], part: list[Path]) -> list[str]:
    """The modules among `names` whose file the part does not hash."""
    known, hashed = modules(), set(part)
    return sorted(n for n in names if known[n] not in hashed)


@pytest.mark.parametrize("rule", ["run", "replay"])
def test_run_and_replay_jobs_import_only_runtime_code(rule: str):
    reached = closure(command_imports(COMMANDS[rule]), import_graph())
    # the closure is real: the runners, the replay and the evaluation are in it
    assert {"rlcore.runners.areal", "rlcore.runners.asynchronous.rollout",
            "rlcore.evaluation"} <= reached or rule == "replay"
    assert {"rlcore.replay.replayer", "rlcore.evaluation"} <= reached or rule == "run"
    assert outside(reached, runtime_files(ROOT)) == []


def test_plan_job_imports_only_plan_code():
    reached = closure(command_imports(COMMANDS["plan"]), import_graph())
    assert "rlcore.plan.roles" in reached
    assert outside(reached, plan_files(ROOT)) == []


def test_base_model_job_imports_only_base_code():
    reached = closure(command_imports(COMMANDS["base_model"]), import_graph())
    assert "rlcore.policy.tiny" in reached
    assert outside(reached, base_files(ROOT)) == []


@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "workflow" / "scripts")
                                          .glob("*.py")))
def test_table_and_figure_scripts_import_analysis_and_runtime_code(script: str):
    """A script's rule hashes analysis/; what analysis imports below it is runtime code,
    hashed by the runs that are the rule's inputs. Nothing reaches measure/."""
    path = ROOT / "workflow" / "scripts" / script
    direct = imported(ast.walk(ast.parse(path.read_text())), "", modules())
    reached = closure(direct, import_graph())
    assert any(n.startswith("rlcore.analysis") for n in reached)
    assert outside(reached, analysis_files(ROOT) + runtime_files(ROOT)) == []


def test_a_leak_is_caught():
    """Were a runner to import a figure module, the runs' part would not cover it."""
    graph = import_graph()
    graph["rlcore.runners.sync"] = graph["rlcore.runners.sync"] | {
        "rlcore.analysis.figures.style"}
    reached = closure(command_imports(COMMANDS["run"]), graph)
    assert "rlcore.analysis.figures.style" in outside(reached, runtime_files(ROOT))


def test_every_part_holds_the_command():
    cli = ROOT / "rlcore" / "cli.py"
    assert cli in base_files(ROOT) and cli in runtime_files(ROOT)


def test_parts_split_the_package():
    """Every file of rlcore/ is in the runtime part or in analysis/, measure/, plan/,
    launcher/ or pipeline/ (which only the Snakefile imports: a run's settings, which it
    computes, are the run rule's parameter); the base part is within the runtime part, the
    runtime within the launcher's."""
    every = {p for p in (ROOT / "rlcore").rglob("*")
             if p.is_file() and "__pycache__" not in p.parts}
    runtime, analysis = set(runtime_files(ROOT)), set(analysis_files(ROOT))
    outside = {p for p in every if any(p.is_relative_to(ROOT / "rlcore" / name)
                                       for name in ("measure", "plan", "launcher",
                                                    "pipeline"))}
    assert runtime | analysis | outside == every
    assert not runtime & (analysis | outside)
    assert set(base_files(ROOT)) < runtime < set(launcher_files(ROOT))


def toplevel_imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The rlcore modules a module imports when it is imported: its statements outside
    functions (and outside `if TYPE_CHECKING:`)."""
    def run_at_import(body: list[ast.stmt]) -> Iterator[ast.stmt]:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                yield from run_at_import(node.orelse)
                continue
            yield node
            for field in ("body", "orelse", "finalbody", "handlers"):
                yield from run_at_import(getattr(node, field, []))

    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    return imported(run_at_import(ast.parse(path.read_text()).body), package, known) - {name}


def test_the_launcher_part_holds_what_its_server_imports():
    """A warm launcher server is replaced when its part changes, so the part must hold
    every rlcore module the server has imported before it forks a job: what its preload
    list imports at import time. What a job imports later, it reads from disk itself."""
    from rlcore.launcher.server import PRELOAD

    known = modules()
    graph = {name: toplevel_imports(path, known) for name, path in known.items()}
    start = {n for n in PRELOAD if n.startswith("rlcore")} | {"rlcore.launcher.server"}
    reached = closure(start, graph)
    assert {"rlcore.launcher.job", "rlcore.runners.areal", "rlcore.cli"} <= reached
    assert not any(n.startswith(("rlcore.measure", "rlcore.plan")) for n in reached)
    assert outside(reached, launcher_files(ROOT)) == []


def test_digest_follows_paths_and_contents(tmp_path: Path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("x = 1\n")
    b.write_text("x = 1\n")
    first = digest(tmp_path, [a])
    assert digest(tmp_path, [b]) != first  # same content, another file
    a.write_text("x = 2\n")
    assert digest(tmp_path, [a]) != first
