"""Updates/s of each split of a machine's devices, measured with the plan beside it.

One panel per clock and device count (this machine's clock: one panel for every layout):
each split's measured updates/s per K (mean over seeds, the bar spanning the least to the
most), the plan's prediction as a hollow marker just right of it (the plan's pick larger),
and sync on as many devices as a line, measured (dashed) and planned (dotted).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlcore.analysis.figures.style import clock_title, plt, save
from rlcore.analysis.splits import group_of
from rlcore.record.identity import WALL_CLOCK

K_COLOR = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e")
OFFSET = 0.12  # how far right of a measured point its plan is drawn, in splits


def panel_title(clock: str, devices: int | None) -> str:
    return clock_title(clock) + ("" if devices is None else f", {devices} devices")


def draw_splits(table: Sequence[Mapping[str, Any]], grouped: Sequence[Mapping[str, Any]],
                png: str | Path, svg: str | Path) -> None:
    """The split study's figure (`rlcore/analysis/splits.py` gives its rows)."""
    panels: dict[tuple[str, int | None], list[Mapping[str, Any]]] = {}
    for a in table:
        if a["mode"] == "areal":
            clock, _, n = group_of(a)
            panels.setdefault((clock, n), []).append(a)
    picks = {(g["clock"], g["staleness_k"], g["devices"]): g["pick"] for g in grouped}
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(4.2 * max(1, len(panels)), 3.6),
                             layout="constrained", squeeze=False)
    for ax, ((clock, n), members) in zip(axes[0], panels.items(), strict=False):
        labels = list(dict.fromkeys(a["split"] for a in sorted(
            members, key=lambda a: (a["rollout_workers"], a["trainer_ranks"]))))
        x = {label: i for i, label in enumerate(labels)}
        ks = sorted({a["staleness_k"] for a in members})
        for j, k in enumerate(ks):
            color = K_COLOR[j % len(K_COLOR)]
            at_k = sorted((a for a in members if a["staleness_k"] == k),
                          key=lambda a: x[a["split"]])
            xs = [x[a["split"]] for a in at_k]
            ys = [a["updates_per_s"] for a in at_k]
            err = [[y - a["updates_per_s_min"] for y, a in zip(ys, at_k, strict=True)],
                   [a["updates_per_s_max"] - y for y, a in zip(ys, at_k, strict=True)]]
            ax.errorbar(xs, ys, yerr=err, fmt="o-", color=color, capsize=3, lw=1.2,
                        label=f"K={k} measured")
            planned = [(x[a["split"]] + OFFSET, a["planned_updates_per_s"], a["split"])
                       for a in at_k if a["planned_updates_per_s"] is not None]
            if planned:
                pick = picks.get((clock, k, n))
                ax.scatter([p[0] for p in planned], [p[1] for p in planned],
                           s=[90 if p[2] == pick else 30 for p in planned],
                           facecolors="none", edgecolors=color, linewidths=1.2,
                           label=f"K={k} planned (pick larger)")
        syncs = [a for a in table if a["mode"] == "sync" and a["clock"] == clock
                 and (n is None or a["devices"] == n)]
        for s in syncs:
            ax.axhline(s["updates_per_s"], color="#4d4d4d", ls="--", lw=1,
                       label=f"{s['split']} measured")
            if s["planned_updates_per_s"] is not None:
                ax.axhline(s["planned_updates_per_s"], color="#4d4d4d", ls=":", lw=1,
                           label=f"{s['split']} planned")
        ax.set_xticks(range(len(labels)), labels)
        ax.set_xlabel("rollout workers + trainer ranks")
        ax.set_ylabel("updates / s" + (" (this machine's seconds)" if clock == WALL_CLOCK
                                       else " (virtual seconds)"))
        ax.set_title(panel_title(clock, n), fontsize=9)
        ax.set_ylim(bottom=0)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=6.5, loc="lower right")
    save(fig, png, svg)
