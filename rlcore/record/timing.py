"""The timing figures of a run: what its schedule did, as a plan predicts it.

One definition for the planner (`rlcore plan`), for finished runs (their summary.json and
staleness.json) and for the report's comparison of the two, so a predicted figure and a
measured one are the same quantity.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

TIMING_KEYS = ("updates_per_s", "accepted_samples_per_s", "stale_drop_rate",
               "wasted_token_share")


def stale_drop_rate(samples: int, dropped_stale: int, dropped_interrupted: int) -> float:
    """The share of sample attempts lost to staleness: dropped as stale (on arrival or at
    batch formation) or interrupted past their retries."""
    return (dropped_stale + dropped_interrupted) / samples if samples else 0.0


def wasted_token_share(generated: int, trained: int) -> float:
    """The share of generated tokens that no update trained on."""
    return 1.0 - trained / generated if generated else 0.0


def total_variation(a: Mapping[str, int], b: Mapping[str, int]) -> float:
    """Total-variation distance between two histograms (counts by bin), normalised."""
    na, nb = sum(a.values()), sum(b.values())
    if not na or not nb:
        return 0.0 if na == nb else 1.0
    return 0.5 * sum(abs(a.get(k, 0) / na - b.get(k, 0) / nb) for k in {*a, *b})


def run_timing(summary: Mapping[str, Any], staleness: Mapping[str, Any]) -> dict[str, Any]:
    """A finished run's timing figures, from its summary.json and staleness.json."""
    s, wall = summary["samples"], summary["time"]["wall_s"]
    return {
        "wall_s": wall,
        "updates_per_s": summary["updates"] / wall if wall else 0.0,
        "accepted_samples_per_s": summary["metrics"]["accepted_samples_per_s"],
        "stale_drop_rate": stale_drop_rate(s["generated"], s["dropped_stale"],
                                           s["dropped_interrupted"]),
        "wasted_token_share": wasted_token_share(summary["tokens"]["generated"],
                                                 summary["tokens"]["trained"]),
        "staleness": dict(staleness["per_sample"]["accepted"]),
    }
