"""The planner's roles: the asynchronous run's roles with the model taken out.

A plan runs the live run's life cycle (`runtime.py::Lifecycle`: launch, drive, stop) on the
virtual clock (`rlcore/clock/virtual.py`), with the same roles, contexts and messages:
  rollout           rollout.py's `generate_until_stopped`, on `LengthPolicy` (sampler.py),
                    which draws response lengths instead of sampling tokens;
  parameter service param_service.py's `serve_commits`, on `Versions`: the weight store
                    with the version and no weights;
  trainer           trainer.py's `TrainerLoop` and `TrainerRole`, whose update is its price
                    (`PlanTrainer`);
  controller        the live scheduling core (`scheduling.py`), counting instead of
                    recording (`controller.py`).
Nothing is written but the counts a plan reports (`planner.py`). `tests/test_plan.py` checks
that a plan makes a virtual run's decisions, given its lengths.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from rlcore.clock.virtual import VirtualClock
from rlcore.clock.work import AllReduce, Prefill, Update
from rlcore.config import RunConfig
from rlcore.plan.lengths import Lengths
from rlcore.plan.sampler import LengthPolicy
from rlcore.runners.asynchronous.contexts import RolloutContext, TrainerContext
from rlcore.runners.asynchronous.messages import CommitRequest, Stopped, UpdateDone
from rlcore.runners.asynchronous.param_service import serve_commits
from rlcore.runners.asynchronous.rollout import generate_until_stopped
from rlcore.runners.asynchronous.runtime import Lifecycle, Roles
from rlcore.runners.asynchronous.trainer import TrainerRole
from rlcore.runners.asynchronous.vehicles import Virtual
from rlcore.runners.asynchronous.weight_slots import carries_digests, charge_copy
from rlcore.tasks.suites import Task

CPU = torch.device("cpu")


class Versions:
    """The weight store (`interfaces.WeightStore`) without weights: which slot is current, at
    which version, and what a copy of the weights would weigh."""

    last_digest: str | None = None  # priced (`copy_work`), never computed: nothing to check

    def __init__(self, nbytes: int, digests: bool = False):
        self.nbytes = nbytes
        self.digests = digests  # train.lora: each copy's digest is priced
        self._head = (0, 0)  # slot 0 published at version 0, as the live service starts

    def ordered(self, named: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
        return []

    def head(self) -> tuple[int, int]:
        return self._head

    def version(self) -> int:
        return self._head[1]

    def publish(self, slot: int, version: int, digest: str | None = None) -> None:
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


class Plan(Lifecycle):
    """One planned run: the live run's life cycle on the virtual clock, over a store without
    weights, with the roles' model taken out; and the tally."""

    def __init__(self, cfg: RunConfig, clock: VirtualClock, tasks: list[Task],
                 prompt_tokens: dict[str, int], lengths: Lengths, weight_bytes: int,
                 adapter_elements: int):
        store = Versions(weight_bytes, digests=carries_digests(cfg))
        super().__init__(cfg, Virtual(clock), store, {"rollout": CPU, "trainer": CPU}, cpus={})
        self.tasks = tasks
        captured = clock.profile is not None and clock.profile.prices_captured_steps
        self.policy = LengthPolicy(clock.charge, tasks, prompt_tokens, lengths,
                                   adapter_elements, captured)
        self.tally = Tally()

    def launch(self, roles: Roles | None = None) -> None:
        super().launch(roles or Roles(serve_commits, self.rollout, trainer_role))

    def rollout(self, ctx: RolloutContext) -> None:
        """rollout.py's `rollout_main` after loading: nothing to load."""
        generate_until_stopped(ctx, self.policy, [], 0)


class PlanTrainer(TrainerRole[PlanTrain]):
    """trainer.py's `Trainer` with the model taken out: an update is its price, a candidate
    a version number."""

    def __init__(self, ctx: TrainerContext):
        super().__init__(ctx, ctx.slots.version())

    def load(self) -> None:
        self.version = self.ctx.slots.read_into([])
        charge_copy(self.clock, self.ctx.slots, "read")

    def oldest(self, req: PlanTrain) -> int:
        return req.oldest

    def update(self, req: PlanTrain) -> dict[str, float]:
        if req.prefill_tokens:
            self.clock.charge(Prefill(calls=1, tokens=req.prefill_tokens))
        self.clock.charge(Update(tokens=req.tokens, frozen_base=self.cfg.train.lora is not None))
        if (ranks := self.cfg.runtime.trainer_ranks) > 1:
            self.clock.charge(AllReduce(calls=self.cfg.train.minibatches,
                                        nbytes=self.ctx.slots.nbytes, ranks=ranks))
        return {}

    def propose(self, req: PlanTrain, stats: dict[str, float], t_start: float,
                updated: bool) -> None:
        charge_copy(self.clock, self.ctx.slots, "write")
        self.ctx.commit_q.put(CommitRequest(self.ctx.index, req.batch_id, self.slot,
                                            self.version, updated, stats, t_start,
                                            self.clock.now()))

    def refuse(self, req: PlanTrain, reason: str, stats: dict[str, float],
               t_start: float) -> None:
        ctx = self.ctx
        ctx.inbox.put(UpdateDone(ctx.index, req.batch_id, False, ctx.slots.version(),
                                 self.version, reason, stats, self.clock.now(), t_start))


def trainer_role(ctx: TrainerContext) -> None:
    """trainer.py's `trainer_main` after loading: train until a None request."""
    trainer = PlanTrainer(ctx)
    ctx.start.wait()
    trainer.run()
    ctx.inbox.put(Stopped(ctx.name))
