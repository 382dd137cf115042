"""Paired and unpaired comparisons of objectives (rlcore/analysis/paired.py), worked out by hand."""

from __future__ import annotations

import math

import pytest

from rlcore.analysis.paired import paired_markdown, paired_table, welch_ci95


def test_welch_interval_by_hand():
    # a: mean 0.6, variance 0.01; b: mean 0.5, variance 0.03; three values each
    # se^2 = 0.01/3 + 0.03/3 = 0.013333, se = 0.115470
    # df = 0.013333^2 / ((0.01/3)^2/2 + (0.03/3)^2/2) = 3.2 -> 3 (the wider), t = 3.182
    diff, half = welch_ci95([0.5, 0.7, 0.6], [0.4, 0.4, 0.7])
    assert diff == pytest.approx(0.1)
    assert half == pytest.approx(3.182 * math.sqrt(0.04 / 3), rel=1e-9)


def test_welch_needs_two_runs_a_side():
    diff, half = welch_ci95([0.5], [0.4, 0.6])
    assert diff == pytest.approx(0.0) and math.isnan(half)


def live(objective: str, passes: list[float]) -> list[dict]:
    return [{"clock": "wall", "mode": "areal", "preset": "paper", "staleness_k": 2,
             "objective": objective,
             "seed": s, "heldout_pass_rate": p} for s, p in enumerate(passes)]


def replays(objective: str, passes: list[float]) -> list[dict]:
    """Replays of the pg runs under `objective`, as `run_row` names them."""
    return [{"clock": "wall", "mode": "areal", "preset": "paper", "staleness_k": 2,
             "objective": "pg", "replayed": objective, "seed": s, "heldout_pass_rate": p}
            for s, p in enumerate(passes)]


def test_paired_table_by_hand():
    rows = live("pg", [0.5, 0.75, 0.6]) + live("decoupled", [0.7, 0.5, 0.9])
    table = paired_table(rows, replays("decoupled", [0.6, 0.8, 0.7])
                         + replays("pg", [0.5, 0.75, 0.6]))
    by = {r["objective"]: r for r in table}
    # per seed, replay(decoupled) - live(pg) = 0.1, 0.05, 0.1: mean 0.083333, sd 0.028868,
    # half-width t(2) = 4.303 x 0.028868 / sqrt(3) = 0.071717
    d = by["decoupled"]
    assert d["pairs"] == 3
    assert d["paired_diff/mean"] == pytest.approx(0.25 / 3)
    assert d["paired_diff/ci95"] == pytest.approx(4.303 * 0.0288675 / math.sqrt(3), rel=1e-5)
    # unpaired: live decoupled (mean 0.7, var 0.04) against live pg (mean 0.616667, var
    # 0.015833): Welch as above
    diff, half = welch_ci95([0.7, 0.5, 0.9], [0.5, 0.75, 0.6])
    assert d["unpaired_diff/mean"] == pytest.approx(diff) and d["unpaired_diff/ci95"] == half
    assert d["unpaired_runs"] == "3+3"
    assert d["paired_diff/ci95"] < d["unpaired_diff/ci95"]
    # the runs replayed, the differences' baseline: live pg, mean 0.616667, sd 0.125831
    assert d["live/mean"] == pytest.approx(1.85 / 3)
    assert d["live/ci95"] == pytest.approx(4.303 * 0.1258306 / math.sqrt(3), rel=1e-5)
    # the identity: pg replayed on pg's own schedules differs by exactly 0
    assert by["pg"]["paired_diff/mean"] == 0.0 and by["pg"]["paired_diff/ci95"] == 0.0
    # ... and its unpaired cell would compare the live pg runs with themselves: left empty
    assert math.isnan(by["pg"]["unpaired_diff/mean"]) and by["pg"]["unpaired_runs"] == "same runs"
    md = paired_markdown(table)
    assert "| wall | areal | paper | 2 | pg | decoupled | 0.700 ± " in md and "+0.083 ± 0.072" in md
    assert "| (the same runs) |" in md


def test_without_live_runs_of_the_objective_the_unpaired_cell_is_empty():
    table = paired_table(live("pg", [0.5, 0.6]), replays("a3po", [0.55, 0.6]))
    assert math.isnan(table[0]["unpaired_diff/mean"]) and table[0]["unpaired_runs"] == "0+2"
    assert "| — |" in paired_markdown(table)
