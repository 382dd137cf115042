"""The same numbers on any machine: portable CPU runs reproduce tests/golden/digests.json bit
for bit (tests/golden.py says what is digested), and two runs of one config on one host
record the same. A failure on a new host is a finding, not a digest to update:
docs/reproducibility.md says how to find the cause."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlcore.config import config_from_dict
from rlcore.kernels import cpu_name, in_force
from rlcore.record.rundir import read_jsonl
from rlcore.runners.sync import sync_train
from tests import virtual_grid
from tests.conftest import small_config
from tests.golden import (
    GOLDEN,
    installed_versions,
    locked_versions,
    run_digests,
    take,
)

ROOT = Path(__file__).resolve().parent.parent


def stored() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text())


def test_the_golden_digests_are_for_the_locked_versions():
    assert stored()["versions"] == locked_versions(), (
        "requirements.lock changed the numeric packages: retake tests/golden/ with "
        "`python -m tests.golden` in a commit of its own")


@pytest.mark.slow
def test_portable_runs_reproduce_the_golden_digests(tiny_model_dir: Path, tmp_path: Path):
    golden = stored()
    if installed_versions() != golden["versions"]:
        pytest.skip(f"installed {installed_versions()} are not requirements.lock's "
                    f"{golden['versions']}, which `make setup` installs and the digests hold for")
    taken = take(tmp_path, small_model=tiny_model_dir)
    # the AReaL-style run drops samples as stale, so the drop path is in the digests
    assert taken["statuses"]["areal-paper-k1-virtual"].get("dropped_stale", 0) > 0
    differ = [k for k, v in golden["digests"].items() if taken["digests"].get(k) != v]
    assert not differ, (
        f"{len(differ)} of {len(golden['digests'])} golden digests differ, the first "
        f"{differ[0]}, on {cpu_name()} with {in_force()}; they were taken on "
        f"{golden['taken_on']}. docs/reproducibility.md: find the kernel or thread count "
        "that is not pinned rather than retaking them")


def untimed(path: Path) -> list[dict[str, Any]]:
    """A record file's rows without what the clock decides."""
    return [{k: v for k, v in row.items() if not k.startswith(("t_", "time/"))}
            for row in read_jsonl(path)]


def test_two_seeded_sync_runs_record_the_same(tiny_model_dir: Path, tmp_path: Path):
    runs = []
    for name in ("a", "b"):
        sync_train(config_from_dict(small_config(tiny_model_dir, train={"updates": 6})),
                   tmp_path / name)
        runs.append(tmp_path / name)
    for name in ("samples.jsonl", "updates.jsonl"):
        rows = untimed(runs[0] / name)
        assert rows and rows == untimed(runs[1] / name), name
    assert run_digests(runs[0]) == run_digests(runs[1])


def test_the_virtual_grid_list_takes_virtual_runs_and_their_replays_only(tmp_path: Path):
    """tests/virtual_grid.py: a virtual run's records digested whole, a replay's without its
    timing; wall-clock runs and their replays left out (they differ in every make run)."""
    results = tmp_path / "results"

    def write(rel: str, kind: str, of: str | None = None, t: float = 0.0) -> None:
        d = results / rel
        (d / "policy").mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps(
            {"clock": {"kind": kind}, "reproducibility": {"replay": of and {"of": of}}}))
        for name in ("samples.jsonl", "updates.jsonl"):
            (d / name).write_text(json.dumps({"reward": 1.0, "t_emit": t}) + "\n")
        (d / "policy" / "model.safetensors").write_bytes(b"weights")
        (d / "eval.json").write_text(json.dumps({"sampled_pass_rate": 0.5, "eval_s": t}))

    write("runs/v100/areal/paper/k1/pg/seed0", "virtual")
    write("runs/wall/areal/paper/k1/pg/seed0", "wall")
    write("replays/v100/areal/paper/k1/pg/seed0/decoupled", "wall",
          of="results/runs/v100/areal/paper/k1/pg/seed0", t=1.0)
    write("replays/wall/areal/paper/k1/pg/seed0/decoupled", "wall",
          of="results/runs/wall/areal/paper/k1/pg/seed0")
    first = virtual_grid.digests(results)
    assert sorted(first) == ["replays/v100/areal/paper/k1/pg/seed0/decoupled",
                             "runs/v100/areal/paper/k1/pg/seed0"]
    # the replay's clock is this machine's: another time is the same result ...
    (results / "replays/v100/areal/paper/k1/pg/seed0/decoupled/samples.jsonl").write_text(
        json.dumps({"reward": 1.0, "t_emit": 2.5}) + "\n")
    assert virtual_grid.digests(results) == first
    # ... while a virtual run's times are part of its result
    (results / "runs/v100/areal/paper/k1/pg/seed0/samples.jsonl").write_text(
        json.dumps({"reward": 1.0, "t_emit": 2.5}) + "\n")
    assert virtual_grid.digests(results)["runs/v100/areal/paper/k1/pg/seed0"][
        "samples.jsonl"] != first["runs/v100/areal/paper/k1/pg/seed0"]["samples.jsonl"]
