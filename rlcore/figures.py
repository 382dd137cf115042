"""The paper's figures from the grid's run directories (the trace figures of single runs are
in `rlcore/trace_figures.py`).

The data behind each figure is computed by a pure function (unit-tested); the `draw_*`
functions only lay it out with matplotlib and save PNG and SVG. A configuration is a
(mode, policy, K, objective) tuple; curves and bars are means over seeds with 95% t intervals
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

from rlcore.analysis import (  # noqa: E402
    group_order,
    mean_ci95,
    run_policy,
)
from rlcore.metrics import moving_average  # noqa: E402

MODE_LABEL = {"sync": "sync", "async": "threaded async", "areal": "AReaL-style"}
MODE_COLOR = {"sync": "#4d4d4d", "async": "#1f77b4", "areal": "#d95f02"}
MODE_MARKER = {"sync": "s", "async": "o", "areal": "D"}
# Where each mode's point labels go, so that neighbouring points' labels do not collide.
LABEL_OFFSET = {"sync": (-5, 5), "async": (5, -11), "areal": (5, 5)}
K_LINESTYLE = ("-", "--", ":", "-.")
# A mode's second and third policy are drawn in darker and lighter shades of its colour.
POLICY_SHADE = (0.0, -0.45, 0.45)

# Stable SVG ids and no timestamp, so an unchanged figure is an unchanged file.
plt.rcParams["svg.hashsalt"] = "rlcore"


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def config_label(mode: str, policy: str, k: int) -> str:
    """'AReaL-style/paper K=2': how a (mode, policy, K) configuration is named in every
    figure; sync, which has nothing to drop or interrupt, shows no policy."""
    name = MODE_LABEL.get(mode, mode) if mode == "sync" else \
        f"{MODE_LABEL.get(mode, mode)}/{policy}"
    return f"{name} K={k}"


def mode_rank(mode: str) -> int:
    return group_order([mode])[0]


Config = tuple[str, str, int, str]  # (mode, policy, K, objective)


def config_order(key: Config) -> tuple[int, str, int, str]:
    """Sort (mode, policy, K, objective) as sync, threaded, AReaL-style, then by policy, K."""
    return group_order(key)  # type: ignore[return-value]


def run_key(run_dir: Path) -> Config:
    """(mode, policy, K, objective) of a run directory."""
    s = json.loads((run_dir / "summary.json").read_text())
    return s["mode"], run_policy(run_dir), s["staleness_k"], s["objective"]


Row = dict[str, Any]  # one run's figures, as `rlcore.analysis.run_row` gives them


def group_rows(rows: Iterable[Row]) -> dict[Config, list[Row]]:
    """Runs by configuration (mode, policy, K, objective), in figure order."""
    groups: dict[Config, list[Row]] = {}
    for r in rows:
        key = (r["mode"], r["policy"], r["staleness_k"], r["objective"])
        groups.setdefault(key, []).append(r)
    return {k: groups[k] for k in sorted(groups, key=config_order)}


def arm_colors(keys: Iterable[Config]) -> dict[tuple[str, str], tuple[float, float, float]]:
    """A colour per (mode, policy): the mode's colour for its first policy (by name), a
    darker then a lighter shade for the next ones."""
    policies: dict[str, list[str]] = {}
    for mode, policy, _, _ in keys:
        if policy not in policies.setdefault(mode, []):
            policies[mode].append(policy)
    out = {}
    for mode, names in policies.items():
        for i, policy in enumerate(sorted(names)):
            out[(mode, policy)] = shade(MODE_COLOR.get(mode, "#777777"),
                                        POLICY_SHADE[i % len(POLICY_SHADE)])
    return out


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


# ---- drawing ------------------------------------------------------------------------------


def save(fig: plt.Figure, png: str | Path, svg: str | Path) -> None:
    """Write the figure as PNG and SVG and release it."""
    fig.savefig(png, dpi=150, bbox_inches="tight")
    fig.savefig(svg, bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)


def lighter(color: Any, towards_white: float = 0.55) -> tuple[float, float, float]:
    """An opaque lighter shade (overlapping spans stay one colour, unlike with alpha)."""
    r, g, b = matplotlib.colors.to_rgb(color)
    return tuple(c + (1 - c) * towards_white for c in (r, g, b))  # type: ignore[return-value]


def shade(color: Any, amount: float) -> tuple[float, float, float]:
    """Lighter towards white for amount > 0, darker towards black for amount < 0."""
    if amount >= 0:
        return lighter(color, amount)
    return tuple(c * (1 + amount) for c in matplotlib.colors.to_rgb(color))  # type: ignore


def _style(color: Any, k: int, ks: Sequence[int]) -> dict[str, Any]:
    return {"color": color, "linestyle": K_LINESTYLE[ks.index(k) % 4]}


def objective_axes(objectives: Sequence[str], height: float = 3.6, sharey: bool = True):
    fig, axes = plt.subplots(1, len(objectives), figsize=(5.2 * len(objectives), height),
                             sharey=sharey, squeeze=False, layout="constrained")
    for ax, objective in zip(axes[0], objectives, strict=True):
        ax.set_title(f"objective: {objective}")
        ax.grid(alpha=0.3)
    return fig, axes[0]


def objectives_of(groups: dict[Config, list[Row]]) -> list[str]:
    return sorted({o for *_, o in groups})


def _arm_ks(groups: dict[Config, list[Row]]) -> dict[tuple[str, str], list[int]]:
    ks: dict[tuple[str, str], set[int]] = {}
    for mode, policy, k, _ in groups:
        ks.setdefault((mode, policy), set()).add(k)
    return {a: sorted(v) for a, v in ks.items()}


def panel_legend(axes: Sequence[Any]) -> tuple[list[Any], list[str]]:
    """Every labelled line of every panel once: a configuration may be missing from some."""
    handles: list[Any] = []
    labels: list[str] = []
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if label not in labels:
                handles.append(h)
                labels.append(label)
    return handles, labels


def draw_pass_rate(rows: Sequence[Row], png: str | Path, svg: str | Path) -> None:
    """Paper Figure 2: training pass rate against policy updates, per configuration."""
    groups = group_rows(rows)
    objectives, arm_ks, colors = objectives_of(groups), _arm_ks(groups), arm_colors(groups)
    fig, axes = objective_axes(objectives, height=4.0)
    threshold = None
    for (mode, policy, k, objective), members in groups.items():
        curves = [pass_rate_curve(Path(r["run_dir"])) for r in members]
        threshold = curves[0][1]
        mean, _ = mean_curve([c for c, _ in curves])
        ax = axes[objectives.index(objective)]
        ax.plot(range(1, len(mean) + 1), mean, label=config_label(mode, policy, k),
                linewidth=1.1, **_style(colors[(mode, policy)], k, arm_ks[(mode, policy)]))
    for ax in axes:
        if threshold is not None:
            ax.axhline(threshold, color="grey", linewidth=0.8, linestyle=(0, (4, 4)))
        ax.set_xlabel("training step (applied policy update)")
    axes[0].set_ylabel("training pass rate (trailing mean)")
    fig.legend(*panel_legend(axes), loc="outside right center", fontsize=8,
               title="mean over seeds\ngrey: threshold", title_fontsize=7)
    save(fig, png, svg)


def _bar_chart(rows: Sequence[Row], metric: str, ylabel: str,
               png: str | Path, svg: str | Path, missing_note: str | None = None) -> None:
    """Bars of a metric per (mode, policy, K), one bar per objective, mean ± 95% CI, seeds as
    dots."""
    groups = group_rows(rows)
    configs = list(dict.fromkeys((m, p, k) for m, p, k, _ in groups))
    objectives, colors = objectives_of(groups), arm_colors(groups)
    width = 0.8 / len(objectives)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(configs) + 2), 4.0),
                           layout="constrained")
    hatches = ("", "//", "..", "xx")
    for j, objective in enumerate(objectives):
        for i, (mode, policy, k) in enumerate(configs):
            members = groups.get((mode, policy, k, objective), [])
            values = [r[metric] for r in members if r[metric] is not None]
            x = i + (j - (len(objectives) - 1) / 2) * width
            if values:
                mean, ci = mean_ci95(values)
                ax.bar(x, mean, width * 0.9, yerr=ci, capsize=3, color=colors[(mode, policy)],
                       alpha=0.75, hatch=hatches[j % 4], edgecolor="white")
                ax.plot([x] * len(values), values, "k.", markersize=4)
            if missing_note and len(values) < len(members):
                ax.annotate(f"{len(values)}/{len(members)}\n{missing_note}", (x, 0),
                            xytext=(0, 3), textcoords="offset points", ha="center",
                            fontsize=6)
    ax.set_xticks(range(len(configs)), [config_label(*c) for c in configs],
                  rotation=30, ha="right")
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
    """Paper Figure 3: wall-clock seconds until the trailing pass rate reaches the threshold."""
    thresholds = {r["threshold"] for r in rows}
    level = thresholds.pop() if len(thresholds) == 1 else "threshold"
    _bar_chart(rows, "time_to_threshold_s",
               f"seconds to train pass ≥ {level} (wall clock)", png, svg,
               missing_note="reached")


def draw_reward_per_1k(rows: Sequence[Row], png: str | Path,
                       svg: str | Path) -> None:
    """Paper Figure 4: total reward per 1,000 generated tokens (sample efficiency)."""
    _bar_chart(rows, "reward_per_1k_tokens", "reward per 1k generated tokens", png, svg)


def draw_end_to_end(rows: Sequence[Row], png: str | Path, svg: str | Path) -> None:
    """End-to-end time per configuration: the measured training time on top of the cold
    start on top of the job's start-up, with updates/s above each bar (the paper's
    question: does async shorten it?)."""
    groups = group_rows(rows)
    colors = arm_colors(groups)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(groups) + 2), 4.2),
                           layout="constrained")
    for i, ((mode, policy, _, _), members) in enumerate(groups.items()):
        startup, _ = mean_ci95([r["startup_s"] for r in members])
        cold, _ = mean_ci95([r["cold_start_s"] for r in members])
        wall, _ = mean_ci95([r["wall_s"] for r in members])
        total, total_ci = mean_ci95([r["startup_s"] + r["cold_start_s"] + r["wall_s"]
                                     for r in members])
        color = colors[(mode, policy)]
        ax.bar(i, startup, 0.7, color=lighter(color, 0.8))
        ax.bar(i, cold, 0.7, bottom=startup, color=lighter(color))
        ax.bar(i, wall, 0.7, bottom=startup + cold, color=color, yerr=total_ci, capsize=3)
        rate, _ = mean_ci95([r["updates_per_s"] for r in members])
        ax.annotate(f"{rate:.0f}/s", (i, total + total_ci), xytext=(0, 2),
                    textcoords="offset points", ha="center", fontsize=6)
    ax.set_xticks(range(len(groups)),
                  [f"{config_label(m, p, k)}, {o}" for m, p, k, o in groups],
                  rotation=40, ha="right", fontsize=7)
    ax.set_ylabel("seconds")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(handles=[Patch(color=lighter("#4d4d4d", 0.8),
                             label="job start-up (interpreter, imports, config)"),
                       Patch(color=lighter("#4d4d4d"), label="cold start (model loading)"),
                       Patch(color="#4d4d4d", label="training (measured wall time)")],
              fontsize=7, loc="upper left",
              title="mean over seeds; error bar: 95% CI of the total; label: updates/s",
              title_fontsize=7)
    save(fig, png, svg)
