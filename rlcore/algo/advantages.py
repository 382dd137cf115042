"""Advantages: a sample's reward minus a baseline (the paper's REINFORCE-style estimator).

With `group_mean` the baseline is the mean reward of the samples of the same prompt that are
trained in the same update; a batch therefore holds whole groups (docs/implementation.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def compute_advantages(rewards: Sequence[float], group_ids: Sequence[str], baseline: str,
                       normalize: bool) -> list[float]:
    """Reward minus a baseline: the batch mean, the mean of samples sharing a prompt, or none.

    Plain Python: it runs on the controller's critical path, where tensor overhead dominates.
    """
    r = [float(x) for x in rewards]
    if baseline == "batch_mean":
        mean = sum(r) / len(r)
        adv = [x - mean for x in r]
    elif baseline == "group_mean":
        sums: dict[str, list[float]] = {}
        for g, x in zip(group_ids, r, strict=True):
            acc = sums.setdefault(g, [0.0, 0.0])
            acc[0] += x
            acc[1] += 1
        adv = [x - sums[g][0] / sums[g][1] for g, x in zip(group_ids, r, strict=True)]
    else:
        adv = r
    if normalize and len(adv) > 1:
        mean = sum(adv) / len(adv)
        std = math.sqrt(sum((a - mean) ** 2 for a in adv) / (len(adv) - 1))
        adv = [a / (std + 1e-6) for a in adv]
    return adv
