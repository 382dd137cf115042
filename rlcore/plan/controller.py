"""The planner's controller: the live controller's message handling around the same
scheduling core (`rlcore/runners/asynchronous/scheduling.py`), counting instead of recording.

Every decision (acceptance, resubmission, batch formation, the trainer, admission, waits) is
the core's, and the messages are the live roles' (`messages.py`); what is left here is the
tally, and a batch for the trainer described by its size instead of its tensors.
"""

from __future__ import annotations

from typing import Any

from rlcore.algo.batching import slowest_rank_tokens
from rlcore.algo.registry import objective
from rlcore.algo.staleness import rollout_version, staleness
from rlcore.clock.work import Handle, Reward
from rlcore.plan.roles import Plan, PlanTrain
from rlcore.runners.asynchronous.messages import (
    InterruptedMsg,
    RolloutBatch,
    SampleMsg,
    Stopped,
    UpdateDone,
)
from rlcore.runners.asynchronous.scheduling import Accepted, SchedulingCore


class PlanController:
    """controller.py's message handling, fed by the run's life cycle (`runtime.py`)."""

    def __init__(self, p: Plan):
        self.p, self.cfg, self.clock = p, p.cfg, p.clock
        self.core: SchedulingCore[SampleMsg] = SchedulingCore(
            p.cfg, p.tasks, p.prompt_q, p.cfg.runtime.trainer_workers, p.clock, self)
        self.t_done: float | None = None

    @property
    def waits(self) -> dict[str, float]:
        return self.core.waits

    def pump(self) -> None:
        self.core.pump()

    def on_message(self, msg: Any) -> None:
        """controller.py's `on_message`, priced as there: a rollout batch's samples scored
        and handled, a verdict or a worker's last word handled."""
        clock, samples = self.clock, 0
        if isinstance(msg, RolloutBatch):
            for sample in msg.samples:
                clock.charge(Reward(kind=self.cfg.reward.verifier))
                self.on_sample(sample)
            for cut in msg.interrupted:
                self.on_cut(cut)
            samples = len(msg.samples) + len(msg.interrupted)
        elif isinstance(msg, UpdateDone):
            self.on_update(msg)
        elif isinstance(msg, Stopped):
            self.p.tally.tokens_sampled += msg.tokens_sampled
            self.p.tally.tokens_reprefilled += msg.tokens_reprefilled
        clock.charge(Handle(samples=samples))

    def on_sample(self, sample: SampleMsg) -> None:
        self.core.arrive(sample.slot.group_id, sample,
                         rollout_version(sample.versions, self.core.applied))

    def on_cut(self, cut: InterruptedMsg) -> None:
        if self.core.cut(cut.slot):
            self.p.tally.resubmissions += 1
        else:
            self.p.tally.dropped_interrupted += 1

    def on_update(self, msg: UpdateDone) -> None:
        batch = self.core.committed(msg.batch_id, msg.trainer, msg.applied)
        tally = self.p.tally
        if not msg.applied:
            tally.skipped_commits += 1
            tally.accepted += [staleness(batch.base_version, i.rollout_version)
                               for i in batch.items]
            return
        tally.accepted += [staleness(msg.base_version, i.rollout_version) for i in batch.items]
        tally.tokens_trained += sum(len(i.payload.response_ids) for i in batch.items)
        if self.core.done and self.t_done is None:
            self.t_done = msg.t_commit

    # --- the core's callbacks -----------------------------------------------------------
    def dropped_stale(self, payload: SampleMsg, version: int) -> None:
        self.p.tally.dropped_stale += 1

    def send(self, trainer: int, batch_id: int, base_version: int,
             items: list[Accepted[SampleMsg]]) -> None:
        lengths = [len(i.payload.prompt_ids) + len(i.payload.response_ids) for i in items]
        self.p.trainer_qs[trainer].put(PlanTrain(
            batch_id, min(i.rollout_version for i in items),
            slowest_rank_tokens(lengths, self.cfg.train.minibatches,
                                self.cfg.runtime.trainer_ranks,
                                [i.payload.slot.group_id for i in items],
                                [len(i.payload.response_ids) for i in items]),
            len(lengths) * max(lengths) if objective(self.cfg.train.objective).needs_prox
            else 0))

    def unsettled(self) -> list[int]:
        """Staleness of the accepted samples never trained, at the version they arrived at."""
        return [staleness(i.arrival_version, i.rollout_version) for i in self.core.leftover()]
