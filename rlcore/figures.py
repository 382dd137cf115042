"""The paper's figures from the grid's run directories (the trace figures of single runs are
in `rlcore/trace_figures.py`).

The data behind each figure is computed by a pure function (unit-tested); the `draw_*`
functions only lay it out with matplotlib and save PNG and SVG. A configuration is a
(mode, K, objective) triple; curves and bars are means over seeds with 95% t intervals
(`rlcore.analysis.mean_ci95`), the same statistics as the tables.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display

import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
from matplotlib.patches import Patch  # noqa: E402

from rlcore.analysis import mean_ci95, quality_vs_k  # noqa: E402
from rlcore.metrics import moving_average  # noqa: E402

MODES = ("sync", "async", "areal")
MODE_LABEL = {"sync": "sync", "async": "threaded async", "areal": "AReaL-style"}
MODE_COLOR = {"sync": "#4d4d4d", "async": "#1f77b4", "areal": "#d95f02"}
MODE_MARKER = {"sync": "s", "async": "o", "areal": "D"}
# Where each mode's point labels go, so that neighbouring points' labels do not collide.
LABEL_OFFSET = {"sync": (-5, 5), "async": (5, -11), "areal": (5, 5)}
K_LINESTYLE = ("-", "--", ":", "-.")

# Stable SVG ids and no timestamp, so an unchanged figure is an unchanged file.
plt.rcParams["svg.hashsalt"] = "rlcore"


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def config_label(mode: str, k: int) -> str:
    """'AReaL-style K=2': how a (mode, K) configuration is named in every figure."""
    return f"{MODE_LABEL.get(mode, mode)} K={k}"


def mode_rank(mode: str) -> int:
    return MODES.index(mode) if mode in MODES else len(MODES)


def config_order(key: tuple[str, int, str]) -> tuple[int, int, str]:
    """Sort (mode, K, objective) as sync, threaded, AReaL-style, then by K."""
    mode, k, objective = key
    return (mode_rank(mode), k, objective)


def run_key(run_dir: Path) -> tuple[str, int, str]:
    s = json.loads((run_dir / "summary.json").read_text())
    return s["mode"], s["staleness_k"], s["objective"]


Row = dict[str, Any]  # one run's figures, as `rlcore.analysis.run_row` gives them


def group_rows(rows: Iterable[Row]) -> dict[tuple[str, int, str], list[Row]]:
    """Runs by configuration (mode, K, objective), in figure order."""
    groups: dict[tuple[str, int, str], list[Row]] = {}
    for r in rows:
        groups.setdefault((r["mode"], r["staleness_k"], r["objective"]), []).append(r)
    return {k: groups[k] for k in sorted(groups, key=config_order)}


# ---- data -------------------------------------------------------------------------------


def mean_curve(curves: Sequence[Sequence[float]]) -> tuple[list[float], list[float]]:
    """Pointwise mean and 95% half-width over equally long curves (cut to the shortest)."""
    n = min(len(c) for c in curves)
    stats = [mean_ci95([c[i] for c in curves]) for i in range(n)]
    return [m for m, _ in stats], [h for _, h in stats]


def pass_rate_curve(run_dir: Path) -> tuple[list[float], float]:
    """One run's training pass rate per update, as the trailing mean that time-to-threshold
    uses, and that threshold."""
    updates = read_jsonl(run_dir / "updates.jsonl")
    ev = json.loads((run_dir / "config.json").read_text())["config"]["eval"]
    return moving_average([u["pass_rate"] for u in updates], ev["window"]), ev["threshold"]


def staleness_counts(run_dirs: Iterable[Path]) -> dict[str, dict[int, int]]:
    """Per-sample staleness histograms of accepted and stale-dropped samples, summed."""
    out: dict[str, dict[int, int]] = {"accepted": {}, "dropped_stale": {}}
    for d in run_dirs:
        per_sample = json.loads((d / "staleness.json").read_text())["per_sample"]
        for kind, counts in out.items():
            for s, n in per_sample.get(kind, {}).items():
                counts[int(s)] = counts.get(int(s), 0) + n
    return out


# ---- drawing ------------------------------------------------------------------------------


def save(fig: plt.Figure, png: str | Path, svg: str | Path) -> None:
    """Write the figure as PNG and SVG and release it."""
    fig.savefig(png, dpi=150, bbox_inches="tight")
    fig.savefig(svg, bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)


def lighter(color: str, towards_white: float = 0.55) -> tuple[float, float, float]:
    """An opaque lighter shade (overlapping spans stay one colour, unlike with alpha)."""
    r, g, b = matplotlib.colors.to_rgb(color)
    return tuple(c + (1 - c) * towards_white for c in (r, g, b))  # type: ignore[return-value]


def _style(mode: str, k: int, ks: Sequence[int]) -> dict[str, Any]:
    return {"color": MODE_COLOR.get(mode), "linestyle": K_LINESTYLE[ks.index(k) % 4]}


def _objective_axes(objectives: Sequence[str], height: float = 3.6, sharey: bool = True):
    fig, axes = plt.subplots(1, len(objectives), figsize=(5.2 * len(objectives), height),
                             sharey=sharey, squeeze=False, layout="constrained")
    for ax, objective in zip(axes[0], objectives, strict=True):
        ax.set_title(f"objective: {objective}")
        ax.grid(alpha=0.3)
    return fig, axes[0]


def _objectives(groups: dict[tuple[str, int, str], list[Row]]) -> list[str]:
    return sorted({o for _, _, o in groups})


def _mode_ks(groups: dict[tuple[str, int, str], list[Row]]) -> dict[str, list[int]]:
    ks: dict[str, set[int]] = {}
    for mode, k, _ in groups:
        ks.setdefault(mode, set()).add(k)
    return {m: sorted(v) for m, v in ks.items()}


def draw_pass_rate(rows: Sequence[Row], png: str | Path, svg: str | Path) -> None:
    """Paper Figure 2: training pass rate against policy updates, per configuration."""
    groups = group_rows(rows)
    objectives, mode_ks = _objectives(groups), _mode_ks(groups)
    fig, axes = _objective_axes(objectives, height=4.0)
    threshold = None
    for (mode, k, objective), members in groups.items():
        curves = [pass_rate_curve(Path(r["run_dir"])) for r in members]
        threshold = curves[0][1]
        mean, _ = mean_curve([c for c, _ in curves])
        ax = axes[objectives.index(objective)]
        ax.plot(range(1, len(mean) + 1), mean, label=config_label(mode, k), linewidth=1.1,
                **_style(mode, k, mode_ks[mode]))
    for ax in axes:
        if threshold is not None:
            ax.axhline(threshold, color="grey", linewidth=0.8, linestyle=(0, (4, 4)))
        ax.set_xlabel("training step (applied policy update)")
    axes[0].set_ylabel("training pass rate (trailing mean)")
    handles, labels = axes[0].get_legend_handles_labels()
    for ax in axes[1:]:  # a configuration may be missing from the first panel
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if label not in labels:
                handles.append(h)
                labels.append(label)
    fig.legend(handles, labels, loc="outside right center", fontsize=8,
               title="mean over seeds\ngrey: threshold", title_fontsize=7)
    save(fig, png, svg)


def _bar_chart(rows: Sequence[Row], metric: str, ylabel: str,
               png: str | Path, svg: str | Path, missing_note: str | None = None) -> None:
    """Bars of a metric per (mode, K), one bar per objective, mean ± 95% CI, seeds as dots."""
    groups = group_rows(rows)
    configs = list(dict.fromkeys((m, k) for m, k, _ in groups))
    objectives = _objectives(groups)
    width = 0.8 / len(objectives)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(configs) + 2), 4.0),
                           layout="constrained")
    hatches = ("", "//", "..", "xx")
    for j, objective in enumerate(objectives):
        for i, (mode, k) in enumerate(configs):
            members = groups.get((mode, k, objective), [])
            values = [r[metric] for r in members if r[metric] is not None]
            x = i + (j - (len(objectives) - 1) / 2) * width
            if values:
                mean, ci = mean_ci95(values)
                ax.bar(x, mean, width * 0.9, yerr=ci, capsize=3, color=MODE_COLOR.get(mode),
                       alpha=0.75, hatch=hatches[j % 4], edgecolor="white",
                       label=f"objective: {objective}" if i == 0 else None)
                ax.plot([x] * len(values), values, "k.", markersize=4)
            if missing_note and len(values) < len(members):
                ax.annotate(f"{len(values)}/{len(members)}\n{missing_note}", (x, 0),
                            xytext=(0, 3), textcoords="offset points", ha="center",
                            fontsize=6)
    ax.set_xticks(range(len(configs)), [config_label(m, k) for m, k in configs],
                  rotation=30, ha="right")
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    fig.legend(*ax.get_legend_handles_labels(), loc="outside upper center", fontsize=8,
               ncols=len(objectives), title="bars: mean ± 95% CI over seeds; dots: seeds",
               title_fontsize=7)
    save(fig, png, svg)


def draw_time_to_threshold(rows: Sequence[Row], png: str | Path,
                           svg: str | Path) -> None:
    """Paper Figure 3: wall-clock seconds until the trailing pass rate reaches the threshold."""
    thresholds = {r["threshold"] for r in rows}
    level = thresholds.pop() if len(thresholds) == 1 else "threshold"
    _bar_chart(rows, "time_to_threshold_s",
               f"time to training pass rate ≥ {level} (s, wall clock)", png, svg,
               missing_note="reached")


def draw_reward_per_1k(rows: Sequence[Row], png: str | Path,
                       svg: str | Path) -> None:
    """Paper Figure 4: total reward per 1,000 generated tokens (sample efficiency)."""
    _bar_chart(rows, "reward_per_1k_tokens", "reward per 1k generated tokens", png, svg)


def draw_quality_throughput(rows: Sequence[Row], png: str | Path,
                            svg: str | Path) -> None:
    """Held-out pass rate against accepted samples/s for every K: the staleness trade-off."""
    groups = group_rows(rows)  # in K order within each mode
    objectives = _objectives(groups)
    fig, axes = _objective_axes(objectives, height=4.0)
    for objective, ax in zip(objectives, axes, strict=True):
        for mode in MODES:
            points = []
            for (m, k, o), members in groups.items():
                if m != mode or o != objective:
                    continue
                x, xe = mean_ci95([r["accepted_samples_per_s"] for r in members])
                quality = [r["heldout_pass_rate"] for r in members
                           if r["heldout_pass_rate"] is not None]
                if not quality:
                    continue
                y, ye = mean_ci95(quality)
                points.append((x, y))
                ax.errorbar(x, y, xerr=xe, yerr=ye, color=MODE_COLOR[mode],
                            marker=MODE_MARKER[mode], capsize=2, markersize=5,
                            label=MODE_LABEL[mode] if len(points) == 1 else None)
                ax.annotate(f"K={k}", (x, y), xytext=LABEL_OFFSET[mode],
                            textcoords="offset points", fontsize=7, color=MODE_COLOR[mode],
                            ha="right" if mode == "sync" else "left")
            if len(points) > 1:
                ax.plot(*zip(*points, strict=True), color=MODE_COLOR[mode], linewidth=0.8,
                        alpha=0.6)
        ax.set_xlabel("accepted samples per second (throughput)")
    axes[0].set_ylabel("held-out sampled pass rate")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside right center", fontsize=8,
               title="mean ± 95% CI\nover seeds", title_fontsize=7)
    save(fig, png, svg)


def draw_staleness(rows: Sequence[Row], png: str | Path, svg: str | Path) -> None:
    """Staleness of accepted and stale-dropped samples, one panel per async (mode, K)."""
    by_config: dict[tuple[str, int], list[Path]] = {}
    for (mode, k, _), members in group_rows(rows).items():
        if mode != "sync":
            by_config.setdefault((mode, k), []).extend(Path(r["run_dir"]) for r in members)
    if not by_config:
        by_config = {("sync", 0): [Path(r["run_dir"]) for r in rows]}
    configs = list(by_config)
    cols = min(4, len(configs))
    rows = -(-len(configs) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 2.8 * rows), squeeze=False,
                             layout="constrained")
    for ax in axes.flat[len(configs):]:
        ax.set_visible(False)
    for ax, (mode, k) in zip(axes.flat, configs, strict=False):
        counts = staleness_counts(by_config[(mode, k)])
        total = sum(counts["accepted"].values()) + sum(counts["dropped_stale"].values())
        xs = list(range(max([k + 1, *counts["accepted"], *counts["dropped_stale"]]) + 1))
        for kind, offset, color, label in (
            ("accepted", -0.2, MODE_COLOR[mode], "accepted"),
            ("dropped_stale", 0.2, "#b2182b", "dropped (stale)"),
        ):
            ax.bar([x + offset for x in xs],
                   [counts[kind].get(x, 0) / max(total, 1) for x in xs], 0.4, color=color,
                   label=label)
        ax.axvline(k + 0.5, color="grey", linewidth=0.8, linestyle="--")
        ax.set_xticks(xs)
        dropped = sum(counts["dropped_stale"].values()) / max(total, 1)
        ax.set_title(f"{config_label(mode, k)} (dropped {dropped:.1%})", fontsize=9)
        ax.set_xlabel("staleness (policy versions)")
        ax.set_ylabel("share of scored samples")
    axes.flat[0].legend(fontsize=7, title="dashed: bound K", title_fontsize=7)
    save(fig, png, svg)


def draw_end_to_end(rows: Sequence[Row], png: str | Path, svg: str | Path) -> None:
    """End-to-end time per configuration: the measured training time on top of the cold
    start, with updates/s above each bar (the paper's question: does async shorten it?)."""
    groups = group_rows(rows)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(groups) + 2), 4.2),
                           layout="constrained")
    for i, ((mode, _, _), members) in enumerate(groups.items()):
        cold, _ = mean_ci95([r["cold_start_s"] for r in members])
        wall, _ = mean_ci95([r["wall_s"] for r in members])
        total, total_ci = mean_ci95([r["cold_start_s"] + r["wall_s"] for r in members])
        ax.bar(i, cold, 0.7, color=lighter(MODE_COLOR[mode]))
        ax.bar(i, wall, 0.7, bottom=cold, color=MODE_COLOR[mode], yerr=total_ci, capsize=3)
        rate, _ = mean_ci95([r["updates_per_s"] for r in members])
        ax.annotate(f"{rate:.0f}/s", (i, total + total_ci), xytext=(0, 2),
                    textcoords="offset points", ha="center", fontsize=6)
    ax.set_xticks(range(len(groups)), [f"{config_label(m, k)}, {o}" for m, k, o in groups],
                  rotation=40, ha="right", fontsize=7)
    ax.set_ylabel("seconds")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(handles=[Patch(color=lighter("#4d4d4d"), label="cold start (model loading)"),
                       Patch(color="#4d4d4d", label="training (measured wall time)")],
              fontsize=7, loc="upper left",
              title="mean over seeds; error bar: 95% CI of the total; label: updates/s",
              title_fontsize=7)
    save(fig, png, svg)


OBJECTIVE_COLOR = {"pg": "#1b9e77", "behav_clip": "#7570b3", "decoupled": "#e7298a",
                   "a3po": "#66a61e"}


def draw_quality_vs_k(rows: Sequence[Row], png: str | Path, svg: str | Path,
                      mode: str = "areal") -> None:
    """AReaL's Table 2 as a figure: held-out pass rate against K per objective, for one
    asynchronous mode, with sync as the on-policy reference (dashed)."""
    table = quality_vs_k(rows, mode)
    fig, ax = plt.subplots(figsize=(6.4, 4.0), layout="constrained")
    all_ks: set[int] = set()
    for i, row in enumerate(table):
        color = OBJECTIVE_COLOR.get(row["objective"])
        ks = sorted(int(key[2:].split("/")[0]) for key in row
                    if key.startswith("K=") and key.endswith("/mean")
                    and row[key.replace("/mean", "/n")])
        all_ks.update(ks)
        dodge = 0.06 * (i - (len(table) - 1) / 2)  # keep the objectives' error bars apart
        if ks:
            ax.errorbar([k + dodge for k in ks], [row[f"K={k}/mean"] for k in ks],
                        yerr=[row[f"K={k}/ci95"] for k in ks], color=color, marker="o",
                        capsize=3, label=row["objective"])
        if row.get("sync/n"):
            ax.axhline(row["sync/mean"], color=color, linewidth=0.9, linestyle="--")
    ax.set_xticks(sorted(all_ks))
    ax.set_xlabel(f"staleness bound K ({MODE_LABEL.get(mode, mode)})")
    ax.set_ylabel("held-out sampled pass rate")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, title="mean ± 95% CI over seeds\ndashed: sync (on-policy)",
              title_fontsize=7)
    save(fig, png, svg)
