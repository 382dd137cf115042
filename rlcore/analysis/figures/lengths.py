"""Response lengths on the held-out split: the base model's beside each mode's trained
policies (eval_base.json and the runs' eval.json, `sampled_lengths`)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rlcore.analysis.figures.style import MODE_COLOR, MODE_LABEL, plt, save
from rlcore.config import MODES


def merge_lengths(histograms: Iterable[Mapping[str, int]]) -> dict[int, int]:
    """Histograms {length: count} (JSON keys are strings) summed into one."""
    total: dict[int, int] = {}
    for h in histograms:
        for length, n in h.items():
            total[int(length)] = total.get(int(length), 0) + n
    return dict(sorted(total.items()))


def length_stats(hist: Mapping[int, int]) -> dict[str, float]:
    """Mean, 10th and 90th percentile (the lowest length with at least that share at or
    below it) of a length histogram, and its count."""
    n = sum(hist.values())
    if not n:
        return {"n": 0, "mean": float("nan"), "p10": float("nan"), "p90": float("nan")}
    out: dict[str, float] = {"n": n, "mean": sum(k * c for k, c in hist.items()) / n}
    for name, q in (("p10", 0.1), ("p90", 0.9)):
        seen = 0
        for length, c in sorted(hist.items()):
            seen += c
            if seen >= q * n:
                out[name] = length
                break
    return out


def mode_lengths(evals: Iterable[tuple[str, dict[str, Any]]]) -> dict[str, dict[int, int]]:
    """Per mode, the pooled `sampled_lengths` of its runs' evaluations (mode, eval.json)."""
    by_mode: dict[str, list[Mapping[str, int]]] = {}
    for mode, ev in evals:
        by_mode.setdefault(mode, []).append(ev["sampled_lengths"])
    return {m: merge_lengths(by_mode[m]) for m in MODES if m in by_mode}


def draw_response_lengths(base_eval: Path, run_evals: Iterable[tuple[str, Path]],
                          png: str | Path, svg: str | Path) -> None:
    """The share of held-out sampled responses of each length: the base model, then each
    mode's trained policies pooled; mean and 10th/90th percentiles in the legend."""
    base = merge_lengths([json.loads(Path(base_eval).read_text())["sampled_lengths"]])
    modes = mode_lengths((m, json.loads(Path(p).read_text())) for m, p in run_evals)
    fig, ax = plt.subplots(figsize=(6.4, 3.8), layout="constrained")
    for label, hist, color in [("base model", base, "black"),
                               *((f"{MODE_LABEL[m]} (trained)", h, MODE_COLOR[m])
                                 for m, h in modes.items())]:
        s = length_stats(hist)
        xs = sorted(hist)
        ax.step(xs, [hist[x] / s["n"] for x in xs], where="mid", color=color,
                label=f"{label}: mean {s['mean']:.1f}, p10 {s['p10']:.0f}, p90 {s['p90']:.0f}")
    ax.set_xlabel("response length (tokens, the stop token included)")
    ax.set_ylabel("share of sampled responses")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, title="held-out split, sampled", title_fontsize=7)
    save(fig, png, svg)
