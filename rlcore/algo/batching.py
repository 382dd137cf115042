"""Which buffered samples an update trains: whole groups, oldest first.

A group is what survived of one prompt's `rollout.group_size` samples. The `group_mean`
baseline is the mean reward of a group's members in the batch, so a batch that cut a group
would score each part against its own mean (and a one-sample remnant against itself, an
advantage of 0). A batch therefore takes whole groups from the front of the buffer while they
fit in B, once B samples are waiting: it holds between B - group_size + 1 and B samples, and
exactly B when no group lost a member. AReaL batches whole groups too (its batch counts
prompts).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

G = TypeVar("G", bound=Sequence[Any])


def take_whole_groups(groups: Sequence[G], batch_size: int) -> tuple[list[G], list[G]] | None:
    """Split a FIFO of non-empty groups into the next batch's groups and those left behind
    it; None while fewer than `batch_size` samples wait. No group may exceed `batch_size`."""
    if sum(len(g) for g in groups) < batch_size:
        return None
    taken, size = 0, 0
    while taken < len(groups) and size + len(groups[taken]) <= batch_size:
        size += len(groups[taken])
        taken += 1
    if taken == 0:
        raise ValueError(f"a group of {len(groups[0])} samples cannot fit a batch of "
                         f"{batch_size}")
    return list(groups[:taken]), list(groups[taken:])
