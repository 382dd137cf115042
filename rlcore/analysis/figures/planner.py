"""The capacity planner's K sweep beside the measured one.

The plan (`rlcore plan --sweep staleness.staleness_k=...`, a JSON list with one entry per
K) predicts the timing figures of `rlcore/record/timing.py`; the measured ones are read from
the runs of the same arm with the same function, so each panel sets one quantity beside
itself: updates/s, the drop rate (stale or interrupted past the retries: both causes) and
the wasted-token share against K.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from rlcore.analysis.figures.style import arm_title, clock_title, plt, save
from rlcore.analysis.tables import mean_ci95
from rlcore.record.identity import WALL_CLOCK
from rlcore.record.timing import run_timing

PANELS = (("updates_per_s", "updates / s"), ("stale_drop_rate", "dropped: stale or interrupted"),
          ("wasted_token_share", "wasted-token share"))
KEY = "staleness.staleness_k"


def measured_by_k(run_dirs: Iterable[Path]) -> dict[int, list[dict[str, Any]]]:
    """Each run's timing figures, by its K (sorted)."""
    out: dict[int, list[dict[str, Any]]] = {}
    for d in run_dirs:
        summary = json.loads((d / "summary.json").read_text())
        staleness = json.loads((d / "staleness.json").read_text())
        out.setdefault(summary["staleness_k"], []).append(run_timing(summary, staleness))
    return dict(sorted(out.items()))


def draw_plan_vs_measured(plans: Sequence[dict[str, Any]], run_dirs: Iterable[Path],
                          png: str | Path, svg: str | Path, *, mode: str, preset: str,
                          clock: str) -> None:
    """Planned (line) and measured (mean over seeds with 95% intervals) timing figures
    against K."""
    measured = measured_by_k(run_dirs)
    planned = sorted((int(p[KEY]), p) for p in plans)
    fig, axes = plt.subplots(1, len(PANELS), figsize=(11.5, 3.4), layout="constrained")
    seeds = sorted({len(v) for v in measured.values()})
    seeds_text = f"{seeds[0]}" if len(seeds) == 1 else f"{seeds[0]} to {seeds[-1]}"
    for ax, (metric, label) in zip(axes, PANELS, strict=True):
        ks = list(measured)
        stats = [mean_ci95([f[metric] for f in measured[k]]) for k in ks]
        ax.errorbar(ks, [m for m, _ in stats], yerr=[c for _, c in stats], fmt="o",
                    color="#d95f02", capsize=3,
                    label=f"measured: mean, 95 % interval over {seeds_text} seeds")
        ax.plot([k for k, _ in planned], [p[metric] for _, p in planned], "-s",
                color="#4d4d4d", markersize=4, label="planned (rlcore plan)")
        ax.set_xlabel("staleness bound K")
        ax.set_ylabel(label)
        ax.set_xticks(sorted({*ks, *(k for k, _ in planned)}))
        ax.set_ylim(0, ax.get_ylim()[1] * 1.08)  # room above the highest marker
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    hardware = planned[0][1]["hardware"] if planned else "?"
    fig.suptitle(f"{arm_title(mode, preset, WALL_CLOCK)}: planned on {hardware} against "
                 f"measured on {clock_title(clock)}", fontsize=10)
    save(fig, png, svg)
