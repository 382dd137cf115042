"""Aggregation of run directories into tables, against values worked out by hand."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from rlcore.algo.metrics import (
    merge_spans,
    moving_average,
    overlap_seconds,
    steps_to_threshold,
    time_to_threshold,
)
from rlcore.analysis.tables import (
    environment_markdown,
    k_sweep,
    load_runs,
    mean_ci95,
    read_runs,
    run_row,
    table1,
    to_markdown,
    write_runs,
)
from rlcore.record.identity import RunId


class TestMeanCI:
    def test_three_values(self):
        mean, half = mean_ci95([1.0, 2.0, 3.0])
        # sd = 1, se = 1/sqrt(3) = 0.57735, t_{0.975, 2} = 4.303 -> 2.4843
        assert mean == 2.0
        assert half == pytest.approx(2.4843, abs=1e-4)

    def test_one_value_has_no_interval(self):
        assert mean_ci95([0.4]) == (0.4, 0.0)

    def test_empty_is_nan(self):
        assert all(math.isnan(x) for x in mean_ci95([]))


class TestMetrics:
    def test_moving_average(self):
        assert moving_average([1, 0, 1, 1], window=2) == [1.0, 0.5, 0.5, 1.0]
        # a window of zeros is 0 exactly, whatever left it: 2/7 + 3/7 rounds, and a running
        # sum that subtracted them again ended at -2.8e-17
        assert moving_average([2 / 7, 3 / 7, 0.0, 0.0], window=2)[-1] == 0.0

    def test_steps_to_threshold(self):
        # trailing means with window 2: 0.0, 0.25, 0.5, 0.75 -> first >= 0.5 at update 3
        assert steps_to_threshold([0.0, 0.5, 0.5, 1.0], 0.5, 2) == 3
        assert steps_to_threshold([0.1, 0.2], 0.5, 1) is None

    def test_time_to_threshold(self):
        # trailing means with window 2: 0.0, 0.25, 0.5, 0.75 -> first >= 0.5 at t=3.0
        assert time_to_threshold([1.0, 2.0, 3.0, 4.0], [0.0, 0.5, 0.5, 1.0], 0.5, 2) == 3.0
        assert time_to_threshold([1.0], [0.1], 0.5, 1) is None

    def test_overlap_of_spans(self):
        rollout = [(0.0, 2.0), (3.0, 5.0)]
        trainer = [(1.0, 4.0)]
        # overlaps: [1, 2] and [3, 4] -> 2 seconds
        assert overlap_seconds(rollout, trainer) == pytest.approx(2.0)

    def test_merge_spans(self):
        assert merge_spans([(2, 3), (0, 1), (0.5, 1.5)]) == [(0, 1.5), (2, 3)]


def fake_run(root: Path, mode: str, k: int, objective: str, seed: int, *,
             heldout: float | None, ttt: float | None, stale: int = 0,
             interrupted: int = 0, preset: str = "paper", clock: str = "wall") -> None:
    """A run directory as the pipeline lays it out; `clock` is `wall` or a profile's name."""
    name = RunId(clock, mode, preset, k, objective, seed)
    d = root / name.path()
    d.mkdir(parents=True)
    virtual = clock != "wall"
    summary: dict[str, Any] = {
        "run": name.to_dict(),
        "clock": {"kind": "virtual" if virtual else "wall",
                  "hardware": clock if virtual else None},
        "mode": mode, "staleness_k": k, "objective": objective, "seed": seed, "updates": 10,
        "tokens": {"generated": 100, "stale_dropped": stale, "interrupted": interrupted},
        "time": {"wall_s": 2.0, "cold_start_s": 1.5, "startup_s": 3.0 + seed, "job_s": 9.0,
                 "overlap_frac": 0.5, "started_unix": 1000.0 + seed},
        "samples": {"dropped_stale": stale // 5, "dropped_interrupted": interrupted // 5,
                    "resubmissions": interrupted},
        "load": {"contended": seed == 1},
        "metrics": {"train_pass_rate_final": 0.5, "time_to_threshold_s": ttt, "threshold": 0.5,
                    "steps_to_threshold": None if ttt is None else int(ttt * 10),
                    "reward_per_1k_tokens": 100.0 + seed, "acceptance_rate": 0.9,
                    "accepted_samples_per_s": 50.0},
        "reproducibility": {"state_digest": f"sha256:{seed}{'a' * 63}", "environment": {
            "kernels": "portable", "cpu_capability": "AVX2", "mkl_cbwr": "AVX2,STRICT",
            "threads_per_role": 1, "cpu": "AuthenticAMD 26/2/1 AMD EPYC"}},
    }
    (d / "summary.json").write_text(json.dumps(summary))
    if heldout is not None:
        (d / "eval.json").write_text(json.dumps({"sampled_pass_rate": heldout,
                                                 "greedy_pass_rate": heldout}))


@pytest.fixture
def runs(tmp_path: Path) -> list[dict[str, Any]]:
    for seed, (h, ttt) in enumerate([(0.4, 1.0), (0.5, None), (0.6, 3.0)]):
        fake_run(tmp_path, "areal", 2, "pg", seed, heldout=h, ttt=ttt, stale=10,
                 interrupted=5)
    fake_run(tmp_path, "sync", 0, "pg", 0, heldout=None, ttt=2.0, preset="none")
    (tmp_path / "wall" / "sync" / "none" / "k0" / "pg" / "seed9").mkdir(parents=True)  # unfinished
    return load_runs(tmp_path)


def test_a_run_is_named_by_its_summary_not_by_its_path(tmp_path: Path):
    fake_run(tmp_path, "areal", 2, "pg", 0, heldout=0.5, ttt=1.0, preset="paper")
    # the same record under another grid point's directory keeps its own name
    (tmp_path / "wall/areal/paper/k2/pg/seed0").rename(tmp_path / "wall/areal/paper/k2/pg/seed7")
    (row,) = load_runs(tmp_path)
    assert (row["clock"], row["mode"], row["preset"], row["staleness_k"], row["seed"]) == \
        ("wall", "areal", "paper", 2, 0)
    # a wall-clock run's block is its seed, and its start is what says it ran in that block
    assert (row["block"], row["started_unix"]) == (0, 1000.0)


def test_a_virtual_run_has_no_block_and_an_older_summary_no_start(tmp_path: Path):
    fake_run(tmp_path, "areal", 2, "pg", 1, heldout=0.5, ttt=1.0, clock="v100")
    summary = tmp_path / "v100/areal/paper/k2/pg/seed1/summary.json"
    data = json.loads(summary.read_text())
    del data["time"]["started_unix"]
    summary.write_text(json.dumps(data))
    (row,) = load_runs(tmp_path)
    assert (row["block"], row["started_unix"]) == (None, None)


def test_the_runs_table_keeps_every_value_and_its_type(tmp_path: Path,
                                                       runs: list[dict[str, Any]]):
    write_runs(tmp_path / "runs.parquet", [Path(r["run_dir"]) for r in reversed(runs)])
    back = read_runs(tmp_path / "runs.parquet")
    assert back == runs  # in table order, None (no threshold, no eval) and bools kept
    assert read_runs(tmp_path / "runs.parquet", replays=True) == []


def test_a_run_gains_over_the_base_only_on_the_same_scored_tasks(tmp_path: Path):
    fake_run(tmp_path, "sync", 0, "pg", 0, heldout=None, ttt=1.0, preset="none")
    run_dir = tmp_path / "wall/sync/none/k0/pg/seed0"
    tasks = [{"task_id": t} for t in ("1+2", "3+4")]
    (run_dir / "eval.json").write_text(json.dumps(
        {"sampled_pass_rate": 0.5, "greedy_pass_rate": 1.0, "samples_per_task": 2,
         "per_task": tasks}))
    base = {"sampled_pass_rate": 0.125, "greedy_pass_rate": 0.5, "samples_per_task": 2,
            "per_task": tasks}
    base_file = tmp_path / "eval_base.json"
    base_file.write_text(json.dumps(base))
    write_runs(tmp_path / "runs.parquet", [run_dir], base_file)
    (row,) = read_runs(tmp_path / "runs.parquet")
    assert (row["heldout_gain"], row["heldout_greedy_gain"]) == (0.375, 0.5)
    # other tasks, or as many tasks sampled a different number of times: no gain to state
    for other in ({**base, "per_task": tasks[::-1]}, {**base, "samples_per_task": 4}):
        assert run_row(run_dir, other)["heldout_gain"] is None
    assert run_row(run_dir)["heldout_greedy_gain"] is None


def test_load_runs(runs: list[dict[str, Any]]):
    # sync first, as in every table and figure
    assert [(r["mode"], r["preset"], r["seed"]) for r in runs] == [
        ("sync", "none", 0), ("areal", "paper", 0), ("areal", "paper", 1), ("areal", "paper", 2)]
    assert runs[1]["tokens_wasted"] == 15 and runs[1]["wasted_frac"] == 0.15
    assert runs[1]["updates_per_s"] == 5.0


def test_the_environment_table_has_each_runs_kernels_cpu_and_digest(runs: list[dict[str, Any]]):
    lines = environment_markdown(runs).splitlines()
    assert len(lines) == 2 + len(runs)  # head, rule, one line per run
    # after sync and areal seed 0, seed 1: grid point, seed, kernels, threads, CPU, digest
    assert lines[4] == ("| wall | areal | paper | 2 | pg | 1 | portable | AVX2 | AVX2,STRICT | 1 | "
                        "AuthenticAMD 26/2/1 AMD EPYC | `1aaaaaaaaaaa` |")


def test_table1_means_over_seeds(runs: list[dict[str, Any]]):
    sync, areal = table1(runs)
    assert (areal["mode"], areal["seeds"]) == ("areal", 3)
    # held-out pass 0.4, 0.5, 0.6: mean 0.5, sd 0.1 -> half-width 4.303 * 0.1 / sqrt(3)
    assert areal["heldout_pass_rate/mean"] == pytest.approx(0.5)
    assert areal["heldout_pass_rate/ci95"] == pytest.approx(0.24843, abs=1e-5)
    # time to threshold reached by 2 of 3 seeds: mean of 1 and 3
    assert areal["time_to_threshold_s/mean"] == 2.0 and areal["time_to_threshold_s/n"] == 2
    assert areal["steps_to_threshold/mean"] == 20.0 and areal["steps_to_threshold/n"] == 2
    assert areal["cold_start_s/mean"] == 1.5 and areal["updates_per_s/mean"] == 5.0
    assert areal["startup_s/mean"] == 4.0  # 3, 4 and 5 s
    assert sync["heldout_pass_rate/n"] == 0  # not evaluated yet


def test_markdown_marks_partial_and_missing(runs: list[dict[str, Any]]):
    text = to_markdown(table1(runs), ["heldout_pass_rate", "time_to_threshold_s"])
    lines = text.splitlines()
    assert lines[0].startswith(
        "| clock | mode | preset | staleness_k | objective | seeds | held-out pass")
    assert "0.500 ± 0.248" in lines[3]
    assert lines[0].endswith("| timed under contention |")
    assert lines[2].endswith("| no |") and lines[3].endswith("| 1 of 3 |")  # sync, areal
    # two values: t_{0.975,1} * sd / sqrt 2, sd = sqrt 2; seconds get two decimals
    assert "2.00 ± 12.71 (n=2)" in lines[3]
    assert "—" in lines[2]


def test_k_sweep_has_waste(runs: list[dict[str, Any]]):
    areal = k_sweep(runs)[1]
    assert (areal["mode"], areal["preset"]) == ("areal", "paper")
    assert areal["tokens_wasted/mean"] == 15.0 and areal["wasted_frac/mean"] == 0.15
    assert areal["dropped_stale/mean"] == 2.0 and areal["resubmissions/mean"] == 5.0
    assert areal["dropped_interrupted/mean"] == 1.0


def test_table1_cells_recomputed_by_hand_from_a_run_with_drops(tiny_model_dir: Path,
                                                              tmp_path: Path):
    """Both pass rates and the reward per 1k tokens, from the rows of a run that dropped
    samples, equal Table 1's cells."""
    from rlcore.config import config_from_dict
    from rlcore.evaluation import evaluate_run
    from rlcore.runners import run_mode
    from tests.conftest import small_config

    # Timing decides what is dropped: K = 0 under the paper's preset drops most samples, and
    # a run that happens to drop none is run again with the next seed (rarely needed).
    for seed in range(4):
        cfg = config_from_dict(small_config(
            tiny_model_dir, mode="async", seed=seed,
            train={"updates": 6, "update_batch_size": 8},
            rollout={"max_new_tokens": 5, "chunk_tokens": 1, "group_size": 4},
            staleness={"staleness_k": 0, "interrupt": "resubmit",
                       "staleness_control": "filter", "max_retries": 1},
            eval={"window": 3}))
        run_dir = tmp_path / "wall" / "async" / "paper" / "k0" / "pg" / f"seed{seed}"
        summary = run_mode(cfg, run_dir)
        samples = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
        dropped = [s for s in samples if s["status"] != "accepted"]
        if dropped:
            break
        shutil.rmtree(run_dir)
    assert dropped, "no sample was dropped: the test did not exercise Listing 1's rule"
    evaluate_run(run_dir)
    updates = [json.loads(x) for x in (run_dir / "updates.jsonl").read_text().splitlines()]
    per_task = json.loads((run_dir / "eval.json").read_text())["per_task"]

    trained = {i for u in updates for i in u["sample_ids"]}
    by_hand_reward = sum(s["reward"] for s in samples if s["sample_id"] in trained)
    by_hand = {
        "reward_per_1k_tokens": 1000 * by_hand_reward / summary["tokens"]["generated"],
        # the batch pass rate of each of the last 3 updates, from its samples' rows
        "train_pass_rate_final": sum(
            sum(s["pass"] for s in samples if s["sample_id"] in u["sample_ids"])
            / len(u["sample_ids"])
            for u in updates[-3:]) / 3,
        "heldout_pass_rate": sum(t["sampled_passes"] for t in per_task) / (len(per_task) * 2),
    }
    (row,) = table1(load_runs(tmp_path))
    for metric, value in by_hand.items():
        assert row[f"{metric}/mean"] == pytest.approx(value, rel=1e-12), metric


def test_quality_vs_k_puts_objectives_in_rows_and_k_in_columns(runs: list[dict[str, Any]]):
    from rlcore.analysis.tables import quality_vs_k, quality_vs_k_markdown

    (pg,) = quality_vs_k(runs, "areal", "paper")
    # areal K=2 held-out 0.4, 0.5, 0.6 -> 0.5 ± 4.303 * 0.1 / sqrt(3); sync not evaluated
    assert pg["objective"] == "pg" and pg["K=2/mean"] == pytest.approx(0.5)
    assert pg["K=2/ci95"] == pytest.approx(0.24843, abs=1e-5) and pg["sync/n"] == 0
    lines = quality_vs_k_markdown([pg]).splitlines()
    assert lines[0] == "| objective | sync (K=0 reference) | K=2 |"
    assert lines[2] == "| pg | — | 0.500 ± 0.248 |"
    assert quality_vs_k(runs, "areal", "areal_defaults") == []  # no run under that preset


def test_quality_vs_k_takes_one_preset_and_shares_the_sync_reference(tmp_path: Path):
    """Only the named preset's runs fill the cells; a sync run of pg is the reference of an
    objective sync did not run (on-policy, the objectives give the same gradient)."""
    from rlcore.analysis.tables import quality_vs_k, quality_vs_k_markdown

    fake_run(tmp_path, "areal", 0, "a3po", 0, heldout=0.3, ttt=None, preset="paper")
    fake_run(tmp_path, "areal", 0, "a3po", 0, heldout=0.9, ttt=None, preset="areal_defaults")
    fake_run(tmp_path, "sync", 0, "pg", 0, heldout=0.7, ttt=None, preset="none")
    (a3po,) = quality_vs_k(load_runs(tmp_path), "areal", "paper")
    assert a3po["K=0/mean"] == 0.3 and a3po["sync/mean"] == 0.7
    assert a3po["sync_objectives"] == "pg"
    text = quality_vs_k_markdown([a3po])
    assert "| a3po | 0.700 ± 0.000 | 0.300 ± 0.000 |" in text
    assert "Sync ran pg only" in text


V100 = "v100x2-qwen0.5b-fp16"


def test_runs_of_different_clocks_aggregate_apart(tmp_path: Path):
    """The same mode, preset, K, objective and seeds, live and on a virtual clock: each table
    has a row per clock, each the mean of its own clock's runs, wall first. A virtual run has
    no start-up on its profile's hardware, and the machine's load does not touch its times."""
    for seed, (heldout, ttt) in enumerate([(0.4, 1.0), (0.6, 3.0)]):
        fake_run(tmp_path, "areal", 2, "pg", seed, heldout=heldout, ttt=ttt)
        fake_run(tmp_path, "areal", 2, "pg", seed, heldout=heldout + 0.2, ttt=100 * ttt,
                 clock=V100)
    rows = load_runs(tmp_path)
    assert [(r["clock"], r["seed"]) for r in rows] == [("wall", 0), ("wall", 1), (V100, 0),
                                                       (V100, 1)]
    assert rows[0]["startup_s"] == 3.0 and rows[2]["startup_s"] is None
    wall, virtual = table1(rows)
    assert (wall["clock"], wall["seeds"], virtual["clock"], virtual["seeds"]) == (
        "wall", 2, V100, 2)
    assert wall["time_to_threshold_s/mean"] == 2.0
    assert virtual["time_to_threshold_s/mean"] == 200.0
    assert wall["heldout_pass_rate/mean"] == pytest.approx(0.5)
    assert virtual["heldout_pass_rate/mean"] == pytest.approx(0.7)
    assert wall["startup_s/mean"] == 3.5 and virtual["startup_s/n"] == 0
    assert [r["clock"] for r in k_sweep(rows)] == ["wall", V100]
    lines = to_markdown(table1(rows), ["time_to_threshold_s"]).splitlines()
    assert lines[2] == "| wall | areal | paper | 2 | pg | 2 | 2.00 ± 12.71 | 1 of 2 |"
    assert lines[3] == f"| {V100} | areal | paper | 2 | pg | 2 | 200.00 ± 1270.60 | n/a (virtual) |"

    from rlcore.analysis.tables import quality_vs_k, quality_vs_k_markdown

    (live,) = quality_vs_k(rows, "areal", "paper")
    (emulated,) = quality_vs_k(rows, "areal", "paper", V100)
    assert live["K=2/mean"] == pytest.approx(0.5) and live["K=2/n"] == 2
    assert emulated["K=2/mean"] == pytest.approx(0.7) and emulated["K=2/n"] == 2
    assert V100 in quality_vs_k_markdown([emulated]) and V100 not in quality_vs_k_markdown([live])


def test_a_csv_of_rows_with_different_columns_keeps_every_column(tmp_path):
    """quality_vs_k rows differ when an objective ran at fewer K (the default grid runs pg
    at K = 1 and 8 only): the CSV has every column, blank where a row has none."""
    import csv

    from rlcore.analysis.tables import write_csv

    write_csv(tmp_path / "t.csv", [{"objective": "a3po", "K=2/mean": 0.6},
                                  {"objective": "pg", "K=1/mean": 0.7, "K=2/mean": 0.5}])
    with open(tmp_path / "t.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["objective", "K=2/mean", "K=1/mean"]
    assert rows[0]["K=1/mean"] == "" and rows[1]["K=1/mean"] == "0.7"
