"""The planner's roles: the asynchronous run's roles with the model taken out.

A plan runs the live roles on the virtual clock (`rlcore/clock/virtual.py`), over the same
contexts and messages:
  rollout           rollout.py's `generate_until_stopped`, on `LengthPolicy` (sampler.py),
                    which draws response lengths instead of sampling tokens;
  parameter service param_service.py's `serve_commits`, on `Versions`: the weight store
                    with the version and no weights;
  trainer           trainer.py's `TrainerLoop`, whose update is its price (`PlanTrainer`);
  controller        the live scheduling core (`scheduling.py`), counting instead of
                    recording (`controller.py`).
Nothing is written but the counts a plan reports (`planner.py`). `tests/test_plan.py` checks
that a plan makes a virtual run's decisions, given its lengths.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from rlcore.clock.virtual import VirtualClock, VirtualFlag, VirtualQueue
from rlcore.clock.work import Prefill, Update, Weights
from rlcore.config import RunConfig
from rlcore.plan.lengths import Lengths
from rlcore.plan.sampler import LengthPolicy
from rlcore.runners.asynchronous.contexts import (
    ParamServiceContext,
    RolloutContext,
    TrainerContext,
)
from rlcore.runners.asynchronous.interfaces import Queue
from rlcore.runners.asynchronous.messages import CommitAck, CommitRequest, Stopped, UpdateDone
from rlcore.runners.asynchronous.param_service import serve_commits
from rlcore.runners.asynchronous.rollout import generate_until_stopped
from rlcore.runners.asynchronous.trainer import TrainerLoop, receive_ack
from rlcore.tasks.suites import Task

CPU = torch.device("cpu")


class Versions:
    """The weight store (`interfaces.WeightStore`) without weights: which slot is current, at
    which version, and what a copy of the weights would weigh."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self._head = (0, 0)  # slot 0 published at version 0, as the live service starts

    def ordered(self, named: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
        return []

    def head(self) -> tuple[int, int]:
        return self._head

    def version(self) -> int:
        return self._head[1]

    def publish(self, slot: int, version: int) -> None:
        self._head = (slot, version)

    def write(self, slot: int, tensors: list[torch.Tensor]) -> None:
        """Nothing to copy."""

    def read_into(self, tensors: list[torch.Tensor]) -> int:
        return self._head[1]


@dataclass
class PlanTrain:
    """A batch for one update, as the planner's trainer needs it (controller -> trainer)."""

    batch_id: int
    oldest: int  # the oldest version of any sample in the batch
    tokens: int  # rows x padded width, summed over minibatches (`work.py::Update`)
    prefill_tokens: int  # the decoupled objective's proximal recompute (0: none)


@dataclass
class Tally:
    """What a plan counts: the numbers of summary.json that timing decides."""

    accepted: list[int] = field(default_factory=list)  # staleness of each accepted sample
    dropped_stale: int = 0
    dropped_interrupted: int = 0
    resubmissions: int = 0
    skipped_commits: int = 0
    tokens_sampled: int = 0
    tokens_trained: int = 0
    tokens_reprefilled: int = 0


class Plan:
    """One planned run: the clock, the roles' contexts over the channels they share, and the
    tally."""

    def __init__(self, cfg: RunConfig, clock: VirtualClock, tasks: list[Task],
                 prompt_tokens: dict[str, int], lengths: Lengths, weight_bytes: int):
        self.cfg, self.clock, self.tasks = cfg, clock, tasks
        self.policy = LengthPolicy(clock.charge, tasks, prompt_tokens, lengths)
        self.inbox, self.prompt_q, self.commit_q = (VirtualQueue(clock) for _ in range(3))
        n_rollout, n_trainer = cfg.runtime.rollout_workers, cfg.runtime.trainer_workers
        self.trainer_qs: list[Queue] = [VirtualQueue(clock) for _ in range(n_trainer)]
        self.ack_qs: list[Queue] = [VirtualQueue(clock) for _ in range(n_trainer)]
        self.start, self.stop = VirtualFlag(clock), VirtualFlag(clock)
        self.slots = Versions(weight_bytes)
        self.counters = [0] * (2 * n_rollout)
        self.tally = Tally()

        def common(name: str, index: int) -> dict[str, Any]:
            return dict(cfg=cfg, name=name, index=index, inbox=self.inbox, start=self.start,
                        slots=self.slots, clock=clock)

        self.service = ParamServiceContext(**common("param_service", 0),
                                           commit_q=self.commit_q, ack_qs=self.ack_qs)
        self.rollouts = [RolloutContext(**common(f"rollout{i}", i),
                                        device=CPU, prompt_q=self.prompt_q,
                                        counters=self.counters, stop=self.stop)
                         for i in range(n_rollout)]
        self.trainers = [TrainerContext(**common(f"trainer{i}", i),
                                        device=CPU, trainer_q=self.trainer_qs[i],
                                        commit_q=self.commit_q, ack_q=self.ack_qs[i],
                                        stop=self.stop)
                         for i in range(n_trainer)]

    def launch(self) -> None:
        """Start the roles in the live runtime's launch order, which the clock's tie-break
        follows."""
        clock = self.clock
        clock.start("param_service", partial(serve_commits, self.service))
        for ctx in self.rollouts:
            clock.start(ctx.name, partial(generate_until_stopped, ctx, self.policy, [], 0))
        for t in self.trainers:
            clock.start(t.name, partial(trainer_role, t))


class PlanTrainer(TrainerLoop[PlanTrain, CommitAck]):
    """trainer.py's `Trainer` with the model taken out: an update is its price, a candidate
    a version number."""

    def __init__(self, ctx: TrainerContext):
        super().__init__(ctx.cfg.staleness.staleness_k, ctx.slots.version())
        self.ctx, self.clock = ctx, ctx.clock
        self.slot = ctx.index + 1  # as the live trainer: slot 0 starts as current

    def next_request(self) -> PlanTrain | None:
        req: PlanTrain | None = self.ctx.trainer_q.get()
        return req

    def idle(self) -> bool:
        return self.ctx.trainer_q.empty()

    def published(self) -> int:
        return self.ctx.slots.version()

    def load(self) -> None:
        self.version = self.ctx.slots.read_into([])
        self.clock.charge(Weights("read", self.ctx.slots.nbytes))

    def oldest(self, req: PlanTrain) -> int:
        return req.oldest

    def started(self) -> float:
        return self.clock.now()

    def update(self, req: PlanTrain) -> dict[str, float]:
        if req.prefill_tokens:
            self.clock.charge(Prefill(calls=1, tokens=req.prefill_tokens))
        self.clock.charge(Update(tokens=req.tokens))
        return {}

    def propose(self, req: PlanTrain, stats: dict[str, float], t_start: float) -> None:
        self.clock.charge(Weights("write", self.ctx.slots.nbytes))
        self.ctx.commit_q.put(CommitRequest(self.ctx.index, req.batch_id, self.slot,
                                            self.version, True, stats, t_start,
                                            self.clock.now()))

    def refuse(self, req: PlanTrain, reason: str, stats: dict[str, float],
               t_start: float) -> None:
        ctx = self.ctx
        ctx.inbox.put(UpdateDone(ctx.index, req.batch_id, False, ctx.slots.version(),
                                 self.version, reason, stats, self.clock.now(), t_start))

    def wait_ack(self) -> CommitAck | None:
        return receive_ack(self.ctx)

    def applied(self, ack: CommitAck) -> bool:
        self.slot = ack.next_slot
        return ack.applied


def trainer_role(ctx: TrainerContext) -> None:
    """trainer.py's `trainer_main` after loading: train until a None request."""
    trainer = PlanTrainer(ctx)
    ctx.start.wait()
    trainer.run()
    ctx.inbox.put(Stopped(ctx.name))
