"""`TrainBatch`: what an update consumes, and the padding its tensors take."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class TrainBatch:
    """What an update consumes: responses, behaviour log-probs, versions and advantages."""

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    behav_logprobs: list[list[float]]
    versions: list[list[int]]
    advantages: list[float]
    # each sample's group (a prompt's samples, side by side): what a data-parallel trainer
    # keeps on one rank; None: every sample its own
    group_ids: list[int] | None = None

    def __len__(self) -> int:
        return len(self.prompt_ids)

    def select(self, idx: Sequence[int]) -> TrainBatch:
        def pick(rows: Sequence[Any]) -> list[Any]:
            return [rows[i] for i in idx]

        return TrainBatch(pick(self.prompt_ids), pick(self.response_ids),
                          pick(self.behav_logprobs), pick(self.versions), pick(self.advantages),
                          None if self.group_ids is None else pick(self.group_ids))

    def groups(self) -> list[int]:
        """Each sample's group id (its index where the batch names none)."""
        return list(range(len(self))) if self.group_ids is None else self.group_ids


def pad_right(rows: Sequence[Sequence[float]], value: float, dtype: torch.dtype,
              device: torch.device) -> torch.Tensor:
    """Stack ragged rows into [B, max_len], padding on the right."""
    width = max(len(r) for r in rows)
    return torch.tensor([list(r) + [value] * (width - len(r)) for r in rows], dtype=dtype,
                        device=device)


def padded_tokens(batch: TrainBatch) -> int:
    """Rows x width of the batch's prompt + response tensor, as a forward pass sees it."""
    return len(batch) * max(len(p) + len(r) for p, r in
                            zip(batch.prompt_ids, batch.response_ids, strict=True))
