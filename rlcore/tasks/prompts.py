"""The training prompts: one seeded, shuffled stream, identical in every runner and in replay.

A prompt's `group_id` names its group: the `group_size` samples drawn for it share the group's
advantage baseline (`rlcore/algo/advantages.py`).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from rlcore.tasks.suites import Task


@dataclass(frozen=True)
class Prompt:
    """One dispatched prompt: a task and the id of its group of samples."""

    group_id: int
    task: Task


class PromptStream:
    """Training prompts in seeded epochs of shuffled order, identical across runners."""

    def __init__(self, tasks: Sequence[Task], seed: int):
        self._tasks = list(tasks)
        self._rng = random.Random(seed)
        self._prompts = self._epochs()

    def _epochs(self) -> Iterator[Prompt]:
        group_id = 0
        while True:
            order = list(self._tasks)
            self._rng.shuffle(order)
            for task in order:
                yield Prompt(group_id, task)
                group_id += 1

    def take(self, n: int) -> list[Prompt]:
        """The next n prompts."""
        return [next(self._prompts) for _ in range(n)]
