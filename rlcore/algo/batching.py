"""Which buffered samples an update trains: whole groups, oldest first.

A group is what survived of one prompt's `rollout.group_size` samples. The `group_mean`
baseline is the mean reward of a group's members in the batch, so a batch that cut a group
would score each part against its own mean (and a one-sample remnant against itself, an
advantage of 0). A batch therefore takes whole groups from the front of the buffer while they
fit in B, once B samples are waiting: it holds between B - group_size + 1 and B samples, and
exactly B when no group lost a member. AReaL batches whole groups too (its batch counts
prompts).

An update splits its batch into `train.minibatches` parts, one optimizer step each; a
data-parallel trainer splits each part over its ranks by whole groups, balanced by response
tokens (AReaL's balanced partition), each rank at least one group.
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


def minibatch_parts(n: int, minibatches: int) -> list[list[int]]:
    """The near-equal consecutive parts an update splits a batch of `n` samples into, one
    optimizer step each (a batch of whole groups may be short of update_batch_size, and no
    sample may fall outside every part)."""
    return [list(range(m * n // minibatches, (m + 1) * n // minibatches))
            for m in range(minibatches)]


def shard_groups(group_ids: Sequence[int], tokens: Sequence[int], ranks: int
                 ) -> list[list[int]]:
    """Each rank's sample indices: whole groups (runs of equal ids), the largest first to
    the rank with the fewest tokens so far (the lowest on a tie), each rank's in batch
    order. Raises ValueError when there are fewer groups than ranks."""
    if len(group_ids) != len(tokens):
        raise ValueError("one token count per sample")
    groups: list[list[int]] = []
    for i, g in enumerate(group_ids):
        if i == 0 or g != group_ids[i - 1]:
            groups.append([])
        groups[-1].append(i)
    if len(groups) < ranks:
        raise ValueError(f"{len(groups)} groups cannot give each of {ranks} ranks one")
    load = [0] * ranks
    shards: list[list[int]] = [[] for _ in range(ranks)]
    weight = [sum(tokens[i] for i in g) for g in groups]
    # the first `ranks` groups go one to a rank, so none is left without a sample
    order = sorted(range(len(groups)), key=lambda j: (-weight[j], j))
    for n, j in enumerate(order):
        r = n if n < ranks else min(range(ranks), key=lambda q: (load[q], q))
        shards[r].extend(groups[j])
        load[r] += weight[j]
    return [sorted(s) for s in shards]


def token_share(shard: Sequence[int], tokens: Sequence[int]) -> float:
    """A rank's weight in the summed loss: its response tokens over the batch's."""
    total = sum(tokens)
    return sum(tokens[i] for i in shard) / total if total else 0.0


def slowest_rank_tokens(lengths: Sequence[int], minibatches: int, ranks: int = 1,
                        groups: Sequence[int] = (), responses: Sequence[int] = ()) -> int:
    """Rows x padded width (`lengths`: prompt + response) of the rank with the most, summed
    over an update's minibatches, each split over `ranks` as a data-parallel trainer splits
    it (by each sample's `groups` and `responses` tokens): what the update takes when its
    ranks wait for the slowest. One rank: the whole update's tokens."""
    total = 0
    for part in minibatch_parts(len(lengths), minibatches):
        if not part:
            continue
        shards = (shard_groups([groups[i] for i in part], [responses[i] for i in part], ranks)
                  if ranks > 1 else [list(range(len(part)))])
        total += max(len(s) * max(lengths[part[j]] for j in s) for s in shards)
    return total
