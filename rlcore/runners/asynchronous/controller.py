"""The controller: rewards samples, applies the staleness rules, forms batches, hears commits.

It is transport-agnostic: the AReaL-style runtime feeds it messages from worker processes,
the threaded baseline from threads; the rules are the same for both (paper §4.2). They are
pure functions of `rlcore/algo/staleness.py`: the filter on arrival (`filter`, the paper's
Listing 1) and the check at batch formation (always); admission (`throttle`, AReaL eq. 1) is
applied by its `Dispatcher` (`dispatch.py`). `rollout_train_ratio` (Parallel Q-Learning's
beta) holds generated samples per update at a fixed ratio by making the faster side wait.
Every decision is recorded through the run ledger (`rlcore/record/ledger.py`); the controller keeps
only what it schedules with.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from rlcore.algo.batching import take_whole_groups
from rlcore.algo.staleness import (
    StalenessManager,
    accept_on_arrival,
    fresh_for_batch,
    rollout_version,
    staleness,
)
from rlcore.clock.work import Handle
from rlcore.config import RunConfig
from rlcore.policy.sampler import Generation
from rlcore.record.ledger import RunLedger
from rlcore.runners.asynchronous.dispatch import Dispatcher
from rlcore.runners.asynchronous.interfaces import Channels
from rlcore.runners.asynchronous.messages import (
    Event,
    InterruptedMsg,
    RewardsReady,
    RolloutBatch,
    SampleMsg,
    TrainRequest,
    UpdateDone,
)
from rlcore.runners.common import Progress, train_batch
from rlcore.tasks.prompts import Prompt
from rlcore.tasks.reward import RewardPool
from rlcore.tasks.suites import Task


@dataclass
class Pending:
    """An accepted sample waiting in the replay buffer (its ledger row is still open)."""

    sample_id: int
    group_id: int
    reward: float
    gen: Generation
    rollout_version: int
    arrival_version: int  # the version it was accepted at: its row's, if never trained


@dataclass
class Group:
    """The samples of one prompt; it enters the replay buffer once every slot is resolved."""

    prompt: Prompt
    unresolved: int
    accepted: list[Pending] = field(default_factory=list)


class Controller:
    """Message handlers and the dispatch pump; every sample and update it decides goes to
    the ledger."""

    def __init__(self, cfg: RunConfig, tasks: list[Task], ledger: RunLedger, channels: Channels,
                 n_trainers: int):
        self.cfg, self.ledger, self.ch, self.clock = cfg, ledger, channels, ledger.clock
        self.k = cfg.staleness.staleness_k
        self.batch_size = cfg.train.update_batch_size
        self.filter_on_arrival = cfg.staleness.staleness_control in ("filter", "both")
        self.ratio = cfg.staleness.rollout_train_ratio
        self.manager = StalenessManager(self.k, self.batch_size)
        self.dispatch = Dispatcher(cfg, tasks, channels.prompt_q, self.manager)
        self.groups: dict[int, Group] = {}  # dispatched prompts, until every slot is resolved
        self.ready: deque[list[Pending]] = deque()  # resolved groups, FIFO
        # A single trainer may hold one batch queued behind the one it is training on, so it
        # never waits for the controller; with several, each takes one at a time.
        self.depth = 2 if n_trainers == 1 else 1
        self.outstanding = [0] * n_trainers
        # batch: (planned base, samples, the advantage each is trained with)
        self.in_training: dict[int, tuple[int, list[Pending], list[float]]] = {}
        self.applied = 0  # updates applied: the version as the controller has seen it
        self.next_batch = 0
        self.received = 0  # rollout messages processed
        self.generated = 0  # finished samples returned
        self.waits = {"trainer_data_s": 0.0, "trainer_ratio_s": 0.0,
                      "rollout_throttle_s": 0.0, "rollout_ratio_s": 0.0}
        self.t_done: float | None = None
        self.progress = Progress(cfg)
        self.rewards = RewardPool(cfg.reward, done=self._scored_elsewhere, clock=self.clock)
        self.scored: deque[tuple[SampleMsg, dict[str, Any]]] = deque()
        self._last_pump = self.clock.now()
        self._blocked: set[str] = set()
        self._last_depths = 0.0

    # --- state -----------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.applied >= self.cfg.train.updates

    def version(self) -> int:
        """The policy version as the controller has seen it committed.

        Counted from the commit reports rather than read from the clock, so that it moves
        together with `in_training`; the clock can be a commit ahead of both.
        """
        return self.applied

    def buffered(self) -> int:
        return sum(len(g) for g in self.ready)

    # --- incoming ----------------------------------------------------------------------
    def on_message(self, msg: Any) -> None:
        t0 = self.clock.now()
        if isinstance(msg, RolloutBatch):
            self.received += 1
            if msg.generation is not None:
                self.ledger.generation(msg.generation)
            for e in msg.events:
                self.on_event(e)
            for sample in msg.samples:
                self.on_sample(sample)
            for cut in msg.interrupted:
                self.on_interrupted(cut)
        elif isinstance(msg, RewardsReady):
            while self.scored:
                self.on_scored(*self.scored.popleft())
        elif isinstance(msg, UpdateDone):
            self.on_update(msg)
        elif isinstance(msg, Event):
            self.on_event(msg)
        samples = len(msg.samples) + len(msg.interrupted) if isinstance(msg, RolloutBatch) else 0
        self.clock.charge(Handle(samples=samples))
        self.ledger.busy("controller", self.clock.now() - t0)

    def on_event(self, msg: Event) -> None:
        """A worker's event; its absolute times go on the measured clock."""
        on_clock = self.ledger.on_clock
        if msg.type == "span":
            f = msg.fields
            self.ledger.span(f["role"], f["worker"], on_clock(f["start"]), on_clock(f["end"]),
                             samples=f["samples"])
        else:
            self.ledger.event(msg.type, t=on_clock(msg.t), **msg.fields)

    def on_sample(self, msg: SampleMsg) -> None:
        """Score a sample: answer tasks at once, code tasks in the reward pool's threads
        (until then the sample still counts as in flight)."""
        result = self.rewards.submit(msg, msg.text, self.groups[msg.slot.group_id].prompt.task)
        if result is not None:
            self.on_scored(msg, result)

    def _scored_elsewhere(self, msg: SampleMsg, result: dict[str, Any]) -> None:
        """Called by a reward-pool thread: queue the result and wake the controller's loop."""
        self.scored.append((msg, result))
        self.ch.inbox.put(RewardsReady())

    def on_scored(self, msg: SampleMsg, result: dict[str, Any]) -> None:
        self.dispatch.returned()
        self.generated += 1
        group = self.groups[msg.slot.group_id]
        gen = Generation(msg.prompt_ids, msg.response_ids, msg.logprobs, msg.versions,
                         msg.finished)
        version = self.version()
        sample_id = self.ledger.arrive(
            group.prompt, gen, {"response": msg.text, **result}, current_version=version,
            slot=msg.slot.slot_id, attempt=msg.slot.attempt, worker=msg.worker,
            t_emit=self.ledger.on_clock(msg.t_emit))
        self.rewards.admit(sample_id, group.prompt, result)
        v_rollout = rollout_version(gen.versions, version)
        accepted = accept_on_arrival(staleness(version, v_rollout), self.k,
                                     self.filter_on_arrival)
        self.manager.returned(accepted=accepted)
        if accepted:
            group.accepted.append(Pending(sample_id, group.prompt.group_id, result["reward"],
                                          gen, v_rollout, version))
        else:
            self.ledger.settle(sample_id, "dropped_stale", current_version=version)
        self._resolve(group)

    def on_interrupted(self, msg: InterruptedMsg) -> None:
        self.dispatch.returned()
        self.manager.returned(accepted=False)
        slot = msg.slot
        retry = slot.attempt < self.cfg.staleness.max_retries
        self.ledger.interrupted_attempt(worker=msg.worker, slot=slot.slot_id,
                                        group_id=slot.group_id, attempt=slot.attempt,
                                        tokens=msg.tokens, old_version=msg.old_version,
                                        new_version=msg.new_version, resubmitted=retry,
                                        t=self.ledger.on_clock(msg.t))
        if retry:
            self.dispatch.retry(slot)
            return
        group = self.groups[slot.group_id]
        self.ledger.drop_interrupted(group.prompt, slot=slot.slot_id, attempt=slot.attempt,
                                     tokens=msg.tokens,
                                     old_version=msg.old_version, new_version=msg.new_version,
                                     worker=msg.worker, t_emit=self.ledger.on_clock(msg.t))
        self._resolve(group)

    def on_update(self, msg: UpdateDone) -> None:
        planned_base, items, advantages = self.in_training.pop(msg.batch_id)
        self.outstanding[msg.trainer] -= 1
        self._record_commit(msg, len(items))
        self.ledger.trainer_steps(msg.ops)
        outcome = "applied" if msg.applied else \
            "skipped" if msg.commit_s is not None else "refused"
        self.ledger.commit(batch_id=msg.batch_id, trainer=msg.trainer,
                           base_version=msg.base_version,
                           sample_ids=[i.sample_id for i in items], outcome=outcome,
                           version=msg.version, reason=msg.reason)
        if not msg.applied:
            self.manager.released(len(items))
            self.ledger.event("update_skipped", batch_id=msg.batch_id, trainer=msg.trainer,
                              reason=msg.reason)
            for item in items:  # accepted, never trained
                self.ledger.settle(item.sample_id, "accepted", current_version=planned_base)
            return
        # Settled against the base the update actually used: exact even when several
        # trainers raced past the plan.
        for item, advantage in zip(items, advantages, strict=True):
            self.ledger.settle(item.sample_id, "accepted", current_version=msg.base_version,
                               batch_id=msg.batch_id, advantage=advantage)
        self.manager.trained(len(items))
        t = self.ledger.on_clock(msg.t_commit)
        assert msg.commit_s is not None, "an applied update was proposed"
        stats = {**msg.stats, "time/commit_s": msg.commit_s}
        row = self.ledger.record_update(msg.version, msg.batch_id,
                                        [i.sample_id for i in items], stats, t_commit=t)
        self.applied += 1
        self.progress(self.applied, row["pass_rate"], self.ledger.tokens["trained"], t)
        if self.done and self.t_done is None:
            self.t_done = msg.t_commit

    def _record_commit(self, msg: UpdateDone, samples: int) -> None:
        """The events of an update attempt: the trainer's busy span, and the parameter
        service's decision when it made one (`commit_s` is None for a trainer's refusal)."""
        on_clock = self.ledger.on_clock
        self.ledger.span("trainer", f"trainer{msg.trainer}", on_clock(msg.t_start),
                         on_clock(msg.t_commit), samples=samples)
        if msg.commit_s is None:
            return
        t = on_clock(msg.t_commit)
        if msg.applied:
            self.ledger.event("version_change", t=t, old_version=msg.version - 1,
                              new_version=msg.version, batch_id=msg.batch_id,
                              trainer=msg.trainer)
        else:
            self.ledger.event("commit_skipped", t=t, version=msg.version,
                              batch_id=msg.batch_id, trainer=msg.trainer, reason=msg.reason)

    def _resolve(self, group: Group) -> None:
        group.unresolved -= 1
        if group.unresolved == 0:
            del self.groups[group.prompt.group_id]
            if group.accepted:
                self.ready.append(group.accepted)

    # --- dispatch ----------------------------------------------------------------------
    def pump(self) -> None:
        """Dispatch what the rules allow; account the time spent blocked since the last call."""
        now = self.clock.now()
        for reason in self._blocked:
            self.waits[reason] += now - self._last_pump
        self._last_pump = now
        self._blocked = set()
        if not self.done:
            self._dispatch_prompts()
            self._dispatch_batches()
        self.ledger.busy("controller", self.clock.now() - now)
        if now - self._last_depths >= 0.025:
            self._last_depths = now
            counters = [self.ch.counters[i] for i in range(len(self.ch.counters))]
            taken, sent = sum(counters[0::2]), sum(counters[1::2])
            d = self.dispatch
            self.ledger.event("queues", prompt_queue=d.dispatched - taken,
                              sample_queue=sent - self.received,
                              generating=taken - (d.dispatched - d.in_flight),
                              replay_buffer=self.buffered(),
                              trainer_queue=len(self.in_training), version=self.version())

    def _dispatch_prompts(self) -> None:
        starving = not self.in_training and self.buffered() < self.batch_size
        prompts, blocked = self.dispatch.pump(self.version(), self.generated, self.next_batch,
                                              trainer_starving=starving)
        for prompt in prompts:
            self.groups[prompt.group_id] = Group(prompt, unresolved=self.cfg.rollout.group_size)
        if blocked is not None:
            self._blocked.add(blocked)

    def base_version(self) -> int:
        """The version the next dispatched batch will be trained from: the current one plus
        every update still in flight (an upper bound if one of them is skipped)."""
        return self.version() + len(self.in_training)

    def _dispatch_batches(self) -> None:
        while self.applied + len(self.in_training) < self.cfg.train.updates:
            trainer = min(range(len(self.outstanding)), key=self.outstanding.__getitem__)
            if self.outstanding[trainer] >= self.depth:
                return
            if self.ratio is not None and \
                    self.generated < self.ratio * self.batch_size * (self.next_batch + 1):
                self._blocked.add("trainer_ratio_s")
                return
            batch = self._take_batch(self.base_version())
            if batch is None:
                if self.outstanding[trainer] == 0:  # only an idle trainer is waiting
                    self._blocked.add("trainer_data_s")
                return
            self._send_batch(trainer, batch)

    def _take_batch(self, version: int) -> list[Pending] | None:
        """Fresh samples from the front of the buffer, whole groups only
        (`batching.py::take_whole_groups`): B of them unless groups lost members."""
        for group in self.ready:  # drop what went stale while waiting
            fresh = []
            for item in group:
                if fresh_for_batch(version, item.rollout_version, self.k):
                    fresh.append(item)
                else:
                    self.manager.released(1)
                    self.ledger.settle(item.sample_id, "dropped_stale", current_version=version)
            group[:] = fresh
        taken = take_whole_groups([g for g in self.ready if g], self.batch_size)
        if taken is None:
            return None
        groups, rest = taken
        self.ready = deque(rest)
        return [item for group in groups for item in group]

    def _send_batch(self, trainer: int, batch: list[Pending]) -> None:
        version = self.base_version()
        self.outstanding[trainer] += 1
        batch_id = self.next_batch
        self.next_batch += 1
        tensors = train_batch([i.reward for i in batch], [i.group_id for i in batch],
                              [i.gen for i in batch], self.cfg)
        self.in_training[batch_id] = (version, batch, tensors.advantages)
        self.ch.trainer_qs[trainer].put(TrainRequest(batch_id, version, tensors))

    def flush_buffer(self) -> None:
        """At the end: accepted samples never trained are recorded as such."""
        self.rewards.close()  # lets the evaluations under way finish (each within its timeout)
        while self.scored:
            self.on_scored(*self.scored.popleft())
        for group in list(self.ready) + [g.accepted for g in self.groups.values()]:
            for item in group:
                self.ledger.settle(item.sample_id, "accepted",
                                   current_version=item.arrival_version)
        self.ready.clear()
