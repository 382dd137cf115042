"""The pipeline on Slurm through Snakemake's Slurm executor: the submit line a run job gets,
and the small grid end to end on a single-node Slurm started on this machine."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import small_pipeline_config
from tests.snakemake_run import BIN, ENV, ROOT, snakemake, write_config
from tests.test_workflow import FIGURES, planned_jobs

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
PLUGIN = importlib.util.find_spec("snakemake_executor_plugin_slurm") is not None
needs_plugin = pytest.mark.skipif(
    not PLUGIN, reason="needs the Slurm executor plugin: pip install -e '.[slurm]'")
SLURM_PROFILE = ROOT / "workflow" / "profiles" / "slurm"
# Quick status checks for a local test; a real cluster keeps the plugin's defaults.
LOCAL = ["--slurm-no-account", "--slurm-status-command", "squeue",
         "--slurm-init-seconds-before-status-checks", "1"]


def on_slurm(workdir: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "snakemake"), "-s", str(ROOT / "Snakefile"), "--directory", str(workdir),
         "--profile", str(SLURM_PROFILE), *LOCAL, *args],
        capture_output=True, text=True, env=env or ENV, timeout=900)


@needs_plugin
def test_a_run_job_asks_slurm_for_two_gpus(tmp_path: Path):
    """The submit line, read from a stand-in `sbatch` (no Slurm, no GPU needed)."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sbatch").write_text('#!/bin/sh\necho "$@" >> "$SBATCH_LOG"\nexit 1\n')
    for tool in ("squeue", "sinfo", "scontrol", "sacct", "sacctmgr"):
        (fake / tool).write_text("#!/bin/sh\nexit 0\n")
    for tool in fake.iterdir():
        tool.chmod(0o755)
    workdir = tmp_path / "work"
    data = small_pipeline_config()
    data["grid"]["blocks"] = data["grid"]["blocks"][1:]  # the one AReaL-style run
    # The claims compare it with the sync run; the paper's figures are keyed by claim.
    del data["claims"], data["reported"]
    write_config(workdir, data)
    log = tmp_path / "sbatch.log"
    env = {**ENV, "PATH": f"{fake}{os.pathsep}{ENV['PATH']}", "SBATCH_LOG": str(log)}
    # Ask for the run job alone: its inputs are made locally first.
    local = snakemake(workdir, "--until", "run_config", "base_model")
    assert local.returncode == 0, local.stderr[-2000:]
    on_slurm(workdir, "--until", "run", "--retries", "0", env=env)
    lines = log.read_text().splitlines()
    assert len(lines) == 1 and "--comment rule_run_wildcards" in lines[0], lines
    assert "--gpus=2" in lines[0].split()


SLURM_READY = (PLUGIN and os.geteuid() == 0 and shutil.which("slurmctld") is not None
               and shutil.which("munged") is not None)


@pytest.fixture(scope="module")
def local_slurm(tmp_path_factory: pytest.TempPathFactory):
    """tests/local_slurm.sh: a single-node Slurm for the duration of this module."""
    if not SLURM_READY:
        pytest.skip("needs root, the Slurm executor plugin and Debian's slurm-wlm and munge "
                    "(apt-get install slurm-wlm munge)")
    state = tmp_path_factory.mktemp("slurm")
    up = subprocess.run([str(ROOT / "tests" / "local_slurm.sh"), "up", str(state)],
                        capture_output=True, text=True, timeout=120)
    if up.returncode != 0:  # 3: not installed or a foreign slurm.conf; else it did not start
        subprocess.run([str(ROOT / "tests" / "local_slurm.sh"), "down", str(state)], timeout=60)
        pytest.skip(f"a local Slurm could not be started here: {up.stderr.strip()[-1500:]}")
    yield state
    subprocess.run([str(ROOT / "tests" / "local_slurm.sh"), "down", str(state)], timeout=60)


def slurm_jobs() -> list[dict[str, str]]:
    """Every job this Slurm still knows (it keeps finished ones for MinJobAge)."""
    out = subprocess.run(["squeue", "-t", "all", "-h", "-o", "%i|%k|%T"], capture_output=True,
                         text=True, check=True).stdout
    return [dict(zip(("id", "comment", "state"), line.split("|"), strict=True))
            for line in out.splitlines()]


def table(path: Path) -> dict[tuple[str, str], dict[str, str]]:
    with open(path, newline="") as f:
        return {(r["mode"], r["staleness_k"]): r for r in csv.DictReader(f)}


def test_small_grid_end_to_end_on_slurm(local_slurm: Path, pipeline: Path, tmp_path: Path):
    """The same grid as the workflow tests' `pipeline`, run with the default profile."""
    config = small_pipeline_config()
    on_cluster, planned_here = tmp_path / "slurm", tmp_path / "plan"
    for workdir in (on_cluster, planned_here):
        write_config(workdir, config)
    before = {j["id"] for j in slurm_jobs()}

    result = on_slurm(on_cluster, "--set-resources", "run:gpu=0", "replay:gpu=0",
                      "base_eval:gpu=0")
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = [j for j in slurm_jobs() if j["id"] not in before]
    # every job of a heavy rule went through sbatch, and finished there; the light ones
    # (the Snakefile's localrules) ran here
    planned = planned_jobs(snakemake(planned_here, "-n"))
    heavy = {"base_model": 1, "run": 2, "base_eval": 1, "replay": 2}
    assert {rule: planned[rule] for rule in heavy} == heavy, planned
    submitted = [j["comment"].removeprefix("rule_").split("_wildcards")[0] for j in jobs]
    assert sorted(submitted) == sorted(r for r, n in heavy.items() for _ in range(n)), jobs
    assert all(j["state"] == "COMPLETED" for j in jobs), jobs

    report = on_slurm(on_cluster, "--report", "results/report.html")
    assert report.returncode == 0, report.stderr[-2000:]
    again = on_slurm(on_cluster, "-n")
    assert "Nothing to be done" in again.stdout + again.stderr

    # the same outputs as with the local executor (the report included); the sync run is
    # deterministic, so its numbers (except wall-clock ones) agree exactly
    def outputs(workdir: Path) -> set[Path]:
        results = workdir / "results"
        return {p.relative_to(results) for p in results.rglob("*") if "logs" not in p.parts}

    assert outputs(on_cluster) == outputs(pipeline)
    for name in FIGURES:
        assert (on_cluster / "results" / "figures" / f"{name}.png").is_file()
    sync_cluster = table(on_cluster / "results" / "tables" / "table1.csv")[("sync", "0")]
    sync_here = table(pipeline / "results" / "tables" / "table1.csv")[("sync", "0")]
    for key in ("heldout_pass_rate/mean", "reward_per_1k_tokens/mean"):
        assert sync_cluster[key] == sync_here[key], key
    run = Path("results/runs/wall/sync/none/k0/pg/seed0/eval.json")
    assert (json.loads((on_cluster / run).read_text())["per_task"]
            == json.loads((pipeline / run).read_text())["per_task"])
    assert yaml.safe_load((SLURM_PROFILE / "config.yaml").read_text())["executor"] == "slurm"
