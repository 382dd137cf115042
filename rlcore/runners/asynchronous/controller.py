"""The controller: rewards samples, records every decision, and feeds the scheduling core.

It is transport-agnostic: the AReaL-style runtime feeds it messages from worker processes,
the threaded baseline from threads; the rules are the same for both (paper §4.2). The
decisions themselves (the filter on arrival, the check at batch formation, admission,
batch formation, the trainer each batch goes to, `rollout_train_ratio`'s waits) are made by
`scheduling.py::SchedulingCore`, which the planner calls too. What is the controller's alone:
scoring samples (`rlcore/tasks/reward.py`), the run ledger (`rlcore/record/ledger.py`), the
advantages a batch is trained with, and the queue-depth trace.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from rlcore.algo.staleness import rollout_version
from rlcore.clock.work import Handle
from rlcore.config import RunConfig
from rlcore.policy.optim_steps import skipped_steps
from rlcore.policy.sampler import Generation
from rlcore.record.ledger import RunLedger
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
from rlcore.runners.asynchronous.scheduling import Accepted, SchedulingCore
from rlcore.runners.common import Progress, train_batch
from rlcore.tasks.reward import RewardPool
from rlcore.tasks.suites import Task


@dataclass
class Pending:
    """A sample the controller has recorded and the scheduling core decides on (its ledger
    row is still open while it waits in the buffer)."""

    sample_id: int
    group_id: int
    reward: float
    gen: Generation


class Controller:
    """Message handlers and the dispatch pump around the scheduling core; every sample and
    update it decides goes to the ledger."""

    def __init__(self, cfg: RunConfig, tasks: list[Task], ledger: RunLedger, channels: Channels,
                 n_trainers: int):
        self.cfg, self.ledger, self.ch, self.clock = cfg, ledger, channels, ledger.clock
        self.core: SchedulingCore[Pending] = SchedulingCore(
            cfg, tasks, channels.prompt_q, n_trainers, self.clock, self)
        self.received = 0  # rollout messages processed
        self.progress = Progress(cfg)
        self.rewards = RewardPool(cfg.reward, done=self._scored_elsewhere, clock=self.clock)
        self.scored: deque[tuple[SampleMsg, dict[str, Any]]] = deque()
        self.t_done: float | None = None
        self._last_depths = 0.0

    @property
    def waits(self) -> dict[str, float]:
        """Seconds each side spent blocked, by `scheduling.waits` key."""
        return self.core.waits

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
                             samples=f["samples"], work=f["work"])
        else:
            self.ledger.event(msg.type, t=on_clock(msg.t), **msg.fields)

    def on_sample(self, msg: SampleMsg) -> None:
        """Score a sample: answer tasks at once, code tasks in the reward pool's threads
        (until then the sample still counts as in flight)."""
        task = self.core.groups[msg.slot.group_id].prompt.task
        result = self.rewards.submit(msg, msg.text, task)
        if result is not None:
            self.on_scored(msg, result)

    def _scored_elsewhere(self, msg: SampleMsg, result: dict[str, Any]) -> None:
        """Called by a reward-pool thread: queue the result and wake the controller's loop."""
        self.scored.append((msg, result))
        self.ch.inbox.put(RewardsReady())

    def on_scored(self, msg: SampleMsg, result: dict[str, Any]) -> None:
        """Record a scored sample's row, then let the core accept it or drop it as stale."""
        prompt = self.core.groups[msg.slot.group_id].prompt
        gen = Generation(msg.prompt_ids, msg.response_ids, msg.logprobs, msg.versions,
                         msg.finished)
        version = self.core.applied
        sample_id = self.ledger.arrive(
            prompt, gen, {"response": msg.text, **result}, current_version=version,
            slot=msg.slot.slot_id, attempt=msg.slot.attempt, worker=msg.worker,
            t_emit=self.ledger.on_clock(msg.t_emit))
        self.rewards.admit(sample_id, prompt, result)
        pending = Pending(sample_id, prompt.group_id, result["reward"], gen)
        self.core.arrive(prompt.group_id, pending, rollout_version(gen.versions, version))

    def on_interrupted(self, msg: InterruptedMsg) -> None:
        """Record a cut attempt; the core resubmits it or drops it as interrupted."""
        slot = msg.slot
        prompt = self.core.groups[slot.group_id].prompt
        retry = self.core.cut(slot)
        self.ledger.interrupted_attempt(worker=msg.worker, slot=slot.slot_id,
                                        group_id=slot.group_id, attempt=slot.attempt,
                                        tokens=msg.tokens, old_version=msg.old_version,
                                        new_version=msg.new_version, resubmitted=retry,
                                        t=self.ledger.on_clock(msg.t))
        if not retry:
            self.ledger.drop_interrupted(prompt, slot=slot.slot_id, attempt=slot.attempt,
                                         tokens=msg.tokens, old_version=msg.old_version,
                                         new_version=msg.new_version, worker=msg.worker,
                                         t_emit=self.ledger.on_clock(msg.t))

    def on_update(self, msg: UpdateDone) -> None:
        batch = self.core.committed(msg.batch_id, msg.trainer, msg.applied)
        items = [i.payload for i in batch.items]
        self._record_commit(msg, len(items))
        self.ledger.trainer_steps(msg.ops)
        self.ledger.count_skipped_steps(skipped_steps(msg.stats))
        outcome = "applied" if msg.applied else \
            "skipped" if msg.commit_s is not None else "refused"
        self.ledger.commit(batch_id=msg.batch_id, trainer=msg.trainer,
                           base_version=msg.base_version,
                           sample_ids=[i.sample_id for i in items], outcome=outcome,
                           version=msg.version, reason=msg.reason)
        if not msg.applied:
            self.ledger.event("update_skipped", batch_id=msg.batch_id, trainer=msg.trainer,
                              reason=msg.reason)
            for item in items:  # accepted, never trained
                self.ledger.settle(item.sample_id, "accepted",
                                   current_version=batch.base_version)
            return
        # Settled against the base the update actually used: exact even when several
        # trainers raced past the plan.
        for item, advantage in zip(items, batch.sent, strict=True):
            self.ledger.settle(item.sample_id, "accepted", current_version=msg.base_version,
                               batch_id=msg.batch_id, advantage=advantage)
        t = self.ledger.on_clock(msg.t_commit)
        assert msg.commit_s is not None, "an applied update was proposed"
        stats = {**msg.stats, "time/commit_s": msg.commit_s}
        row = self.ledger.record_update(msg.version, msg.batch_id,
                                        [i.sample_id for i in items], stats, t_commit=t)
        self.progress(self.core.applied, row["pass_rate"], self.ledger.tokens["trained"], t)
        if self.core.done and self.t_done is None:
            self.t_done = msg.t_commit

    def _record_commit(self, msg: UpdateDone, samples: int) -> None:
        """The events of an update attempt: the trainer's busy span, and the parameter
        service's decision when it made one (`commit_s` is None for a trainer's refusal)."""
        on_clock = self.ledger.on_clock
        self.ledger.span("trainer", f"trainer{msg.trainer}", on_clock(msg.t_start),
                         on_clock(msg.t_commit), samples=samples, work=msg.work)
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

    # --- the core's callbacks -----------------------------------------------------------
    def dropped_stale(self, payload: Pending, version: int) -> None:
        self.ledger.settle(payload.sample_id, "dropped_stale", current_version=version)

    def send(self, trainer: int, batch_id: int, base_version: int,
             items: list[Accepted[Pending]]) -> list[float]:
        batch = [i.payload for i in items]
        tensors = train_batch([i.reward for i in batch], [i.group_id for i in batch],
                              [i.gen for i in batch], self.cfg)
        self.ch.trainer_qs[trainer].put(TrainRequest(batch_id, base_version, tensors))
        return tensors.advantages

    # --- dispatch ----------------------------------------------------------------------
    def pump(self) -> None:
        """Dispatch what the rules allow; trace the queues' depths every 25 ms."""
        now = self.clock.now()
        self.core.pump()
        self.ledger.busy("controller", self.clock.now() - now)
        if now - self._last_depths >= 0.025:
            self._last_depths = now
            counters = [self.ch.counters[i] for i in range(len(self.ch.counters))]
            taken, sent = sum(counters[0::2]), sum(counters[1::2])
            d = self.core.dispatch
            self.ledger.event("queues", prompt_queue=d.dispatched - taken,
                              sample_queue=sent - self.received,
                              generating=taken - (d.dispatched - d.in_flight),
                              ready_buffer=self.core.buffered(),
                              trainer_queue=len(self.core.in_training),
                              version=self.core.applied)

    def flush_buffer(self) -> None:
        """At the end: accepted samples never trained are recorded as such."""
        self.rewards.close()  # lets the evaluations under way finish (each within its timeout)
        while self.scored:
            self.on_scored(*self.scored.popleft())
        for item in self.core.leftover():
            self.ledger.settle(item.payload.sample_id, "accepted",
                               current_version=item.arrival_version)
