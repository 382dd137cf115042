"""The Snakemake pipeline on a small grid: lint, a full run, nothing left to do, staleness."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.conftest import small_config

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def small_pipeline_config() -> dict:
    return {
        "run": small_config("models/tiny"),
        "build_base": True,
        "grid": {"modes": {"sync": [0], "areal": [1]}, "objectives": ["pg"], "seeds": [0]},
        "mode_settings": {"areal": {"staleness": {"staleness_control": "both"}}},
    }


def snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(
        [str(BIN / "snakemake"), "-s", str(ROOT / "Snakefile"), "--directory", str(workdir),
         "--cores", "1", "--resources", "gpu=2", *args],
        capture_output=True, text=True, env=env, timeout=600,
    )


def write_config(workdir: Path, data: dict) -> None:
    (workdir / "config").mkdir(parents=True, exist_ok=True)
    (workdir / "config" / "config.yaml").write_text(yaml.safe_dump(data))


def planned_jobs(result: subprocess.CompletedProcess) -> dict[str, int]:
    """The job counts of a dry run's 'Job stats' table."""
    lines = result.stdout.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("Job stats")), None)
    if start is None:
        return {}
    counts = {}
    for line in lines[start + 3:]:
        parts = line.split()
        if len(parts) != 2 or parts[0] == "total":
            break
        counts[parts[0]] = int(parts[1])
    return counts


def test_lint_and_format():
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    lint = subprocess.run([str(BIN / "snakemake"), "--lint"], cwd=ROOT, capture_output=True,
                          text=True, env=env)
    assert lint.returncode == 0 and "good condition" in lint.stdout + lint.stderr, lint.stdout
    fmt = subprocess.run([str(BIN / "snakefmt"), "--check", "Snakefile", "workflow"], cwd=ROOT,
                         capture_output=True, text=True)
    assert fmt.returncode == 0, fmt.stderr


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    workdir = tmp_path_factory.mktemp("pipeline")
    write_config(workdir, small_pipeline_config())
    result = snakemake(workdir)
    assert result.returncode == 0, result.stderr[-3000:]
    return workdir


def test_full_run_produces_tables(pipeline: Path):
    for mode, k in (("sync", 0), ("areal", 1)):
        run = pipeline / "results" / "runs" / mode / f"k{k}" / "pg" / "seed0"
        assert (run / "summary.json").is_file() and (run / "eval.json").is_file()
    table = (pipeline / "results" / "tables" / "table1.md").read_text()
    assert "| sync | 0 | pg | 1 |" in table and "| areal | 1 | pg | 1 |" in table
    assert (pipeline / "results" / "tables" / "k_sweep.csv").read_text().count("\n") == 3


def test_second_invocation_has_nothing_to_do(pipeline: Path):
    result = snakemake(pipeline, "-n")
    assert result.returncode == 0
    assert "Nothing to be done" in result.stdout + result.stderr


def plan_after_edit(workdir: Path, edit: Callable[[dict], None]) -> dict[str, int]:
    """The jobs a dry run plans after `edit` is applied to the config (then restored)."""
    data = small_pipeline_config()
    edit(data)
    write_config(workdir, data)
    try:
        return planned_jobs(snakemake(workdir, "-n"))
    finally:
        write_config(workdir, small_pipeline_config())


def test_changing_one_mode_reruns_only_its_runs(pipeline: Path):
    jobs = plan_after_edit(pipeline, lambda d: d["mode_settings"]["areal"]["staleness"].update(
        interrupt="continue"))
    # the areal run (and its config, eval and the tables) -- nothing of sync, not the base
    assert jobs.get("run") == 1 and jobs.get("eval_run") == 1 and jobs.get("tables") == 1
    assert "base_model" not in jobs


def test_adding_a_k_value_adds_only_those_runs(pipeline: Path):
    jobs = plan_after_edit(pipeline, lambda d: d["grid"]["modes"].update(areal=[1, 2]))
    assert jobs.get("run") == 1 and jobs.get("eval_run") == 1 and jobs.get("tables") == 1


@pytest.fixture
def source_copy(tmp_path: Path) -> Path:
    """A copy of the workflow and the package sources whose digests the Snakefile takes."""
    copy = tmp_path / "src"
    copy.mkdir()
    for name in ("Snakefile", "workflow", "rlcore", "reports"):
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, copy / name, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, copy / name)
    (copy / "environment.yml").write_text((ROOT / "environment.yml").read_text())
    return copy


def plan_with_sources(workdir: Path, sources: Path) -> dict[str, int]:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(
        [str(BIN / "snakemake"), "-s", str(sources / "Snakefile"), "--directory", str(workdir),
         "--cores", "1", "--resources", "gpu=2", "-n"],
        capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    return planned_jobs(result)


def test_code_edits_rerun_what_depends_on_them(pipeline: Path, source_copy: Path):
    assert plan_with_sources(pipeline, source_copy) == {}  # identical sources: up to date
    analysis = source_copy / "rlcore" / "analysis.py"
    analysis.write_text(analysis.read_text() + "\n# an edit\n")
    jobs = plan_with_sources(pipeline, source_copy)
    assert jobs.get("tables") == 1 and "run" not in jobs and "eval_run" not in jobs
    controller = source_copy / "rlcore" / "runners" / "areal" / "controller.py"
    controller.write_text(controller.read_text() + "\n# an edit\n")
    jobs = plan_with_sources(pipeline, source_copy)
    assert jobs.get("run") == 2 and jobs.get("eval_run") == 2 and jobs.get("tables") == 1
