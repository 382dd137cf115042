"""The staleness figures of the grid: held-out quality against throughput and against K, and
the staleness histograms (the length-bias figure is in `rlcore/analysis/figures/length_bias.py`).

The data comes from pure functions; the `draw_*` functions lay it out with the styles of
`rlcore/analysis/figures/learning.py` (colours per mode and preset, labels, PNG and SVG output).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from rlcore.algo import registry as objectives
from rlcore.analysis.figures.style import (
    LABEL_OFFSET,
    MODE_LABEL,
    MODE_MARKER,
    Row,
    arm_colors,
    arm_title,
    by_clock,
    config_label,
    group_rows,
    objective_axes,
    objectives_of,
    panel_legend,
    plt,
    save,
    seconds_of,
    sync_presets_differ,
)
from rlcore.analysis.tables import mean_ci95, quality_vs_k
from rlcore.record.identity import WALL_CLOCK


def staleness_counts(run_dirs: Iterable[Path]) -> dict[str, dict[int, int]]:
    """Per-sample staleness histograms of accepted and stale-dropped samples, summed."""
    out: dict[str, dict[int, int]] = {"accepted": {}, "dropped_stale": {}}
    for d in run_dirs:
        per_sample = json.loads((d / "staleness.json").read_text())["per_sample"]
        for kind, counts in out.items():
            for s, n in per_sample.get(kind, {}).items():
                counts[int(s)] = counts.get(int(s), 0) + n
    return out


def draw_quality_throughput(rows: Sequence[Row], png: str | Path,
                            svg: str | Path) -> None:
    """Held-out pass rate against accepted samples/s for every K: the staleness trade-off; a
    row of panels per clock, each with its own throughput axis."""
    every = group_rows(rows)
    objectives, colors = objectives_of(every), arm_colors(every)
    named = sync_presets_differ(every)
    clocks = by_clock(rows)
    fig, axes = objective_axes(list(clocks), objectives, height=4.0, sharex="row")
    panels = [(clock, objective, ax, group_rows(clock_rows))  # in K order per (mode, preset)
              for (clock, clock_rows), row in zip(clocks.items(), axes, strict=True)
              for objective, ax in zip(objectives, row, strict=True)]
    for clock, objective, ax, groups in panels:
        for arm, color in colors.items():
            mode, preset = arm
            points = []
            for (m, p, k, o), members in groups.items():
                if (m, p) != arm or o != objective:
                    continue
                x, xe = mean_ci95([r["accepted_samples_per_s"] for r in members])
                quality = [r["heldout_pass_rate"] for r in members
                           if r["heldout_pass_rate"] is not None]
                if not quality:
                    continue
                y, ye = mean_ci95(quality)
                points.append((x, y))
                ax.errorbar(x, y, xerr=xe, yerr=ye, color=color, marker=MODE_MARKER[mode],
                            capsize=2, markersize=5,
                            label=config_label(mode, preset, k, named).rsplit(" K=", 1)[0]
                            if len(points) == 1 else None)
                if mode != "sync":  # sync is K = 0 alone; its label would only crowd
                    ax.annotate(f"K={k}", (x, y), xytext=LABEL_OFFSET[mode],
                                textcoords="offset points", fontsize=7, color=color,
                                ha="left")
            if len(points) > 1:
                ax.plot(*zip(*points, strict=True), color=color, linewidth=0.8, alpha=0.6)
        ax.set_xlabel(f"accepted samples per second ({seconds_of(clock)})")
    for row in axes:
        row[0].set_ylabel("held-out sampled pass rate")
    fig.legend(*panel_legend(axes.flat), loc="outside right center", fontsize=8,
               title="mean ± 95% CI\nover seeds", title_fontsize=7)
    save(fig, png, svg)


def draw_staleness(rows: Sequence[Row], png: str | Path, svg: str | Path) -> None:
    """Staleness of accepted and stale-dropped samples, one panel per asynchronous
    (mode, preset, K) and clock."""
    by_config: dict[tuple[str, str, int, str], list[Path]] = {}
    colors = arm_colors(group_rows(rows))
    for clock, clock_rows in by_clock(rows).items():
        for (mode, preset, k, _), members in group_rows(clock_rows).items():
            if mode != "sync":
                by_config.setdefault((mode, preset, k, clock), []).extend(
                    Path(r["run_dir"]) for r in members)
    if not by_config:  # a sync-only grid: one panel of its samples, all of staleness 0
        by_config = {("sync", rows[0]["preset"], 0, rows[0]["clock"]):
                     [Path(r["run_dir"]) for r in rows]}
    configs = list(by_config)
    cols = min(4, len(configs))
    n_rows = -(-len(configs) // cols)
    fig, axes = plt.subplots(n_rows, cols, figsize=(3.4 * cols, 2.8 * n_rows), squeeze=False,
                             layout="constrained")
    for ax in axes.flat[len(configs):]:
        ax.set_visible(False)
    for ax, (mode, preset, k, clock) in zip(axes.flat, configs, strict=False):
        counts = staleness_counts(by_config[(mode, preset, k, clock)])
        total = sum(counts["accepted"].values()) + sum(counts["dropped_stale"].values())
        xs = list(range(max([k + 1, *counts["accepted"], *counts["dropped_stale"]]) + 1))
        for kind, offset, color, label in (
            ("accepted", -0.2, colors.get((mode, preset), "#777777"), "accepted"),
            ("dropped_stale", 0.2, "#b2182b", "dropped (stale)"),
        ):
            ax.bar([x + offset for x in xs],
                   [counts[kind].get(x, 0) / max(total, 1) for x in xs], 0.4, color=color,
                   label=label)
        ax.axvline(k + 0.5, color="grey", linewidth=0.8, linestyle="--")
        ax.set_xticks(xs)
        dropped = sum(counts["dropped_stale"].values()) / max(total, 1)
        on = "" if clock == WALL_CLOCK else f"\nvirtual clock: {clock}"
        ax.set_title(f"{config_label(mode, preset, k)} (dropped {dropped:.1%}){on}",
                     fontsize=9)
        ax.set_xlabel("staleness (policy versions)")
        ax.set_ylabel("share of scored samples")
    axes.flat[0].legend(fontsize=7, title="dashed: bound K", title_fontsize=7)
    save(fig, png, svg)


# One colour per objective, in the registry's order (Dark2; a ninth objective repeats one).
PALETTE = ("#1b9e77", "#7570b3", "#e7298a", "#66a61e", "#d95f02", "#e6ab02", "#a6761d",
           "#666666")


def objective_color(name: str) -> str:
    names = objectives.names()
    return PALETTE[names.index(name) % len(PALETTE)] if name in names else PALETTE[-1]


def draw_quality_vs_k(rows: Sequence[Row], png: str | Path, svg: str | Path,
                      mode: str, preset: str, clock: str = WALL_CLOCK) -> None:
    """AReaL's Table 2 as a figure: held-out pass rate against K per objective, for one
    asynchronous (mode, preset) on one clock, with sync as the on-policy reference
    (dashed)."""
    table = quality_vs_k(rows, mode, preset, clock)
    fig, ax = plt.subplots(figsize=(6.4, 4.0), layout="constrained")
    all_ks: set[int] = set()
    sync_drawn: set[float] = set()
    for i, row in enumerate(table):
        color = objective_color(row["objective"])
        ks = sorted(int(key[2:].split("/")[0]) for key in row
                    if key.startswith("K=") and key.endswith("/mean")
                    and row[key.replace("/mean", "/n")])
        all_ks.update(ks)
        dodge = 0.06 * (i - (len(table) - 1) / 2)  # keep the objectives' error bars apart
        if ks:
            ax.errorbar([k + dodge for k in ks], [row[f"K={k}/mean"] for k in ks],
                        yerr=[row[f"K={k}/ci95"] for k in ks], color=color, marker="o",
                        capsize=3, label=row["objective"])
        shared = row["sync_objectives"] != row["objective"]
        if row.get("sync/n") and not (shared and row["sync/mean"] in sync_drawn):
            ax.axhline(row["sync/mean"], color="#4d4d4d" if shared else color,
                       linewidth=0.9, linestyle="--")
            sync_drawn.add(row["sync/mean"])
    ax.set_xticks(sorted(all_ks))
    ax.set_xlabel(f"staleness bound K ({arm_title(mode, preset, clock)})")
    ax.set_ylabel("held-out sampled pass rate")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, title="mean ± 95% CI over seeds\ndashed: sync (on-policy)",
              title_fontsize=7)
    save(fig, png, svg)


def draw_quality_vs_k_replayed(table: Sequence[dict], png: str | Path, svg: str | Path
                               ) -> None:
    """Held-out pass rate against K per objective, each trained on the live runs' own
    schedules (counterfactual replays, `rlcore/analysis/paired.py::paired_table` rows): objectives
    compared on identical staleness patterns."""
    fig, ax = plt.subplots(figsize=(6.4, 4.0), layout="constrained")
    arms = sorted({(r["clock"], r["mode"], r["preset"], r["live_objective"]) for r in table})
    objectives = sorted({r["objective"] for r in table})
    ks = sorted({r["staleness_k"] for r in table})
    for i, objective in enumerate(objectives):
        dodge = 0.06 * (i - (len(objectives) - 1) / 2)
        for j, arm in enumerate(arms):
            clock, mode, preset, base = arm
            cells = sorted((r for r in table if r["objective"] == objective
                            and (r["clock"], r["mode"], r["preset"], r["live_objective"]) ==
                            arm), key=lambda r: r["staleness_k"])
            if not cells:
                continue
            label = objective if len(arms) == 1 else (
                f"{objective} ({clock}, {MODE_LABEL.get(mode, mode)}, {preset}, "
                f"schedules of {base})")
            ax.errorbar([r["staleness_k"] + dodge for r in cells],
                        [r["replay/mean"] for r in cells],
                        yerr=[r["replay/ci95"] for r in cells], marker="o", capsize=3,
                        color=objective_color(objective), label=label,
                        linestyle=("-", "--", ":")[j % 3])
    for j, arm in enumerate(arms):  # the runs replayed: the differences' baseline
        cells = sorted({r["staleness_k"]: r for r in table
                        if (r["clock"], r["mode"], r["preset"], r["live_objective"]) == arm
                        }.values(), key=lambda r: r["staleness_k"])
        ax.errorbar([r["staleness_k"] for r in cells], [r["live/mean"] for r in cells],
                    yerr=[r["live/ci95"] for r in cells], marker="s", capsize=3,
                    color="black", linestyle=("-", "--", ":")[j % 3],
                    label=f"{arm[3]}: the runs replayed (the baseline)" if len(arms) == 1
                    else f"{arm[3]} ({arm[0]}, {MODE_LABEL.get(arm[1], arm[1])}, {arm[2]}): "
                    "the runs replayed")
    ax.set_xticks(ks)
    base = ", ".join(sorted({a[3] for a in arms}))
    ax.set_xlabel(f"staleness bound K (each objective replayed on the {base} runs' schedules)")
    ax.set_ylabel("held-out sampled pass rate")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, title="mean ± 95% CI over seeds", title_fontsize=7)
    save(fig, png, svg)
