"""The paper's learning figures from the grid's run directories: pass rate against updates
(Figure 2), time to threshold (Figure 3), reward per 1k generated tokens (Figure 4) and the
end-to-end time.

The data behind each figure is computed by a pure function (unit-tested); the `draw_*`
functions only lay it out with matplotlib and save PNG and SVG. Each clock's runs get their
own row of panels or panel (`style.by_clock`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.patches import Patch

from rlcore.analysis.figures.style import (
    Row,
    arm_colors,
    arm_ks,
    by_clock,
    clock_panels,
    clock_title,
    config_colors,
    config_label,
    group_rows,
    lighter,
    line_style,
    mean_curve,
    objectives_of,
    panel_legend,
    pass_rate_curve,
    plt,
    save,
    seconds_of,
    sync_presets_differ,
)
from rlcore.analysis.tables import mean_ci95


def hidden_under(curves: Sequence[tuple[str, Sequence[float]]]) -> list[tuple[str, str]]:
    """(label, the label drawn over it) for each curve, in drawing order, that a later one
    equals point for point (the last such, which lies on top): it cannot be seen, so its
    panel names it."""
    out = []
    for i, (label, curve) in enumerate(curves):
        over = [later for later, c in curves[i + 1:] if list(c) == list(curve)]
        if over:
            out.append((label, over[-1]))
    return out


def draw_pass_rate(rows: Sequence[Row], png: str | Path, svg: str | Path) -> None:
    """Paper Figure 2: training pass rate against policy updates, per configuration, the
    mean over seeds with their range shaded; a panel per clock (and objective), side by
    side on one y axis. A line that lies exactly under another is named in its panel."""
    groups = group_rows(rows)
    objectives, ks, colors = objectives_of(groups), arm_ks(groups), arm_colors(groups)
    clocks = by_clock(rows)
    named = sync_presets_differ(groups)
    panels = [(clock, objective) for clock in clocks for objective in objectives]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.4 * len(panels) + 0.6, 4.2),
                             sharey=True, squeeze=False, layout="constrained")
    threshold = None
    for ax, (clock, objective) in zip(axes[0], panels, strict=True):
        drawn: list[tuple[str, list[float]]] = []
        for (mode, preset, k, obj), members in group_rows(clocks[clock]).items():
            if obj != objective:
                continue
            curves = [pass_rate_curve(Path(r["run_dir"])) for r in members]
            threshold = curves[0][1]
            mean, _ = mean_curve([c for c, _ in curves])
            steps = range(1, len(mean) + 1)
            style = line_style(colors[(mode, preset)], k, ks[(mode, preset)])
            if len(curves) > 1:
                low = [min(c[i] for c, _ in curves) for i in range(len(mean))]
                high = [max(c[i] for c, _ in curves) for i in range(len(mean))]
                ax.fill_between(steps, low, high, color=style["color"], alpha=0.12, lw=0)
            label = config_label(mode, preset, k, named)
            ax.plot(steps, mean, label=label, linewidth=1.2, **style)
            drawn.append((label, mean))
        hidden = "\n".join(f"{label} lies under {first}" for label, first in hidden_under(drawn))
        if hidden:  # identical runs (the claims table says so too)
            ax.text(0.98, 0.02, hidden, transform=ax.transAxes, ha="right", va="bottom",
                    fontsize=7, color="#555555")
        title = clock_title(clock) if len(objectives) == 1 else \
            f"{clock_title(clock)}, objective {objective}"
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        ax.set_xlabel("training step (applied policy update)")
        if threshold is not None:
            ax.axhline(threshold, color="grey", linewidth=0.8, linestyle=(0, (4, 4)))
    axes[0][0].set_ylabel("training pass rate (trailing mean)")
    fig.legend(*panel_legend(axes.flat), loc="outside lower center", fontsize=8, ncol=3,
               title="mean over seeds, their range shaded; grey dashes: the threshold",
               title_fontsize=7, frameon=False)
    save(fig, png, svg)


def _bar_chart(rows: Sequence[Row], metric: str, ylabel: str,
               png: str | Path, svg: str | Path, missing_note: str | None = None,
               seconds: bool = False) -> None:
    """Bars of a metric per (mode, preset, K), one bar per objective, mean ± 95% CI, seeds as
    dots; a panel per clock, whose y label says which seconds when `seconds`."""
    every = group_rows(rows)
    objectives, colors = objectives_of(every), config_colors(every)
    named = sync_presets_differ(every)
    width = 0.8 / len(objectives)
    panels = {clock: group_rows(clock_rows) for clock, clock_rows in by_clock(rows).items()}
    configs_of = {clock: list(dict.fromkeys((m, p, k) for m, p, k, _ in groups))
                  for clock, groups in panels.items()}
    fig, axes = clock_panels({c: len(configs) for c, configs in configs_of.items()}, 0.9, 4.0)
    hatches = ("", "//", "..", "xx")
    for ax, (clock, groups) in zip(axes, panels.items(), strict=True):
        configs = configs_of[clock]
        for j, objective in enumerate(objectives):
            for i, (mode, preset, k) in enumerate(configs):
                members = groups.get((mode, preset, k, objective), [])
                values = [r[metric] for r in members if r[metric] is not None]
                x = i + (j - (len(objectives) - 1) / 2) * width
                if values:
                    mean, ci = mean_ci95(values)
                    ax.bar(x, mean, width * 0.9, yerr=ci, capsize=3,
                           color=colors[(mode, preset, k)], alpha=0.75, hatch=hatches[j % 4],
                           edgecolor="white")
                    ax.plot([x] * len(values), values, "k.", markersize=4)
                if missing_note and len(values) < len(members):
                    ax.annotate(f"{len(values)}/{len(members)}\n{missing_note}", (x, 0),
                                xytext=(0, 3), textcoords="offset points", ha="center",
                                fontsize=6)
        ax.set_xticks(range(len(configs)), [config_label(*c, named) for c in configs],
                      rotation=30, ha="right")
        ax.set_xlim(-0.6, len(configs) - 0.4)  # a slot per configuration, drawn or not
        if seconds:  # beside another panel a long label would run into it: two lines then
            sep = "\n" if len(panels) > 1 else " "
            ax.set_ylabel(f"{ylabel}{sep}({seconds_of(clock)})")
        else:
            ax.set_ylabel(ylabel)
        ax.grid(axis="y", alpha=0.3)
    # neutral swatches: the colour is the configuration's, the hatch the objective's
    handles = [Patch(facecolor="#999999", edgecolor="white", hatch=hatches[j % 4],
                     label=f"objective: {o}") for j, o in enumerate(objectives)]
    fig.legend(handles=handles, loc="outside upper center", fontsize=8,
               ncols=len(objectives), title="bars: mean ± 95% CI over seeds; dots: seeds",
               title_fontsize=7)
    save(fig, png, svg)


def draw_time_to_threshold(rows: Sequence[Row], png: str | Path,
                           svg: str | Path) -> None:
    """Paper Figure 3: seconds until the trailing pass rate reaches the threshold, a panel
    per clock (this machine's, or emulated on a hardware profile)."""
    thresholds = {r["threshold"] for r in rows}
    level = thresholds.pop() if len(thresholds) == 1 else "threshold"
    _bar_chart(rows, "time_to_threshold_s", f"seconds to train pass ≥ {level}", png, svg,
               missing_note="reached", seconds=True)


def draw_reward_per_1k(rows: Sequence[Row], png: str | Path,
                       svg: str | Path) -> None:
    """Paper Figure 4: total reward per 1,000 generated tokens (sample efficiency), a panel
    per clock (different runs, though not different units)."""
    _bar_chart(rows, "reward_per_1k_tokens", "reward per 1k generated tokens", png, svg)


def draw_end_to_end(rows: Sequence[Row], png: str | Path, svg: str | Path) -> None:
    """End-to-end time per configuration: the measured training time on top of the cold
    start on top of the job's start-up, with updates/s above each bar (the paper's
    question: does async shorten it?); a panel per clock. A virtual run has no start-up
    (`rlcore.analysis.tables.run_row`): its bar starts at the cold start."""
    every = group_rows(rows)
    colors, named = config_colors(every), sync_presets_differ(every)
    panels = {clock: group_rows(clock_rows) for clock, clock_rows in by_clock(rows).items()}
    fig, axes = clock_panels({c: len(groups) for c, groups in panels.items()}, 0.45, 4.2)
    for ax, (clock, groups) in zip(axes, panels.items(), strict=True):
        for i, ((mode, preset, k, _), members) in enumerate(groups.items()):
            startups = [r["startup_s"] or 0.0 for r in members]
            startup, _ = mean_ci95(startups)
            cold, _ = mean_ci95([r["cold_start_s"] for r in members])
            wall, _ = mean_ci95([r["wall_s"] for r in members])
            total, total_ci = mean_ci95([s + r["cold_start_s"] + r["wall_s"]
                                         for s, r in zip(startups, members, strict=True)])
            color = colors[(mode, preset, k)]
            ax.bar(i, startup, 0.7, color=lighter(color, 0.8))
            ax.bar(i, cold, 0.7, bottom=startup, color=lighter(color))
            ax.bar(i, wall, 0.7, bottom=startup + cold, color=color, yerr=total_ci, capsize=3)
            rate, _ = mean_ci95([r["updates_per_s"] for r in members])
            ax.annotate(f"{rate:.2g}/s", (i, total + total_ci), xytext=(0, 2),
                        textcoords="offset points", ha="center", fontsize=6)
        ax.set_xticks(range(len(groups)),
                      [f"{config_label(m, p, k, named)}, {o}" for m, p, k, o in groups],
                      rotation=40, ha="right", fontsize=7)
        # on two lines: a profile's name is longer than the panel is high
        ax.set_ylabel(f"seconds\n({seconds_of(clock)})")
        ax.grid(axis="y", alpha=0.3)
    legend = dict(fontsize=7, title_fontsize=7,
                  title="mean over seeds; error bar: 95% CI of the total; label: updates/s",
                  handles=[Patch(color=lighter("#4d4d4d", 0.8),
                                 label="job start-up (interpreter, imports, config)"),
                           Patch(color=lighter("#4d4d4d"), label="cold start (model loading)"),
                           Patch(color="#4d4d4d", label="training (measured time)")])
    if len(axes) == 1:
        axes[0].legend(loc="upper left", **legend)
    else:  # above the panels, clear of every bar
        fig.legend(loc="outside upper center", ncols=3, **legend)
    save(fig, png, svg)
