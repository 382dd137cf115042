"""Figures of single runs' traces: queue depths and worker activity in a time window.

One run per mode (the grid's trace point, `figures.trace` in the pipeline config), read from
its events.jsonl; the data is computed by pure functions, the `draw_*` functions lay it out.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# pyplot as rlcore.analysis.figures.style sets it up (the Agg backend, stable SVG ids)
from rlcore.analysis.figures.style import (
    MODE_COLOR,
    config_label,
    lighter,
    mode_rank,
    plt,
    read_jsonl,
    run_key,
    save,
)

QUEUES = ("prompt_queue", "generating", "sample_queue", "ready_buffer", "trainer_queue")
# A queue's field as runs recorded it before its rename (the controller's buffer was once
# "replay_buffer", a word `rlcore/replay/` means otherwise).
FORMER = {"ready_buffer": "replay_buffer"}
QUEUE_LABEL = {
    "prompt_queue": "prompts waiting",
    "generating": "prompts generating",
    "sample_queue": "samples to score",
    "ready_buffer": "samples ready to batch",
    "trainer_queue": "batches at trainer",
}
ROLES = ("rollout", "trainer")


def queue_trace(events: Iterable[dict[str, Any]]) -> dict[str, list[float]]:
    """Time and depth of every queue from the controller's `queues` events."""
    rows = [e for e in events if e["type"] == "queues"]
    trace = {"t": [e["t"] for e in rows]}
    for q in QUEUES:
        trace[q] = [e.get(q, e.get(FORMER.get(q, q), 0)) for e in rows]
    return trace


def busy_spans(events: Iterable[dict[str, Any]], start: float, end: float
               ) -> dict[str, list[tuple[float, float]]]:
    """Per role, the (start, duration) of busy spans clipped to the window [start, end]."""
    out: dict[str, list[tuple[float, float]]] = {r: [] for r in ROLES}
    for e in events:
        if e["type"] != "span":
            continue
        role = e["role"]
        s, t = max(e["start"], start), min(e["end"], end)
        if role in out and t > s:
            out[role].append((s, t - s))
    return out


def draw_queue_depth(traces: dict[str, Path], window: tuple[float, float],
                     png: str | Path, svg: str | Path) -> None:
    """Queue depths in a time window, one panel per asynchronous mode's trace run."""
    modes = [m for m in sorted(traces, key=mode_rank) if m != "sync"]
    fig, axes = plt.subplots(len(modes), 1, figsize=(9, 2.6 * len(modes)), sharex=True,
                             squeeze=False, layout="constrained")
    for ax, mode in zip(axes[:, 0], modes, strict=True):
        run_dir = traces[mode]
        trace = queue_trace(read_jsonl(run_dir / "events.jsonl"))
        for q in QUEUES:
            ax.step(trace["t"], trace[q], where="post", label=QUEUE_LABEL[q], linewidth=0.9)
        mode_, preset, k, objective = run_key(run_dir)
        ax.set_title(f"{config_label(mode_, preset, k)}, {objective}, {run_dir.name}",
                     fontsize=9)
        ax.set_ylabel("depth (items)")
        ax.set_xlim(*window)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("wall-clock time since the measured start (s)")
    handles, names = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, names, fontsize=7, ncol=len(QUEUES), loc="outside upper center")
    save(fig, png, svg)


def draw_worker_activity(traces: dict[str, Path], window: tuple[float, float],
                         png: str | Path, svg: str | Path) -> None:
    """Rollout and trainer busy spans in a time window, sync beside the async modes."""
    start, end = window
    modes = sorted(traces, key=mode_rank)
    fig, ax = plt.subplots(figsize=(10, 0.9 * len(modes) * len(ROLES) + 1.2),
                           layout="constrained")
    ticks, labels = [], []
    y = 0.0
    for mode in reversed(modes):
        run_dir = traces[mode]
        summary = json.loads((run_dir / "summary.json").read_text())
        spans = busy_spans(read_jsonl(run_dir / "events.jsonl"), start, end)
        name = config_label(*run_key(run_dir)[:3])
        for role in reversed(ROLES):
            color = MODE_COLOR[mode] if role == "rollout" else lighter(MODE_COLOR[mode])
            ax.broken_barh(spans[role], (y, 0.8), facecolors=color)
            ticks.append(y + 0.4)
            labels.append(f"{name}: {role}" if role == "rollout" else
                          f"{role}\n(overlap {summary['time']['overlap_frac']:.0%} of run)")
            y += 1
        y += 0.5
    ax.set_yticks(ticks, labels)
    ax.set_xlim(start, end)
    ax.set_xlabel("wall-clock time since the measured start (s)")
    ax.set_title("busy spans: rollout (dark) and trainer (light); side by side = overlap",
                 fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    save(fig, png, svg)
