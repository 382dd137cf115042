"""Objectives compared on shared schedules: counterfactual replays against the runs they replay.

A replay (docs/replay.md) trains objective o on the schedule of a run of objective b, with
the same seed. Per seed, the difference in held-out pass rate, replay(o) - run(b), has no
timing noise in it: both saw the same staleness pattern. Its mean and 95 % t interval over
seeds are the *paired* comparison; beside it, the *unpaired* one compares independent runs
of o and b at the same (clock, mode, preset, K), Welch's interval, where the schedule
differs between every pair of runs.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from rlcore.analysis.tables import mean_ci95, row_order, t975
from rlcore.record.identity import WALL_CLOCK

PAIR_KEY = ("clock", "mode", "preset", "staleness_k", "live_objective", "objective")


def welch_ci95(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """(mean(a) - mean(b), half-width of Welch's 95 % t interval); nan with under two each."""
    if len(a) < 2 or len(b) < 2:
        return (statistics.fmean(a) - statistics.fmean(b) if a and b else math.nan), math.nan
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    diff = statistics.fmean(a) - statistics.fmean(b)
    if va + vb == 0:
        return diff, 0.0
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return diff, t975(df) * math.sqrt(va + vb)


def paired_table(live: Iterable[dict[str, Any]], replays: Iterable[dict[str, Any]]
                 ) -> list[dict[str, Any]]:
    """Per (mode, preset, K, live objective, replayed objective): the replays' held-out pass
    rate, the paired difference against the live runs they replay, and the unpaired difference
    between independent live runs of the two objectives (where the grid has them). Rows are
    `tables.run_row`'s: a replay's `objective` is its live run's, `replayed` its own."""
    live = list(live)
    replays = [{**r, "live_objective": r["objective"], "objective": r["replayed"]}
               for r in replays]
    by_point = {(r["clock"], r["mode"], r["preset"], r["staleness_k"], r["objective"],
                 r["seed"]): r["heldout_pass_rate"]
                for r in live if r["heldout_pass_rate"] is not None}
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in replays:
        groups.setdefault(tuple(r[k] for k in PAIR_KEY), []).append(r)
    out = []
    for key, members in sorted(groups.items(), key=lambda item: row_order(item[0])):
        clock, mode, preset, k, base, objective = key
        pairs = [(r["heldout_pass_rate"], by_point[(clock, mode, preset, k, base, r["seed"])])
                 for r in sorted(members, key=lambda r: r["seed"])
                 if (clock, mode, preset, k, base, r["seed"]) in by_point]
        row: dict[str, Any] = dict(zip(PAIR_KEY, key, strict=True))
        row["replay/mean"], row["replay/ci95"] = mean_ci95([r["heldout_pass_rate"]
                                                            for r in members])
        row["pairs"] = len(pairs)
        row["paired_diff/mean"], row["paired_diff/ci95"] = mean_ci95([a - b for a, b in pairs])

        def arm(obj: str, clock: str = clock, mode: str = mode, preset: str = preset,
                k: int = k) -> list[float]:
            return [v for (c, m, p, kk, o, _), v in by_point.items()
                    if (c, m, p, kk, o) == (clock, mode, preset, k, obj)]

        own, other = arm(objective), arm(base)
        # the replayed runs themselves: what the paired differences are taken against
        row["live/mean"], row["live/ci95"] = mean_ci95(other)
        if objective == base:  # the same live runs on both sides: nothing to compare
            row["unpaired_diff/mean"], row["unpaired_diff/ci95"] = math.nan, math.nan
            row["unpaired_runs"] = "same runs"
        else:
            row["unpaired_diff/mean"], row["unpaired_diff/ci95"] = welch_ci95(own, other)
            row["unpaired_runs"] = f"{len(own)}+{len(other)}"
        out.append(row)
    return out


def _cell(mean: float, ci: float, signed: bool = False) -> str:
    if math.isnan(mean):
        return "—"
    sign = "+" if signed else ""
    return f"{mean:{sign}.3f}" + ("" if math.isnan(ci) else f" ± {ci:.3f}")


def unpaired(row: dict[str, Any]) -> str:
    if row["unpaired_runs"] == "same runs":
        return "(the same runs)"
    return _cell(row["unpaired_diff/mean"], row["unpaired_diff/ci95"], True)


def runs_kind(table: Sequence[dict[str, Any]]) -> str:
    """What the replayed runs are, by their clock: live (this machine's), emulated (a
    virtual clock's), or both kinds."""
    kinds = {"live runs" if r["clock"] == WALL_CLOCK else "emulated runs" for r in table}
    return kinds.pop() if len(kinds) == 1 else "runs"


def paired_markdown(table: Sequence[dict[str, Any]]) -> str:
    """The paired table as Markdown: the paired and unpaired half-widths side by side."""
    runs = runs_kind(table)
    head = ("| clock | mode | preset | K | schedule of | objective | replay held-out pass | "
            f"paired diff (same schedules) | unpaired diff (independent {runs}) | "
            f"seeds | {runs} |")
    lines = [head, "|" + "---|" * 11]
    for r in table:
        lines.append(
            f"| {r['clock']} | {r['mode']} | {r['preset']} | {r['staleness_k']} | "
            f"{r['live_objective']} | "
            f"{r['objective']} | {_cell(r['replay/mean'], r['replay/ci95'])} | "
            f"{_cell(r['paired_diff/mean'], r['paired_diff/ci95'], True)} | "
            f"{unpaired(r)} | "
            f"{r['pairs']} | {r['unpaired_runs']} |")
    return "\n".join(lines) + "\n"
