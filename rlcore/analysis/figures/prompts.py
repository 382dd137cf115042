"""Prompt-level audit of dropping stale samples (claim C8): the share of a prompt's samples
that were trained, against the length of the prompt's reference answer and its pass rate,
one line per K.

The counting is in `rlcore/analysis/prompts.py`; `draw_prompt_audit` only lays it out. Prompts
whose every slot was cut for good have no pass rate: they are on the length axis only, and
counted in the legend.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rlcore.analysis.figures.style import plt, save
from rlcore.analysis.prompts import binned_shares, runs_prompt_rows, unanswered

LENGTH_BINS = 5  # quantile bins of the reference answer's length
# A pass rate of 4 samples takes the values 0, 1/4, ... 1 (1/3, 2/3 when a slot was cut):
# one bin around each multiple of 1/4.
PASS_EDGES = (0.0, 0.125, 0.375, 0.625, 0.875, 1.0)
PANELS: tuple[tuple[str, int | Sequence[float]], ...] = (("answer_chars", LENGTH_BINS),
                                                         ("pass_rate", PASS_EDGES))
MIN_PROMPTS = 20  # below this a bin's trained share is mostly noise, so the figure leaves it out


def draw_prompt_audit(runs_by_k: dict[int, list[Path]], png: str | Path, svg: str | Path,
                      title: str, min_prompts: int = MIN_PROMPTS) -> None:
    """Trained share of a prompt's samples against its reference answer's length (quantile
    bins) and its pass rate (bins around multiples of 1/4), one line per K, the runs of each K
    pooled."""
    fig, axes = plt.subplots(1, 2, figsize=(10.4, 3.6), sharey=True, layout="constrained")
    ks = sorted(runs_by_k)
    cmap = plt.get_cmap("viridis")
    for i, k in enumerate(ks):
        prompts = runs_prompt_rows(runs_by_k[k])
        silent = len(unanswered(prompts))
        color = cmap(0.85 * i / max(len(ks) - 1, 1))  # stop short of viridis' pale yellow
        for ax, (key, bins) in zip(axes, PANELS, strict=True):
            drawn = [b for b in binned_shares(prompts, key, bins) if b["prompts"] >= min_prompts]
            xs = [b[key] for b in drawn]
            ys = [b["trained_share"] for b in drawn]
            ax.plot(xs, ys, color=color, linewidth=1, marker="o", markersize=4,
                    label=f"K={k}: {len(prompts)} prompts, {silent} with no response")
    for ax, xlabel in zip(axes, ("length of the prompt's reference answer (characters; "
                                 "quantile bins)",
                                 "prompt's pass rate as sampled"), strict=True):
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("trained share of the prompt's samples")
    axes[1].set_xlim(-0.05, 1.05)
    if ks:
        axes[0].legend(fontsize=7, title_fontsize=7,
                       title=f"bins with < {min_prompts} prompts left out;\n"
                             "prompts with no response are left off the right panel")
    fig.suptitle(title, fontsize=10)
    save(fig, png, svg)
