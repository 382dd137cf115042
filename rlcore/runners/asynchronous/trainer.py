"""The trainer worker: consumes batches, computes updates, proposes them for commit.

It never mutates the global state (paper §4.3): it writes its candidate into its own staging
slot and asks the parameter service to commit it. If the service skips the commit (another
trainer moved the clock first, or the update applied no optimizer step because the fp16 loss
scaler skipped every one: `commit_verdict`), the trainer reloads the current state and its
candidate is discarded.

The commit round trip is pipelined: when the next batch is already queued, the trainer starts
computing it from its own candidate (which the service will almost always apply) and collects
the verdict before writing the next candidate. If the verdict was a skip, the update computed
on the rejected candidate is discarded too and reported as skipped. A candidate the service
is sure to skip (its update applied no step) is not computed on: its verdict is taken at
once. The controller hears of a commit from the parameter service at once, not from the
trainer one update later.

For the schedule, the trainer numbers its own steps (a `load` of the published state, an
`update` of a batch) and sends them with its next message: together with the verdicts they
say which weights and which optimizer state every update started from, even when a
candidate was rejected.
"""

from __future__ import annotations

import queue
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Generic, TypeVar

import torch

from rlcore.policy.data_parallel import RankGroup
from rlcore.policy.device import peak_gpu_bytes
from rlcore.policy.digest import state_digest
from rlcore.policy.hf_policy import HFPolicy
from rlcore.policy.optim_steps import commit_verdict
from rlcore.record.schedule import TrainerOp
from rlcore.runners.asynchronous.contexts import RankContext, Ranks, TrainerContext
from rlcore.runners.asynchronous.messages import (
    CommitAck,
    CommitRequest,
    Ready,
    Stopped,
    TrainRequest,
    UpdateDone,
)
from rlcore.runners.asynchronous.weight_slots import charge_copy, check_arrival

R = TypeVar("R")  # a batch to train
A = TypeVar("A")  # the parameter service's verdict


class TrainerLoop(ABC, Generic[R, A]):
    """A trainer's decisions, written once for the live trainer and the planner's: when to
    load the published state, when to refuse a batch, and the commit round trip pipelined
    with the next update. What loading, updating and proposing do is the subclass's."""

    def __init__(self, k: int, version: int):
        self.k = k  # staleness.staleness_k
        self.version = version  # the version this trainer's weights hold
        self.pending = False  # a commit was sent and its verdict not read yet

    # --- what a subclass does -------------------------------------------------------------
    @abstractmethod
    def next_request(self) -> R | None:
        """The next batch (None: stop)."""

    @abstractmethod
    def idle(self) -> bool:
        """No batch is queued to overlap the commit round trip with."""

    @abstractmethod
    def published(self) -> int:
        """The global version."""

    @abstractmethod
    def load(self) -> None:
        """Load the published state (dropping this trainer's own candidate); sets version."""

    @abstractmethod
    def oldest(self, req: R) -> int:
        """The oldest policy version of any token in the batch."""

    @abstractmethod
    def started(self) -> float:
        """The time a batch's handling starts, for its report."""

    @abstractmethod
    def update(self, req: R) -> dict[str, float]:
        """Compute the update of the batch from `version`; returns its statistics."""

    @abstractmethod
    def propose(self, req: R, stats: dict[str, float], t_start: float, updated: bool) -> None:
        """Write the candidate and ask the parameter service to commit it (`updated`: its
        update applied an optimizer step)."""

    @abstractmethod
    def refuse(self, req: R, reason: str, stats: dict[str, float], t_start: float) -> None:
        """Report an update this trainer will not propose to the parameter service."""

    @abstractmethod
    def wait_ack(self) -> A | None:
        """The service's verdict on the pending commit; None if none came (teardown)."""

    @abstractmethod
    def applied(self, ack: A) -> bool:
        """Whether the verdict applied the commit (and what else it says is taken)."""

    # --- the decisions --------------------------------------------------------------------
    def run(self) -> None:
        while True:
            # Nothing queued to overlap the round trip with: take the verdict now.
            if self.pending and self.idle() and self.settle() is None:
                break  # no verdict: the run is being torn down
            req = self.next_request()
            if req is None:
                if self.pending:
                    self.settle()
                break
            self.train(req)

    def train(self, req: R) -> None:
        t_start = self.started()
        if not self.pending and self.published() != self.version:
            self.load()  # another trainer committed
        stale = self.version - self.oldest(req)
        if stale > self.k:
            # Only reachable with several trainers, when others committed past the base the
            # controller planned for: training would break the staleness bound, so refuse.
            self.refuse(req, f"staleness {stale} > K at the trainer", {}, t_start)
            return
        stats = self.update(req)
        skip = commit_verdict(stats)  # raises for an applied step that was not finite
        if self.pending and not self.settle():
            # computed on a rejected candidate (or no verdict came): discard it as well
            self.refuse(req, "its base candidate was not committed", stats, t_start)
            return
        self.propose(req, stats, t_start, updated=skip is None)
        self.pending = True
        self.version += 1  # what the weights will be once the service applies the candidate
        if skip is not None:
            self.settle()  # the service skips it: nothing is worth computing on top of it

    def settle(self) -> bool | None:
        """Read the verdict on the pending commit (the service reports it to the controller):
        applied or skipped, or None if no verdict came (the parameter service is gone)."""
        ack = self.wait_ack()
        self.pending = False
        if ack is None:
            return None
        applied = self.applied(ack)
        if not applied:
            self.load()
        return applied


class TrainerRole(TrainerLoop[R, CommitAck]):
    """The hooks a trainer role answers from its context alone: its batch queue, the
    published version, the service's verdicts and its staging slot. The live `Trainer` and
    the planner's (`rlcore/plan/roles.py`) add what they do with, or without, a model."""

    def __init__(self, ctx: TrainerContext, version: int):
        super().__init__(ctx.cfg.staleness.staleness_k, version)
        self.ctx, self.cfg, self.clock = ctx, ctx.cfg, ctx.clock
        self.slot = ctx.index + 1  # slot 0 starts as current; each trainer stages in its own

    def next_request(self) -> R | None:
        req: R | None = self.ctx.trainer_q.get()
        return req

    def idle(self) -> bool:
        return self.ctx.trainer_q.empty()

    def published(self) -> int:
        return self.ctx.slots.version()

    def started(self) -> float:
        self.clock.take_work()  # what came before the update is no span's
        return self.clock.now()

    def wait_ack(self) -> CommitAck | None:
        return receive_ack(self.ctx)

    def applied(self, ack: CommitAck) -> bool:
        self.slot = ack.next_slot
        return ack.applied


class Trainer(TrainerRole[TrainRequest]):
    """One live trainer role: its policy, its staging slot and its pending commit; with
    ranks, rank 0, which tells the others each load and update it takes."""

    def __init__(self, ctx: TrainerContext):
        self.policy = HFPolicy(ctx.cfg.model, ctx.cfg.train, role="trainer", device=ctx.device,
                               clock=ctx.clock)
        self.named = self.policy.state_tensors()
        self.params = ctx.slots.ordered(self.named)
        super().__init__(ctx, ctx.slots.read_into(self.params))
        check_arrival(ctx.slots, self.version, self.named, ctx.name)
        if ctx.ranks is not None:
            self.policy.ranks = join_ranks(ctx.ranks, 0, self.policy.device)
        elif ctx.clock.virtual:
            self.policy.priced_ranks = ctx.cfg.runtime.trainer_ranks
        self.ops: list[TrainerOp] = []  # steps not reported yet
        self.steps = 0

    def tell(self, step: tuple[Any, ...] | None) -> None:
        """Send the other ranks the step this one takes (None: stop)."""
        for q in self.ctx.rank_qs:
            q.put(step)

    def step(self, op: str, version: int, batch_id: int | None = None) -> None:
        self.ops.append(TrainerOp(self.ctx.index, self.steps, op, version, batch_id))
        self.steps += 1

    def report(self) -> tuple[TrainerOp, ...]:
        ops, self.ops = tuple(self.ops), []
        return ops

    def load(self) -> None:
        self.version = self.ctx.slots.read_into(self.params)
        check_arrival(self.ctx.slots, self.version, self.named, self.ctx.name)
        charge_copy(self.clock, self.ctx.slots, "read")
        self.step("load", self.version)
        self.tell(("load", self.version))

    def oldest(self, req: TrainRequest) -> int:
        return min(min(v) for v in req.batch.versions if v)

    def update(self, req: TrainRequest) -> dict[str, float]:
        self.tell(("update", req.batch, self.version))
        stats = self.policy.update(req.batch, temperature=self.cfg.rollout.temperature,
                                   current_version=self.version)
        self.step("update", self.version, req.batch_id)
        return stats

    def propose(self, req: TrainRequest, stats: dict[str, float], t_start: float,
                updated: bool) -> None:
        t_write = self.clock.now()
        self.ctx.slots.write(self.slot, self.params)
        digest = state_digest(self.named) if self.ctx.slots.digests else None
        charge_copy(self.clock, self.ctx.slots, "write")
        stats["time/weight_write_s"] = self.clock.now() - t_write
        self.ctx.commit_q.put(CommitRequest(self.ctx.index, req.batch_id, self.slot,
                                            self.version, updated, stats, t_start,
                                            self.clock.now(), self.report(),
                                            self.clock.take_work(), digest))

    def refuse(self, req: TrainRequest, reason: str, stats: dict[str, float],
               t_start: float) -> None:
        ctx = self.ctx
        ctx.inbox.put(UpdateDone(ctx.index, req.batch_id, False, ctx.slots.version(),
                                 self.version, reason, stats, self.clock.now(), t_start,
                                 ops=self.report(), work=self.clock.take_work()))


def trainer_main(ctx: TrainerContext) -> None:
    """Worker entry: load the policy, pass the ready barrier, train until a None request."""
    t_load = ctx.clock.now()
    trainer = Trainer(ctx)
    ctx.inbox.put(Ready(ctx.name, ctx.pid(), str(trainer.policy.device),
                        ctx.clock.now() - t_load))
    ctx.start.wait()
    cpu0 = ctx.own_cpu_s()
    ranks = trainer.policy.ranks
    try:
        trainer.run()
        if ranks is not None:  # a clean end: the ranks must hold the same state
            trainer.tell(("agree",))
            ranks.agree(state_digest(trainer.named))
    finally:
        trainer.tell(None)
        if ranks is not None:
            ranks.close()
    ctx.inbox.put(Stopped(ctx.name, cpu_s=ctx.own_cpu_s() - cpu0,
                          gpu_peak_bytes=peak_gpu_bytes(trainer.policy.device)))


def join_ranks(ranks: Ranks, rank: int, device: torch.device) -> RankGroup:
    """This process's place in its trainer's group, once every rank has come."""
    return RankGroup(Path(ranks.rendezvous), rank, ranks.world, device=device,
                     timeout_s=ranks.timeout_s)


def rank_main(ctx: RankContext) -> None:
    """Worker entry of a trainer's rank above 0: load the policy, meet the other ranks, then
    take rank 0's steps on its own share until told to stop. It proposes nothing."""
    t_load = ctx.clock.now()
    policy = HFPolicy(ctx.cfg.model, ctx.cfg.train, role="trainer", device=ctx.device,
                      clock=ctx.clock)
    named = policy.state_tensors()
    params = ctx.slots.ordered(named)
    version = ctx.slots.read_into(params)
    check_arrival(ctx.slots, version, named, ctx.name)
    policy.ranks = join_ranks(ctx.ranks, ctx.rank, policy.device)
    ctx.inbox.put(Ready(ctx.name, ctx.pid(), str(policy.device), ctx.clock.now() - t_load))
    ctx.start.wait()
    cpu0 = ctx.own_cpu_s()
    try:
        while (step := ctx.rank_q.get()) is not None:
            if step[0] == "load":
                version = ctx.slots.read_into(params)
                check_arrival(ctx.slots, version, named, ctx.name)
                if version != step[1]:
                    raise RuntimeError(f"{ctx.name} loaded version {version}, rank 0 version "
                                       f"{step[1]}: the ranks' weights would differ")
            elif step[0] == "agree":
                policy.ranks.agree(state_digest(named))
            else:
                _, batch, version = step
                policy.update(batch, temperature=ctx.cfg.rollout.temperature,
                              current_version=version)
    finally:
        policy.ranks.close()
    ctx.inbox.put(Stopped(ctx.name, cpu_s=ctx.own_cpu_s() - cpu0,
                          gpu_peak_bytes=peak_gpu_bytes(policy.device)))


def receive_ack(ctx: TrainerContext) -> CommitAck | None:
    """The parameter service's answer; None if the run is stopping and none came in 5 s
    (the service is gone: a failed run being torn down)."""
    waited = 0.0
    while True:
        try:
            return ctx.ack_q.get(timeout=0.1)
        except queue.Empty:
            waited = waited + 0.1 if ctx.stop.is_set() else 0.0
            if waited >= 5.0:
                return None
