"""The controller's decisions with the model taken out: one core for the live controller and
the planner.

It holds what scheduling reads and nothing a model produces: the groups of a prompt's
slots until each is resolved, the buffer of accepted samples (resolved groups, FIFO), the
batches in training, which trainer takes the next batch, batch formation (whole groups,
fresh at the version the batch will train from), admission (`dispatch.py`) and the time
each side waits. The rules themselves are the pure functions of `rlcore/algo/staleness.py`
and `rlcore/algo/batching.py`.

The caller owns transport and records: the live controller (`controller.py`) hands it
scored samples and writes every decision to the run ledger; the planner
(`rlcore/plan/controller.py`) hands it drawn lengths and counts. Each keeps its own payload
on a sample (a ledger row and its tensors, or a length) and learns of drops and batches
through its `Recorder`. AReaL keeps admission and staleness in one `StalenessManager` for the
same reason: a decision written twice drifts.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from rlcore.algo.batching import take_whole_groups
from rlcore.algo.staleness import StalenessManager, accept_on_arrival, fresh_for_batch, staleness
from rlcore.clock.clock import Clock
from rlcore.config import RunConfig
from rlcore.runners.asynchronous.dispatch import Dispatcher
from rlcore.runners.asynchronous.interfaces import Queue
from rlcore.runners.asynchronous.messages import PromptSlot
from rlcore.tasks.prompts import Prompt
from rlcore.tasks.suites import Task

T = TypeVar("T")


@dataclass
class Accepted(Generic[T]):
    """An accepted sample waiting in the buffer: the caller's payload and the versions the
    rules read."""

    payload: T
    rollout_version: int
    arrival_version: int  # the version it was accepted at: its row's, if never trained


@dataclass
class Group(Generic[T]):
    """The slots of one prompt; the group enters the buffer once every slot is resolved."""

    prompt: Prompt
    unresolved: int
    accepted: list[Accepted[T]] = field(default_factory=list)


@dataclass
class InTraining(Generic[T]):
    """A batch sent to a trainer and not yet heard back from."""

    base_version: int  # planned: the version it was sent to train from
    items: list[Accepted[T]]
    sent: Any  # what the caller's `Recorder.send` returned (live: the advantages)


class Recorder(Protocol[T]):
    """What the core tells its caller: samples it drops as stale, and batches to send."""

    def dropped_stale(self, payload: T, version: int) -> None:
        """A sample is dropped as stale at `version` (on arrival, or at batch formation)."""

    def send(self, trainer: int, batch_id: int, base_version: int,
             items: list[Accepted[T]]) -> Any:
        """Send a batch to `trainer`; the return value is kept with the batch in training."""


class SchedulingCore(Generic[T]):
    """Groups, the accepted buffer, batches in training, trainer choice, batch formation,
    admission and wait accounting, for one run."""

    def __init__(self, cfg: RunConfig, tasks: list[Task], prompt_q: Queue, n_trainers: int,
                 clock: Clock, recorder: Recorder[T]):
        self.cfg, self.clock, self.recorder = cfg, clock, recorder
        self.k = cfg.staleness.staleness_k
        self.batch_size = cfg.train.update_batch_size
        self.filter_on_arrival = cfg.staleness.staleness_control in ("filter", "both")
        self.ratio = cfg.staleness.rollout_train_ratio
        self.manager = StalenessManager(self.k, self.batch_size)
        self.dispatch = Dispatcher(cfg, tasks, prompt_q, self.manager)
        self.groups: dict[int, Group[T]] = {}  # dispatched prompts, until every slot resolves
        self.ready: deque[list[Accepted[T]]] = deque()  # resolved groups, FIFO
        # A single trainer may hold one batch queued behind the one it is training on, so it
        # never waits for the controller; with several, each takes one at a time.
        self.depth = 2 if n_trainers == 1 else 1
        self.outstanding = [0] * n_trainers
        self.in_training: dict[int, InTraining[T]] = {}
        # Updates applied: the version as the controller has seen it committed. Counted from
        # the commit reports rather than read from the clock, so that it moves together with
        # `in_training`; the clock can be a commit ahead of both.
        self.applied = 0
        self.next_batch = 0
        self.generated = 0  # finished samples returned
        self.waits = {"trainer_data_s": 0.0, "trainer_ratio_s": 0.0,
                      "rollout_throttle_s": 0.0, "rollout_ratio_s": 0.0}
        self._last_pump = clock.now()
        self._blocked: set[str] = set()

    # --- state -----------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.applied >= self.cfg.train.updates

    def buffered(self) -> int:
        """Accepted samples in resolved groups, waiting for a batch."""
        return sum(len(g) for g in self.ready)

    def base_version(self) -> int:
        """The version the next dispatched batch will be trained from: the current one plus
        every update still in flight (an upper bound if one of them is skipped)."""
        return self.applied + len(self.in_training)

    # --- what comes back ---------------------------------------------------------------
    def arrive(self, group_id: int, payload: T, rollout_version: int) -> bool:
        """A finished sample returns: accept it into its group (True), or drop it as stale."""
        self.dispatch.returned()
        self.generated += 1
        group = self.groups[group_id]
        accepted = accept_on_arrival(staleness(self.applied, rollout_version), self.k,
                                     self.filter_on_arrival)
        self.manager.returned(accepted=accepted)
        if accepted:
            group.accepted.append(Accepted(payload, rollout_version, self.applied))
        else:
            self.recorder.dropped_stale(payload, self.applied)
        self._resolve(group_id)
        return accepted

    def cut(self, slot: PromptSlot) -> bool:
        """An interrupted attempt returns: resubmit it (True) while it has retries left, else
        it is dropped and its slot resolved."""
        self.dispatch.returned()
        self.manager.returned(accepted=False)
        if slot.attempt < self.cfg.staleness.max_retries:
            self.dispatch.retry(slot)
            return True
        self._resolve(slot.group_id)
        return False

    def committed(self, batch_id: int, trainer: int, applied: bool) -> InTraining[T]:
        """A trainer's batch ends, applied or not; returns the batch as it was sent."""
        batch = self.in_training.pop(batch_id)
        self.outstanding[trainer] -= 1
        if applied:
            self.manager.trained(len(batch.items))
            self.applied += 1
        else:
            self.manager.released(len(batch.items))
        return batch

    def _resolve(self, group_id: int) -> None:
        group = self.groups[group_id]
        group.unresolved -= 1
        if group.unresolved == 0:
            del self.groups[group_id]
            if group.accepted:
                self.ready.append(group.accepted)

    # --- what goes out -----------------------------------------------------------------
    def pump(self) -> None:
        """Dispatch what the rules allow; account the time spent blocked since the last call."""
        now = self.clock.now()
        for reason in self._blocked:
            self.waits[reason] += now - self._last_pump
        self._last_pump = now
        self._blocked = set()
        if self.done:
            return
        self._dispatch_prompts()
        self._dispatch_batches()

    def _dispatch_prompts(self) -> None:
        starving = not self.in_training and self.buffered() < self.batch_size
        prompts, blocked = self.dispatch.pump(self.applied, self.generated, self.next_batch,
                                              trainer_starving=starving)
        for prompt in prompts:
            self.groups[prompt.group_id] = Group(prompt, unresolved=self.cfg.rollout.group_size)
        if blocked is not None:
            self._blocked.add(blocked)

    def _dispatch_batches(self) -> None:
        while self.base_version() < self.cfg.train.updates:
            trainer = min(range(len(self.outstanding)), key=self.outstanding.__getitem__)
            if self.outstanding[trainer] >= self.depth:
                return
            if self.ratio is not None and not self._rollout_stalled() and \
                    self.generated < self.ratio * self.batch_size * (self.next_batch + 1):
                self._blocked.add("trainer_ratio_s")
                return
            batch = self._take_batch(self.base_version())
            if batch is None:
                if self.outstanding[trainer] == 0:  # only an idle trainer is waiting
                    self._blocked.add("trainer_data_s")
                return
            self._send(trainer, batch)

    def _rollout_stalled(self) -> bool:
        """Nothing is being generated and no commit is coming that could let more be: the
        ratio must not hold the trainer back then, or neither side would ever move again (the
        throttle can keep rollout under the ratio's count; so can groups larger than
        ratio x B). The trainer-side twin of the rollout's `trainer_starving`."""
        return self.dispatch.in_flight == 0 and not self.in_training

    def _take_batch(self, version: int) -> list[Accepted[T]] | None:
        """Fresh samples from the front of the buffer, whole groups only
        (`batching.py::take_whole_groups`): B of them unless groups lost members."""
        for group in self.ready:  # drop what went stale while waiting
            fresh = []
            for item in group:
                if fresh_for_batch(version, item.rollout_version, self.k):
                    fresh.append(item)
                else:
                    self.manager.released(1)
                    self.recorder.dropped_stale(item.payload, version)
            group[:] = fresh
        taken = take_whole_groups([g for g in self.ready if g], self.batch_size)
        if taken is None:
            return None
        groups, rest = taken
        self.ready = deque(rest)
        return [item for group in groups for item in group]

    def _send(self, trainer: int, items: list[Accepted[T]]) -> None:
        version = self.base_version()
        self.outstanding[trainer] += 1
        batch_id = self.next_batch
        self.next_batch += 1
        sent = self.recorder.send(trainer, batch_id, version, items)
        self.in_training[batch_id] = InTraining(version, items, sent)

    def leftover(self) -> list[Accepted[T]]:
        """At the end: the accepted samples never trained (buffered, or in an unresolved
        group); the buffer is emptied."""
        left = [i for g in self.ready for i in g] \
            + [i for g in self.groups.values() for i in g.accepted]
        self.ready.clear()
        return left
