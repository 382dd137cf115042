"""Admission: which prompts go to the rollout workers, and when.

The controller's other half. It draws prompts from the shared `PromptStream` (the same order
as the sync runner) and sends them, a group of `rollout.group_size` slots per prompt, while
the rules allow:
  * at most two batches in flight, so rollout always has the next batch queued;
  * `throttle`: AReaL's eq. 1 (`rlcore/algo/staleness.py::admission_capacity`), so rollout runs
    at most K batches ahead of training;
  * `rollout_train_ratio` (Parallel Q-Learning's beta): generation held at beta x B per
    update, unless the trainer is starving (then rollout is the slow side).
Resubmissions of interrupted slots go first and bypass both: their group holds capacity.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace

from rlcore.algo.staleness import StalenessManager
from rlcore.config import RunConfig
from rlcore.runners.asynchronous.interfaces import Queue
from rlcore.runners.asynchronous.messages import PromptSlot
from rlcore.tasks.prompts import Prompt, PromptStream
from rlcore.tasks.suites import Task


class Dispatcher:
    """Sends prompt slots; counts what is in flight. The controller reports every return."""

    def __init__(self, cfg: RunConfig, tasks: list[Task], prompt_q: Queue,
                 manager: StalenessManager):
        self.stream = PromptStream(tasks, cfg.seed)
        self.prompt_q, self.manager = prompt_q, manager
        self.batch_size = cfg.train.update_batch_size
        self.group_size = cfg.rollout.group_size
        self.throttle = cfg.staleness.staleness_control in ("throttle", "both")
        self.ratio = cfg.staleness.rollout_train_ratio
        self.resubmit: deque[PromptSlot] = deque()
        self.next_slot = 0
        self.in_flight = 0  # slots dispatched and not yet returned
        self.dispatched = 0  # slots ever dispatched (resubmissions included)

    def retry(self, slot: PromptSlot) -> None:
        """Give an interrupted slot its next attempt, at the next pump."""
        self.resubmit.append(replace(slot, attempt=slot.attempt + 1))

    def returned(self) -> None:
        """A slot came back: generated, or interrupted."""
        self.in_flight -= 1

    def pump(self, version: int, generated: int, batches_sent: int, trainer_starving: bool
             ) -> tuple[list[Prompt], str | None]:
        """Send what the rules allow as one message; returns the new prompts, and the wait
        that stopped it early (a `scheduling.waits` key) or None."""
        if self.resubmit:
            self._put(list(self.resubmit))
            self.resubmit.clear()
        target = 2 * self.batch_size  # the batch being generated and the next
        g = self.group_size
        prompts: list[Prompt] = []
        blocked = None
        while self.in_flight + g * len(prompts) < target:
            if self.throttle and self.manager.capacity(version) <= g * len(prompts):
                blocked = "rollout_throttle_s"
                break
            if self.ratio is not None and not trainer_starving and \
                    generated + self.in_flight + g * (len(prompts) + 1) \
                    > self.ratio * self.batch_size * (batches_sent + 2):
                blocked = "rollout_ratio_s"
                break
            prompts.append(self.stream.take(1)[0])
        # One message per pump: a rollout worker woken by the first of several group messages
        # would start generating a fraction of a batch, at nearly the cost of a whole one.
        if prompts:
            members = [p for p in prompts for _ in range(g)]
            slots = [PromptSlot(self.next_slot + i, p.group_id, p.task.prompt,
                                system=p.task.system)
                     for i, p in enumerate(members)]
            self.next_slot += len(slots)
            self._put(slots)
        return prompts, blocked

    def _put(self, slots: list[PromptSlot]) -> None:
        self.prompt_q.put(slots)
        self.in_flight += len(slots)
        self.dispatched += len(slots)
        self.manager.submitted(len(slots))
