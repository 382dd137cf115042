"""The shell commands README.md and docs/ give a reader to paste run here as far as a CPU
machine allows: the program is where the page says, its flags parse, and a pipeline plans
(`snakemake -n`) from a fresh clone's state. A command that needs a GPU, a download or a
cluster says so on its page."""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import importlib.util
import io
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.snakemake_run import ENV, PROFILE
from tests.tool_module import load_tool

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = ".venv/bin/"

# What a command needs that a CPU machine here lacks, and the words its page must say beside
# it (in the paragraph before the block, or in the block's own comments).
NEEDS = {
    "gpu": re.compile(r"\bneeds?\b[^.]*\bCUDA GPUs?\b"),
    "download": re.compile(r"\bneeds?\b[^.]*\bdownload\b"),
    "slurm": re.compile(r"\bneeds?\b[^.]*\bSlurm\b"),
}
# Inline spans that name a program but are no command to paste (a program's flags in prose).
MENTIONS = {"python -I -S", "rlcore launcher: WHY; running the command cold"}
# The block of docs/extending.md that regenerates config/README.md: run whole by its own test.
REGENERATE = "config-schema --markdown"
# The configs whose model directory is a download.
DOWNLOADED_MODEL = re.compile(r"config/paper[\w-]*\.yaml")


@dataclass(frozen=True)
class Command:
    page: str  # the page's path, relative to the root it was read from
    line: int  # where on the page
    argv: tuple[str, ...]
    context: str  # the paragraph before its block and the block (or the span's paragraph)
    block: bool  # from a fenced block, or an inline span

    @property
    def pasted(self) -> bool:
        """Given to paste: a block's line, or an inline span naming the venv's program (other
        inline spans are synopses: `rlcore plan CONFIG [--hardware P]`)."""
        return self.block or self.argv[0].startswith(VENV_BIN)

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {shlex.join(self.argv)}"


FENCE = re.compile(r"^([ \t]*)```(\w*)[^\n]*\n(.*?)^\1```", re.M | re.S)
SHELL = {"sh", "bash", "console", "shell", ""}
PROGRAM = re.compile(r"^(?:\.venv/bin/\S+|make|rlcore|python3?|snakemake|hf|pip|PATH=\S+)(?:\s|$)")


def pages(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def logical_lines(text: str, console: bool) -> Iterator[tuple[int, str]]:
    """(offset in the block, line) of each command, continuations joined; in a console block
    only the lines after a `$ ` prompt."""
    lines, start, pending = text.splitlines(), 0, ""
    for i, line in enumerate(lines):
        if console and not pending:
            if not line.lstrip().startswith("$ "):
                continue
            line = line.lstrip()[2:]
        if not pending:
            start = i
        pending += line.rstrip().removesuffix("\\") + " " if line.rstrip().endswith("\\") \
            else line
        if not line.rstrip().endswith("\\"):
            if pending.strip():
                yield start, pending.strip()
            pending = ""


def extract(root: Path) -> list[Command | str]:
    """Every command on the pages under `root`: a Command, or for a block whose text is no
    command line a message saying so."""
    found: list[Command | str] = []
    for path in pages(root):
        text = path.read_text()
        page = path.relative_to(root).as_posix()
        for m in FENCE.finditer(text):
            if m.group(2) not in SHELL or REGENERATE in m.group(3):
                continue
            line = text[:m.start()].count("\n") + 1
            before = text[:m.start()].rstrip().rsplit("\n\n", 1)[-1]
            for offset, cmd in logical_lines(m.group(3), m.group(2) == "console"):
                try:
                    argv = tuple(shlex.split(cmd, comments=True))
                except ValueError as e:
                    found.append(f"{page}:{line + 1 + offset}: cannot split {cmd!r}: {e}")
                    continue
                for one in split_on_operators(argv):
                    found.append(Command(page, line + 1 + offset, one,
                                         before + "\n" + m.group(3), True))
        prose = FENCE.sub(lambda b: "\n" * b.group(0).count("\n"), text)
        for para in re.split(r"\n\s*\n", prose):
            for span in re.findall(r"`([^`]+)`", para):
                span = " ".join(span.split())
                if not PROGRAM.match(span) or span in MENTIONS or len(span.split()) < 2:
                    continue
                line = prose.count("\n", 0, prose.index(para)) + 1
                try:
                    argv = tuple(shlex.split(span))
                except ValueError:
                    argv = tuple(span.split())
                for one in split_on_operators(argv, ("&&", ";")):  # `|` is a synopsis's
                    found.append(Command(page, line, one, para, False))
    return found


def split_on_operators(argv: tuple[str, ...], operators: tuple[str, ...] = (
        "&&", "||", ";", "|")) -> list[tuple[str, ...]]:
    """`a && b`, `a; b`: each command alone."""
    out: list[tuple[str, ...]] = [()]
    for token in argv:
        if token in operators:
            out.append(())
        else:
            out[-1] += (token.removesuffix(";"),)
    return [c for c in out if c]


# --- what each program is -------------------------------------------------------------------


def makefile(root: Path) -> tuple[set[str], set[str]]:
    """The Makefile's targets and variables."""
    text = (root / "Makefile").read_text()
    targets = set(re.findall(r"^([\w-]+):(?!=)", text, re.M))
    variables = set(re.findall(r"^(\w+)\s*[?:]?=", text, re.M))
    return targets, variables


def placeholders(argv: list[str]) -> list[str]:
    """Placeholders (DIR, CONFIG, N, X.Y.Z, $OUT, ...) as values a parser takes."""
    out = []
    for a in argv:
        if a in ("...", "…"):
            continue
        if re.fullmatch(r"\$\w+|[A-Z][A-Z_]*(\.\.\.)?|X\.Y\.Z", a):
            a = "1" if a in ("N", "R", "T", "S") else "x"
        out.append(a)
    return out


class Parsed(Exception):
    """Raised in place of running a command, once its arguments parsed."""


def parse_with(parser_of: Any, argv: list[str]) -> str | None:
    """Why `argv` does not parse, or None."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser_of(argv)
    except Parsed:
        return None
    except SystemExit as e:
        return None if e.code in (0, None) else err.getvalue().strip().splitlines()[-1]
    return None


def rlcore_parse(argv: list[str]) -> None:
    from rlcore.cli import build_parser

    build_parser(argv).parse_args(argv)
    raise Parsed


def rlcore_flags(argv: list[str]) -> str | None:
    """A synopsis: its subcommand exists and takes each --flag it names."""
    from rlcore.cli import build_parser

    sub = next((a for a in argv if not a.startswith("-")), None)
    actions = build_parser(argv)._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    if sub not in actions:
        return f"rlcore has no command {sub!r}"
    known = {o for a in actions[sub]._actions for o in a.option_strings}
    unknown = [a.split("=")[0] for a in argv if a.startswith("--") and a.split("=")[0] not in known]
    return f"rlcore {sub} takes no {unknown}" if unknown else None


def tool_parse(name: str) -> Any:
    """A function parsing a tools/ script's arguments without running it."""
    module = load_tool(name)
    if hasattr(module, "parser"):

        def own(argv: list[str]) -> None:
            module.parser().parse_args(argv)
            raise Parsed

        return own
    if name == "device_wheels":  # reads sys.argv itself: nothing, or --check

        def wheels(argv: list[str]) -> None:
            if argv not in ([], ["--check"]):
                raise SystemExit(f"tools/device_wheels.py takes nothing or --check, not {argv}")
            raise Parsed

        return wheels

    def through_main(argv: list[str]) -> None:
        real = argparse.ArgumentParser.parse_args

        def parse_then_stop(self: argparse.ArgumentParser, args: Any = None,
                            namespace: Any = None) -> Any:
            real(self, args, namespace)
            raise Parsed

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
            mp.setattr(sys, "argv", [f"tools/{name}.py", *argv])
            module.main(argv) if "argv" in module.main.__code__.co_varnames else module.main()

    return through_main


def snakemake_parse(argv: list[str]) -> None:
    from snakemake.cli import get_argument_parser

    get_argument_parser().parse_args(argv)
    raise Parsed


def python_c(code: str) -> str | None:
    """A `python -c` program compiles and every name it imports exists."""
    try:
        tree = ast.parse(code)
    except SyntaxError as e:
        return f"does not compile: {e}"
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            module = importlib.import_module(node.module)
            missing = [a.name for a in node.names if not hasattr(module, a.name)]
            if missing:
                return f"{node.module} has no {missing}"
    return None


@dataclass
class Verdict:
    problems: list[str]
    needs: set[str]
    plan: tuple[str, ...] | None = None  # config files a `make run` of it plans


def venv_on_path(context: str) -> bool:
    return bool(re.search(r"source \.venv/bin/activate|PATH=\$PWD/\.venv/bin", context))


def check(cmd: Command, root: Path) -> Verdict:
    """What is wrong with `cmd` as far as a CPU machine tells, and what else it needs."""
    argv = list(cmd.argv)
    env_path = False
    while argv and re.fullmatch(r"\w+=\S*", argv[0]):  # VAR=value prefixes
        env_path |= argv[0].startswith("PATH=") and ".venv/bin" in argv[0]
        argv = argv[1:]
    v = Verdict([], set())
    if not argv:
        return Verdict([f"{cmd}: no program"], set())
    program, args = argv[0], argv[1:]
    if program.startswith(VENV_BIN):
        if not (ROOT / program).exists():  # the venv is this checkout's, whatever the root
            v.problems.append(f"{cmd}: no {program} after make setup")
        program = program.removeprefix(VENV_BIN)
    elif program in ("rlcore", "snakemake", "hf", "pip", "tensorboard", "python", "python3") and (
            cmd.pasted) and not (
            env_path or venv_on_path(cmd.context)):
        v.problems.append(f"{cmd}: `{program}` is on no PATH the page sets up: write "
                          f"{VENV_BIN}{program}, or put .venv/bin on PATH first")
    if program == "make":
        targets, variables = makefile(root)
        goals = [a for a in args if "=" not in a] or ["all"]
        sets = dict(a.split("=", 1) for a in args if "=" in a)
        v.problems += [f"{cmd}: the Makefile has no target {g!r}" for g in goals
                       if g not in targets]
        v.problems += [f"{cmd}: the Makefile sets no {k}" for k in sets if k not in variables]
        configs = tuple(sets.get("CONFIG", "config/config.yaml").split())
        v.problems += [f"{cmd}: no {c}" for c in configs if "CONFIG" in sets
                       and not (root / c).is_file()]
        if "gpu-check" in goals:
            v.needs.add("gpu")
        if "setup" in goals and "TORCH_INDEX" in sets:
            v.needs.add("download")
        if "run" in goals:
            if any(DOWNLOADED_MODEL.search(c) for c in configs):
                v.needs |= {"gpu", "download"}
            else:
                v.plan = configs
        return v
    if program == "rlcore":
        why = (parse_with(rlcore_parse, placeholders(args)) if cmd.pasted
               else rlcore_flags(args))
        if why:
            v.problems.append(f"{cmd}: {why}")
        needs_of_rlcore(args, v)
        v.problems += [f"{cmd}: no {a}" for i, a in enumerate(args)
                       if re.fullmatch(r"config/[\w/.-]+\.yaml", a) and args[i - 1] != "--out"
                       and not (root / a).is_file()]
        return v
    if program in ("python", "python3"):
        return check_python(cmd, args, root, v)
    if program == "snakemake":
        why = parse_with(snakemake_parse, placeholders(args))
        if why:
            v.problems.append(f"{cmd}: {why}")
        files = [a for a in args if a.endswith(".yaml")]
        v.problems += [f"{cmd}: no {f}" for f in files if not (root / f).is_file()]
        if "workflow/profiles/slurm" in args:
            v.needs.add("slurm")
        if any(re.search(r"gsm8k-sample|paper", f) for f in files):
            v.needs.add("download")  # the model directory, checked before it plans
        return v
    if program == "hf":
        v.needs.add("download")
        return v
    if program == "pip":
        extras = re.findall(r"\[([\w,]+)\]", " ".join(args))
        declared = (root / "pyproject.toml").read_text()
        v.problems += [f"{cmd}: pyproject.toml has no extra {e!r}"
                       for group in extras for e in group.split(",")
                       if not re.search(rf"^{e} = \[", declared, re.M)]
        return v
    if program == "tensorboard":
        return v
    return Verdict([f"{cmd}: an unknown program {program!r}. Classify it in "
                    "tests/test_docs_commands.py::check (what exists, what parses, what it "
                    "needs), or, if the page names it without giving it to paste, add the span "
                    "to MENTIONS"], set())


def needs_of_rlcore(args: list[str], v: Verdict) -> None:
    if any(a.startswith("cuda") for a in args):
        v.needs.add("gpu")
    if args[:1] == ["fetch-model"]:
        v.needs.add("download")
    if args[:1] in (["plan"], ["run"], ["smoke"], ["bench"]) and any(
            DOWNLOADED_MODEL.fullmatch(a) for a in args) and not any(
            a.startswith("model.path=") for a in args):
        v.needs.add("download")  # the model directory a plan reads


def check_python(cmd: Command, args: list[str], root: Path, v: Verdict) -> Verdict:
    if args[:1] == ["-c"] and len(args) > 1:
        if why := python_c(args[1]):
            v.problems.append(f"{cmd}: {why}")
        return v
    if args[:1] == ["-m"] and len(args) > 1:
        module, rest = args[1], args[2:]
        if module == "rlcore.launcher":
            if rest not in ([], ["--status"], ["--stop"]):
                why = parse_with(rlcore_parse, placeholders(rest)) if cmd.pasted else (
                    rlcore_flags(rest))
                if why:
                    v.problems.append(f"{cmd}: {why}")
            return v
        if module == "pytest":
            files = [a for a in rest if a.endswith(".py")]
            v.problems += [f"{cmd}: no {f}" for f in files if not (root / f).is_file()]
            marks = re.findall(r"^\s*\"(\w+):", (root / "pyproject.toml").read_text(), re.M)
            for i, a in enumerate(rest[:-1]):
                if a == "-m" and rest[i + 1].split()[-1] not in marks:
                    v.problems.append(f"{cmd}: no pytest marker {rest[i + 1]!r}")
                if a == "-m" and "cuda" in rest[i + 1] and "not" not in rest[i + 1]:
                    v.needs.add("gpu")
            return v
        if module == "pip":
            return v
        try:
            importlib.util.find_spec(module)
        except ModuleNotFoundError:
            v.problems.append(f"{cmd}: no module {module}")
        return v
    if args and args[0].startswith("tools/") and args[0].endswith(".py"):
        name = Path(args[0]).stem
        if not (root / args[0]).is_file():
            v.problems.append(f"{cmd}: no {args[0]}")
            return v
        why = parse_with(tool_parse(name), placeholders(args[1:]))
        if why:
            v.problems.append(f"{cmd}: {why}")
        if name == "gpu_check" and not {"--budget", "--help", "--compare"} & set(args) and (
                "cpu" not in args):
            v.needs.add("gpu")
        return v
    return Verdict([f"{cmd}: an unknown python command. Classify it in "
                    "tests/test_docs_commands.py::check_python"], set())


def unmarked(cmd: Command, v: Verdict) -> list[str]:
    """The needs `cmd`'s page does not state beside it (a synopsis is no command to paste)."""
    return [f"{cmd}: needs {need}, which its page does not say beside it (write, e.g., "
            "'(needs a CUDA GPU)', '(needs a download)' or '(needs a Slurm cluster)')"
            for need in sorted(v.needs) if cmd.pasted and not NEEDS[need].search(cmd.context)]


def problems(root: Path) -> tuple[list[str], list[tuple[str, ...]]]:
    """Every problem of the pages under `root`, and the distinct `make run` plans."""
    out, plans = [], []
    for cmd in extract(root):
        if isinstance(cmd, str):
            out.append(cmd)
            continue
        v = check(cmd, root)
        out += v.problems + unmarked(cmd, v)
        if v.plan and v.plan not in plans:
            plans.append(v.plan)
    return out, plans


# --- the tests ------------------------------------------------------------------------------


def test_every_command_exists_parses_and_says_what_it_needs():
    found, _ = problems(ROOT)
    assert found == [], "\n".join(found)


def test_the_pages_give_commands_of_each_kind():
    """The extraction sees blocks and inline commands alike, so an empty list is no pass."""
    cmds = [c for c in extract(ROOT) if isinstance(c, Command)]
    assert sum(c.block for c in cmds) >= 20 and sum(not c.block for c in cmds) >= 50
    assert {c.argv[0] for c in cmds} >= {"make", ".venv/bin/rlcore", ".venv/bin/hf"}


def test_an_unknown_or_unmarked_command_fails(tmp_path: Path):
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(
        "Run it:\n\n```sh\nfrobnicate --all\nmake gpu-check\nrlcore run x --out y\n```\n")
    found, _ = problems(tmp_path)
    assert len(found) == 3, found
    assert "unknown program 'frobnicate'" in found[0] and "Classify it" in found[0]
    assert "needs gpu" in found[1]
    assert "is on no PATH" in found[2]


def test_a_bad_flag_or_target_fails(tmp_path: Path):
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(
        "```sh\n.venv/bin/rlcore run config/config.yaml --out x --no-such-flag\n"
        "make no-such-target\n```\n\nAs `rlcore plan CONFIG --no-such` says.\n")
    found, _ = problems(tmp_path)
    assert len(found) == 4, found  # the flag, its config, the target, the synopsis's flag
    assert "unrecognized arguments: --no-such-flag" in found[0]
    assert "no config/config.yaml" in found[1]
    assert "no target 'no-such-target'" in found[2]
    assert "rlcore plan takes no ['--no-such']" in found[3]


@pytest.mark.slow
def test_each_make_run_the_pages_give_plans_from_a_fresh_clone(tmp_path: Path):
    """`make run [CONFIG=...]` as the pages give it: Snakemake plans it (-n) in a directory
    that holds what a fresh clone does (config/), with no model or results yet."""
    _, plans = problems(ROOT)
    assert ("config/config.yaml",) in plans
    for configs in plans:
        work = tmp_path / "-".join(Path(c).stem for c in configs)
        shutil.copytree(ROOT / "config", work / "config")
        result = subprocess.run(
            [str(ROOT / ".venv" / "bin" / "snakemake"), "-s", str(ROOT / "Snakefile"),
             "--directory", str(work), "--profile", str(PROFILE), "--configfile", *configs,
             "--replace-workflow-config", "-n"],
            capture_output=True, text=True, env=ENV, timeout=600)
        assert result.returncode == 0, f"{configs}: {result.stderr[-2000:]}"
        assert "This was a dry-run" in result.stdout, configs


@pytest.mark.slow
def test_the_regeneration_block_rewrites_config_readme_as_it_is(tmp_path: Path):
    """docs/extending.md's block regenerating config/README.md, run on a copy: it gives the
    file as committed (tests/test_docs.py checks that the file is current)."""
    text = (ROOT / "docs" / "extending.md").read_text()
    block = next(m.group(3) for m in FENCE.finditer(text) if REGENERATE in m.group(3))
    (tmp_path / "config").mkdir()
    shutil.copy(ROOT / "config" / "README.md", tmp_path / "config" / "README.md")
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    subprocess.run(["bash", "-euc", block], cwd=tmp_path, check=True, timeout=120)
    assert (tmp_path / "config" / "README.md").read_text() == (
        ROOT / "config" / "README.md").read_text()
