"""Length bias of dropping stale samples: are long responses dropped or interrupted more often?

Under the paper's preset (`staleness_control: filter`, `interrupt: resubmit`) a long generation
is exposed to more policy updates while it runs, so it may be interrupted or go stale more
often than a short one; training on the survivors would then favour short answers.
The counts come from samples.jsonl (final fate of each slot, docs/metrics.md), per response
length in tokens; the `draw_*` function only lays them out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from matplotlib.ticker import MaxNLocator

from rlcore.analysis.figures.style import plt, read_jsonl, save
from rlcore.analysis.prompts import length_terciles, runs_prompt_rows
from rlcore.record.identity import WALL_CLOCK

COUNT_KEYS = ("rows", "dropped_stale", "restarted")
MIN_ROWS = 20  # below this a length's rates are mostly noise, so the figure leaves it out


def length_counts(rows: Iterable[dict[str, Any]]) -> dict[int, dict[str, int]]:
    """Per response length L (tokens): `rows` (responses of that length), `dropped_stale`,
    and `restarted` (responses whose slot had an earlier attempt interrupted).

    A `dropped_interrupted` row has no response: its length is where the generation was cut,
    which says nothing of the length its response would have had, so it is left out.
    """
    out: dict[int, dict[str, int]] = {}
    for r in rows:
        if r["status"] == "dropped_interrupted":
            continue
        c = out.setdefault(int(r["response_tokens"]), dict.fromkeys(COUNT_KEYS, 0))
        c["rows"] += 1
        c["dropped_stale"] += r["status"] == "dropped_stale"
        c["restarted"] += r["attempt"] > 0
    return dict(sorted(out.items()))


def length_rates(counts: dict[int, dict[str, int]]) -> dict[int, dict[str, float]]:
    """Per L with rows: `drop_rate`, the share of length-L responses dropped as stale;
    `interrupt_rate`, the share whose slot was interrupted (and resubmitted) at least once
    before this response; and `rows`."""
    return {
        length: {
            "rows": c["rows"],
            "drop_rate": c["dropped_stale"] / c["rows"],
            "interrupt_rate": c["restarted"] / c["rows"],
        }
        for length, c in sorted(counts.items())
        if c["rows"] > 0
    }


def runs_length_counts(run_dirs: Iterable[Path]) -> dict[int, dict[str, int]]:
    """`length_counts` of every run's samples.jsonl, summed."""
    total: dict[int, dict[str, int]] = {}
    for d in run_dirs:
        for length, c in length_counts(read_jsonl(Path(d) / "samples.jsonl")).items():
            t = total.setdefault(length, dict.fromkeys(COUNT_KEYS, 0))
            for key in COUNT_KEYS:
                t[key] += c[key]
    return dict(sorted(total.items()))


def runs_by_k(rows: Iterable[dict[str, Any]], mode: str, preset: str, clock: str = WALL_CLOCK
              ) -> dict[int, list[Path]]:
    """The run directories of (`mode`, `preset`) on `clock` by K (sorted), from
    `analysis.run_row` rows."""
    out: dict[int, list[Path]] = {}
    for r in rows:
        if (r["mode"], r["preset"], r["clock"]) == (mode, preset, clock):
            out.setdefault(r["staleness_k"], []).append(Path(r["run_dir"]))
    return dict(sorted(out.items()))


# ---- drawing ------------------------------------------------------------------------------


def draw_length_bias(runs_by_k: dict[int, list[Path]], png: str | Path, svg: str | Path,
                     title: str, min_rows: int = MIN_ROWS) -> None:
    """Drop rate and interrupt rate against response length, one line per K; lengths with
    fewer than `min_rows` rows are left out, and marker width grows with log(rows)."""
    fig, panels = plt.subplots(1, 3, figsize=(15.2, 3.6), layout="constrained",
                               gridspec_kw={"width_ratios": [1, 1, 0.8]})
    axes, causes = panels[:2], panels[2]
    axes[1].sharex(axes[0])
    ks = sorted(runs_by_k)
    cmap = plt.get_cmap("viridis")
    for i, k in enumerate(ks):
        rates = {length: r for length, r in length_rates(runs_length_counts(runs_by_k[k])).items()
                 if r["rows"] >= min_rows}
        # a small sideways shift per K, so lines with equal rates (often all 0) stay visible
        xs = [length + 0.08 * (i - (len(ks) - 1) / 2) for length in rates]
        # log scale: counts span orders of magnitude (one length holds most rows)
        sizes = [8 * math.log10(r["rows"]) ** 2 for r in rates.values()]
        color = cmap(0.85 * i / max(len(ks) - 1, 1))  # stop short of viridis' pale yellow
        for ax, key in zip(axes, ("drop_rate", "interrupt_rate"), strict=True):
            ys = [r[key] for r in rates.values()]
            ax.plot(xs, ys, color=color, linewidth=1, label=f"K={k}")
            ax.scatter(xs, ys, s=sizes, color=color, zorder=3, clip_on=False)
        # each cause's share of the slots of each third of prompts by reference answer (the
        # axis C8 is tested on, known for every prompt, cut ones included)
        thirds = length_terciles(runs_prompt_rows(runs_by_k[k]))
        for cause, style in (("dropped_stale", "-"), ("dropped_interrupted", "--")):
            ys = [t[f"{cause}_share"] for t in thirds]
            causes.plot(range(3), ys, style, color=color, marker="o", markersize=4,
                        label=f"K={k}, {cause.removeprefix('dropped_')}")
    for ax, ylabel in zip(axes, ("dropped as stale (share of rows)",
                                 "restarted after an interrupt (share of rows)"), strict=True):
        ax.set_xlabel("response length (tokens)")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    causes.set_xticks(range(3), ["short", "middle", "long"])
    causes.set_xlabel("third of prompts by reference answer length")
    causes.set_ylabel("dropped (share of slots): by cause")
    causes.set_ylim(bottom=0)
    if ks:
        axes[0].legend(fontsize=7, title_fontsize=7,
                       title=f"lengths with < {min_rows} rows left out;\nmarker width ~ log(rows)")
        causes.legend(fontsize=6.5, title="solid: stale; dashed: interrupted past retries",
                      title_fontsize=6.5)
    fig.suptitle(title, fontsize=10)
    save(fig, png, svg)
