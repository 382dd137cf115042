"""The planner's roles: the asynchronous run's roles with the model taken out.

The rollout runs the live generation loop (`rlcore/policy/generation.py`) on a sampler that
draws lengths (`sampler.py`, `lengths.py`) and takes prompts through rollout.py's
`PromptFeed`; the trainer is the live `TrainerLoop` (trainer.py) with an update priced by
its token count; the controller's decisions are the live `scheduling.py`'s (`controller.py`).
All run on the same virtual clock (`rlcore/clock/virtual.py`). What is left here is what
the live roles do with a model and weights: prices instead of computations, a version number
instead of weight slots, and the planner's messages. Nothing is written but the counts a
plan reports (`planner.py`). `tests/test_plan.py` checks that a plan makes a virtual run's
decisions, given its lengths.
"""

from __future__ import annotations

import queue

from rlcore.clock.profile import HardwareProfile
from rlcore.clock.virtual import VirtualClock, VirtualFlag, VirtualQueue
from rlcore.clock.work import Commit, Prefill, Update, Weights, Work
from rlcore.config import RunConfig
from rlcore.plan.lengths import Lengths
from rlcore.plan.messages import (
    PlanBatch,
    PlanCommit,
    PlanCut,
    PlanSample,
    PlanTrain,
    PlanVerdict,
    Tally,
)
from rlcore.plan.sampler import LengthSampler
from rlcore.policy.generation import generate
from rlcore.runners.asynchronous.rollout import PromptFeed
from rlcore.runners.asynchronous.trainer import TrainerLoop
from rlcore.tasks.suites import Task

POLL_S = 0.05  # the runtime's receive timeout (runtime.py) and the prompt feed's


class Plan:
    """One planned run: the clock, the channels between the roles, and the tally."""

    def __init__(self, cfg: RunConfig, clock: VirtualClock, profile: HardwareProfile,
                 tasks: list[Task], prompt_tokens: dict[str, int], lengths: Lengths,
                 weight_bytes: int):
        self.cfg, self.clock, self.profile, self.tasks = cfg, clock, profile, tasks
        self.prompt_tokens, self.lengths, self.weight_bytes = prompt_tokens, lengths, weight_bytes
        self.task_ids = {t.prompt: t.task_id for t in tasks}  # what a slot's draw is keyed by
        self.inbox, self.prompt_q, self.commit_q = (VirtualQueue(clock) for _ in range(3))
        n = cfg.runtime.trainer_workers
        self.trainer_qs = [VirtualQueue(clock) for _ in range(n)]
        self.ack_qs = [VirtualQueue(clock) for _ in range(n)]
        self.start, self.stop = VirtualFlag(clock), VirtualFlag(clock)
        self.version = 0  # the published policy version (the parameter service's clock)
        self.tally = Tally()

    def charge(self, role: str, work: Work) -> None:
        """Price `work` for `role` on the clock, and count it as that role's busy time."""
        self.tally.busy_s[role] = self.tally.busy_s.get(role, 0.0) + self.profile.seconds(work)
        self.clock.charge(work)

    def reload(self, role: str) -> int:
        self.charge(role, Weights("read", self.weight_bytes))
        return self.version


class PlanLook:
    """rollout.py's `Look` without the records: the run's stop, and newer weights."""

    def __init__(self, p: Plan, role: str):
        self.p, self.role, self.version = p, role, p.version

    def cut(self, running: list[int]) -> tuple[str, list[int]] | None:
        return ("stop", running) if self.p.stop.is_set() else None

    def swap(self) -> int | None:
        if self.p.version <= self.version:
            return None
        self.version = self.p.reload(self.role)
        return self.version


def rollout_role(p: Plan, index: int) -> None:
    """rollout.py's loop: take prompts, run the generation loop, emit what it made."""
    cfg, ro = p.cfg, p.cfg.rollout
    role = f"rollout{index}"
    feed = PromptFeed(p.prompt_q, cfg.train.update_batch_size)

    look = PlanLook(p, role)
    p.start.wait()
    while not p.stop.is_set():
        batch = feed.take()
        if not batch:
            continue
        if p.version > look.version:
            look.version = p.reload(role)
        start_version = look.version
        sampler = LengthSampler(lambda work: p.charge(role, work),
                                [p.prompt_tokens[s.prompt] for s in batch],
                                [p.lengths.draw(cfg.seed, s.slot_id, s.attempt,
                                                p.task_ids.get(s.prompt)) for s in batch],
                                ro.max_new_tokens)
        gen = generate(sampler, ro.chunk_tokens, cfg.staleness.interrupt, look)
        p.tally.tokens_sampled += gen.sampled
        p.tally.tokens_reprefilled += gen.reprefilled
        out = PlanBatch()
        if gen.cut_reason == "interrupt":
            out.cuts = [PlanCut(batch[i], n) for i, n in gen.cut.items()]
        out.samples = [PlanSample(batch[i], p.prompt_tokens[batch[i].prompt],
                                  sampler.length(i), sampler.finished(i), start_version)
                       for i in gen.kept(sampler.rows)]
        p.inbox.put(out)


class PlanTrainer(TrainerLoop[PlanTrain, PlanVerdict]):
    """trainer.py's decisions (`TrainerLoop`) with the model taken out: an update is its
    price, a candidate a version number."""

    def __init__(self, p: Plan, index: int):
        super().__init__(p.cfg.staleness.staleness_k, p.version)
        self.p, self.index, self.role = p, index, f"trainer{index}"

    def next_request(self) -> PlanTrain | None:
        return self.p.trainer_qs[self.index].get()

    def idle(self) -> bool:
        return self.p.trainer_qs[self.index].empty()

    def published(self) -> int:
        return self.p.version

    def load(self) -> None:
        self.version = self.p.reload(self.role)

    def oldest(self, req: PlanTrain) -> int:
        return req.oldest

    def started(self) -> float:
        return 0.0  # a plan reports no spans

    def update(self, req: PlanTrain) -> dict[str, float]:
        if req.prefill_tokens:
            self.p.charge(self.role, Prefill(calls=1, tokens=req.prefill_tokens))
        self.p.charge(self.role, Update(tokens=req.tokens))
        return {}

    def propose(self, req: PlanTrain, stats: dict[str, float], t_start: float) -> None:
        self.p.charge(self.role, Weights("write", self.p.weight_bytes))
        self.p.commit_q.put(PlanCommit(self.index, req.batch_id, self.version))

    def refuse(self, req: PlanTrain, reason: str, stats: dict[str, float],
               t_start: float) -> None:
        self.p.inbox.put(PlanVerdict(self.index, req.batch_id, False, self.version,
                                     self.p.clock.now()))

    def wait_ack(self) -> PlanVerdict:
        while True:  # trainer.py's _wait_ack looks every 0.1 s (for a stop it never sees here)
            try:
                ack: PlanVerdict = self.p.ack_qs[self.index].get(timeout=0.1)
                return ack
            except queue.Empty:
                continue

    def applied(self, ack: PlanVerdict) -> bool:
        return ack.applied


def trainer_role(p: Plan, index: int) -> None:
    """trainer.py's `trainer_main` after loading: train until a None request."""
    trainer = PlanTrainer(p, index)
    p.start.wait()
    trainer.run()


def param_service_role(p: Plan) -> None:
    """param_service.py: apply a candidate computed from the current version, else skip."""
    p.start.wait()
    while True:
        req: PlanCommit | None = p.commit_q.get()
        if req is None:
            return
        p.charge("param_service", Commit())
        applied = req.base_version == p.version
        if applied:
            p.version += 1
        verdict = PlanVerdict(req.trainer, req.batch_id, applied, req.base_version,
                              p.clock.now())
        p.ack_qs[req.trainer].put(verdict)
        p.inbox.put(verdict)
