"""The claims table as a forest plot: one row per comparison, its effect and 95 % interval
in units of the metric's smallest effect that matters, so that rows of different metrics
share one axis; ±1 is the band of no effect that matters, coloured by verdict."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.ticker import FuncFormatter

from rlcore.analysis.claims import ABSENT, CONTRADICTED, EQUIVALENT, SUPPORTED, UNRESOLVED
from rlcore.analysis.figures.style import plt, save
from rlcore.record.identity import WALL_CLOCK

VERDICT_COLOR = {SUPPORTED: "#1b9e77", CONTRADICTED: "#d95f02", EQUIVALENT: "#7570b3",
                 UNRESOLVED: "#9a9a9a", ABSENT: "#d9d9d9"}
VERDICT_LABEL = {SUPPORTED: "supported", CONTRADICTED: "contradicted",
                 EQUIVALENT: "equivalent (no effect that matters)",
                 UNRESOLVED: "unresolved at this power",
                 ABSENT: "not tested: its cause is absent"}


def in_deltas(row: Mapping[str, Any]) -> tuple[float, float, float]:
    """(effect, 95 % low, 95 % high) over the row's delta; nan where either is unknown."""
    delta = row["delta"]
    if not delta or math.isnan(delta):
        return math.nan, math.nan, math.nan
    return row["effect"] / delta, row["ci95_lo"] / delta, row["ci95_hi"] / delta


def row_label(row: Mapping[str, Any], width: int = 0) -> str:
    """'C1 live, by block: stricter freshness reduces accepted throughput' (the clock named,
    the pairing when by block, and arms that end in the same weights), wrapped to `width`
    characters a line when given."""
    clock = "live" if row["clock"] == WALL_CLOCK else f"on {row['clock']}"
    if row.get("block_by_block") is not None:  # paired by block: say so, its width differs
        clock += ", by block"
    label = f"{row['claim']} {clock}: {row['statement']}"
    if row.get("same_weights"):  # the arms' runs differ only in time
        label += " (arms end in the same weights)"
    return textwrap.fill(label, width) if width else label


def draw_claims_forest(table: Sequence[Mapping[str, Any]], png: str | Path,
                       svg: str | Path) -> None:
    """The forest plot of the claims table: the first rows on top, a symmetric-log x axis
    (linear inside ±1 delta), the side each claim predicts marked at the right."""
    n = len(table)
    fig, ax = plt.subplots(figsize=(7.5, 0.5 * n + 1.0))
    ax.axvspan(-1, 1, color="#ececec", zorder=0)
    ax.axvline(0, color="black", lw=0.8, zorder=1)
    reach = 1.0
    for i, row in enumerate(table):
        y = n - 1 - i
        mean, lo, hi = in_deltas(row)
        color = VERDICT_COLOR.get(row["verdict"], "#9a9a9a")
        if math.isnan(mean):
            ax.annotate("no delta or no runs", (0, y), ha="center", va="center", fontsize=7,
                        color="#666666")
            continue
        if not math.isnan(lo):
            ax.plot([lo, hi], [y, y], color=color, lw=2.2, solid_capstyle="butt", zorder=2)
            reach = max(reach, abs(lo), abs(hi))
        ax.plot(mean, y, "o", color=color, ms=6, zorder=3)
        reach = max(reach, abs(mean))
        side = "→ claim > 0" if row["expect"] == "positive" else "← claim < 0"
        if row.get("basis") == "equivalence" and row["verdict"] == SUPPORTED:
            side += " (or none)"
        ax.annotate(side, (1.0, y), xycoords=("axes fraction", "data"), xytext=(6, 0),
                    textcoords="offset points", va="center", fontsize=7)
    ax.set_xscale("symlog", linthresh=1)
    ax.set_xlim(-reach * 1.5, reach * 1.5)
    ax.set_ylim(-0.7, n - 0.3)
    ax.set_yticks(range(n), [row_label(r, 58) for r in reversed(table)], fontsize=7)
    ax.set_xlabel("effect and 95 % interval in deltas, the metric's smallest effect that "
                  "matters\n(linear inside ±1, logarithmic beyond)", fontsize=8)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    ax.tick_params(axis="x", labelsize=7)
    handles: list[Any] = [plt.Line2D([], [], color=c, marker="o", lw=2.2,
                                     label=VERDICT_LABEL[v])
                          for v, c in VERDICT_COLOR.items()]
    handles.append(plt.Rectangle((0, 0), 1, 1, color="#ececec",
                                 label="±delta: no effect that matters"))
    ax.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3,
              fontsize=7, frameon=False)
    ax.grid(axis="x", color="#dddddd", lw=0.5, zorder=0)
    save(fig, png, svg)
