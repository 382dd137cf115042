"""What every figure shares: pyplot set up for files, the labels, colours and markers of
modes, presets and K, grouping run rows into configurations, and saving PNG and SVG.

A configuration is a (mode, preset, K, objective) tuple; curves and bars are means over seeds
with 95% t intervals (`rlcore.analysis.tables.mean_ci95`), the same statistics as the tables.
Runs of different clocks (the rows' `clock`: `wall`, or a virtual clock's hardware profile)
are drawn in panels of their own (`by_clock`): their seconds are different quantities.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display

import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

from rlcore.algo.metrics import moving_average  # noqa: E402
from rlcore.analysis.tables import (  # noqa: E402
    clock_order,
    group_order,
    mean_ci95,
)
from rlcore.record.identity import WALL_CLOCK, RunId  # noqa: E402
from rlcore.record.rundir import read_jsonl  # noqa: E402

MODE_LABEL = {"sync": "sync", "async": "threaded async", "areal": "AReaL-style"}
MODE_COLOR = {"sync": "#4d4d4d", "async": "#1f77b4", "areal": "#d95f02"}
MODE_MARKER = {"sync": "s", "async": "o", "areal": "D"}
# Where each mode's point labels go, so that neighbouring points' labels do not collide.
LABEL_OFFSET = {"async": (5, -11), "areal": (5, 5)}  # K labels beside a mode's points
K_LINESTYLE = ("-", "--", ":", "-.")
# A mode's second and third preset are drawn in darker and lighter shades of its colour.
PRESET_SHADE = (0.0, -0.45, 0.45)
# An arm's second and third K, where each is a bar of its own (`config_colors`)
K_SHADE = (0.0, 0.45, -0.3)

# Stable SVG ids and no timestamp, so an unchanged figure is an unchanged file.
plt.rcParams["svg.hashsalt"] = "rlcore"


def config_label(mode: str, preset: str, k: int, sync_preset: bool = False) -> str:
    """'AReaL-style/paper K=2': how a (mode, preset, K) configuration is named in every
    figure; sync, which has nothing to drop or interrupt, shows its preset only where
    `sync_preset` (`sync_presets_differ`: a preset may set more than staleness)."""
    name = MODE_LABEL.get(mode, mode) if mode == "sync" and not sync_preset else \
        f"{MODE_LABEL.get(mode, mode)}/{preset}"
    return f"{name} K={k}"


def sync_presets_differ(keys: Iterable[tuple[Any, ...]]) -> bool:
    """Whether (mode, preset, ...) keys hold sync under more than one preset (config/lora.yaml's
    adapters are presets): then sync's labels must name theirs."""
    return len({key[1] for key in keys if key[0] == "sync"}) > 1


def mode_rank(mode: str) -> int:
    return group_order([mode])[0]


Config = tuple[str, str, int, str]  # (mode, preset, K, objective)


def config_order(key: Config) -> tuple[int, str, int, str]:
    """Sort (mode, preset, K, objective) as sync, threaded, AReaL-style, then by preset, K."""
    mode, preset, k, objective = key
    return group_order(key)[0], preset, k, objective


def run_key(run_dir: Path) -> Config:
    """(mode, preset, K, objective) of a run directory."""
    name = RunId.from_dict(json.loads((run_dir / "summary.json").read_text())["run"])
    return name.mode, name.preset, name.k, name.objective


Row = dict[str, Any]  # one run's figures, as `rlcore.analysis.tables.run_row` gives them


def by_clock(rows: Iterable[Row]) -> dict[str, list[Row]]:
    """Runs by clock, wall-clock runs first, then virtual ones by profile name."""
    out: dict[str, list[Row]] = {}
    for r in rows:
        out.setdefault(r["clock"], []).append(r)
    return {c: out[c] for c in sorted(out, key=clock_order)}


def clock_title(clock: str) -> str:
    """A panel's title for the runs of one clock."""
    return "wall clock (this machine)" if clock == WALL_CLOCK else f"virtual clock: {clock}"


def arm_title(mode: str, preset: str, clock: str) -> str:
    """"AReaL-style under staleness preset 'paper', virtual clock v100x2-...": one arm of the
    grid, named for a figure's title."""
    on = "" if clock == WALL_CLOCK else f", virtual clock {clock}"
    return f"{MODE_LABEL.get(mode, mode)} under staleness preset '{preset}'{on}"


def seconds_of(clock: str) -> str:
    """Which seconds a clock counts, for axis labels."""
    return "wall clock" if clock == WALL_CLOCK else f"virtual: {clock}"


def group_rows(rows: Iterable[Row]) -> dict[Config, list[Row]]:
    """Runs by configuration (mode, preset, K, objective), in figure order."""
    groups: dict[Config, list[Row]] = {}
    for r in rows:
        key = (r["mode"], r["preset"], r["staleness_k"], r["objective"])
        groups.setdefault(key, []).append(r)
    return {k: groups[k] for k in sorted(groups, key=config_order)}


def arm_colors(keys: Iterable[Config]) -> dict[tuple[str, str], tuple[float, float, float]]:
    """A colour per (mode, preset): the mode's colour for its first preset (by name), a
    darker then a lighter shade for the next ones."""
    presets: dict[str, list[str]] = {}
    for mode, preset, _, _ in keys:
        if preset not in presets.setdefault(mode, []):
            presets[mode].append(preset)
    out = {}
    for mode, names in presets.items():
        for i, preset in enumerate(sorted(names)):
            out[(mode, preset)] = shade(MODE_COLOR.get(mode, "#777777"),
                                        PRESET_SHADE[i % len(PRESET_SHADE)])
    return out


def config_colors(keys: Iterable[Config]) -> dict[tuple[str, str, int], tuple[float, ...]]:
    """A colour per (mode, preset, K) for bars, where each K is a bar of its own: the arm's
    colour (`arm_colors`) at its lowest K, lighter at the next and darker at the one after,
    so that an arm's K = 1 and K = 8 bars never share one colour."""
    arms = arm_colors(keys)
    ks: dict[tuple[str, str], list[int]] = {}
    for mode, preset, k, _ in keys:
        if k not in ks.setdefault((mode, preset), []):
            ks[(mode, preset)].append(k)
    return {(mode, preset, k): shade(arms[(mode, preset)], K_SHADE[i % len(K_SHADE)])
            for (mode, preset), values in ks.items() for i, k in enumerate(sorted(values))}


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


def line_style(color: Any, k: int, ks: Sequence[int]) -> dict[str, Any]:
    return {"color": color, "linestyle": K_LINESTYLE[ks.index(k) % 4]}


def objective_axes(clocks: Sequence[str], objectives: Sequence[str], height: float = 3.6,
                   sharex: bool | Literal["row"] = False):
    """A row of panels per clock and a column per objective, sharing y: `axes[i][j]` is clock
    i's panel of objective j; with one objective, the clocks' panels side by side, as they
    share the y axis (`sharex="row"`: each clock its own x). Titles name the clock when there
    is more than one."""
    side_by_side = len(objectives) == 1
    shape = (1, len(clocks)) if side_by_side else (len(clocks), len(objectives))
    fig, grid = plt.subplots(*shape, figsize=(5.2 * shape[1], height * shape[0]),
                             sharex=False if side_by_side and sharex == "row" else sharex,
                             sharey=True, squeeze=False, layout="constrained")
    axes = grid.reshape(len(clocks), len(objectives))
    for row, clock in zip(axes, clocks, strict=True):
        for ax, objective in zip(row, objectives, strict=True):
            title = f"objective: {objective}"
            ax.set_title(title if len(clocks) == 1 else f"{clock_title(clock)}\n{title}")
            ax.grid(alpha=0.3)
    return fig, axes


def clock_panels(widths: dict[str, int], per_config: float, height: float
                 ) -> tuple[Any, Any]:
    """A figure with a panel per clock side by side (`widths`: clock -> configurations its
    panel shows), each as wide as its configurations need, with its own y axis: seconds of
    different clocks share no scale."""
    fig, axes = plt.subplots(1, len(widths), squeeze=False, layout="constrained",
                             width_ratios=[max(w, 2) for w in widths.values()],
                             figsize=(max(6.0, per_config * sum(widths.values())
                                          + 2 * len(widths)), height))
    for ax, clock in zip(axes[0], widths, strict=True):
        if len(widths) > 1:
            ax.set_title(clock_title(clock), fontsize=9)
    return fig, axes[0]


def objectives_of(groups: dict[Config, list[Row]]) -> list[str]:
    return sorted({o for *_, o in groups})


def arm_ks(groups: dict[Config, list[Row]]) -> dict[tuple[str, str], list[int]]:
    ks: dict[tuple[str, str], set[int]] = {}
    for mode, preset, k, _ in groups:
        ks.setdefault((mode, preset), set()).add(k)
    return {a: sorted(v) for a, v in ks.items()}


def panel_legend(axes: Iterable[Any]) -> tuple[list[Any], list[str]]:
    """Every labelled line of every panel once: a configuration may be missing from some."""
    handles: list[Any] = []
    labels: list[str] = []
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if label not in labels:
                handles.append(h)
                labels.append(label)
    return handles, labels


