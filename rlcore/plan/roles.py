"""The planner's roles: the asynchronous run's roles with the model taken out.

Each role here follows its live counterpart in `rlcore/runners/asynchronous/` step for step
(rollout.py, trainer.py, param_service.py, controller.py with runtime.py's loop), on the same
virtual clock (`rlcore/clock/virtual.py`), with the same admission code (`Dispatcher`) and
the same staleness rules (`rlcore/algo/staleness.py`, `rlcore/algo/batching.py`). What a
role computes is only priced: a response is a length drawn from `lengths.py`, an update is
its token count. Nothing is written but the counts a plan reports (`planner.py`).

When a live role changes how it schedules, its twin here must change with it:
`tests/test_plan.py` compares a plan with a virtual run of the same config.
"""

from __future__ import annotations

import queue
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from rlcore.algo.batching import take_whole_groups
from rlcore.algo.staleness import (
    StalenessManager,
    accept_on_arrival,
    fresh_for_batch,
    staleness,
)
from rlcore.clock.profile import HardwareProfile
from rlcore.clock.virtual import VirtualClock, VirtualFlag, VirtualQueue
from rlcore.clock.work import Commit, Decode, Handle, Prefill, Reward, Update, Weights, Work
from rlcore.config import RunConfig
from rlcore.plan.lengths import Lengths
from rlcore.runners.asynchronous.dispatch import Dispatcher
from rlcore.runners.asynchronous.messages import PromptSlot
from rlcore.tasks.suites import Task

POLL_S = 0.05  # the runtime's receive timeout (runtime.py) and the prompt feed's


class LengthSampler:
    """`ChunkedSampler` without a model: the same chunks, steps and prices, with each row's
    length drawn instead of sampled."""

    def __init__(self, charge: Callable[[Work], None], widths: Sequence[int],
                 draws: Sequence[tuple[int, bool]], max_new_tokens: int):
        self.charge, self.max_new_tokens = charge, max_new_tokens
        self.rows, self.width = len(widths), max(widths)  # left-padded to the longest prompt
        self.draws = draws
        # the step at which a row stops appending: its stop token, or the cap
        self.ends = [n if fin else max_new_tokens for n, fin in draws]
        self.steps = 0
        charge(Prefill(calls=1, tokens=self.rows * self.width))

    def finished(self, i: int) -> bool:
        """Row i has sampled its stop token."""
        return self.draws[i][1] and self.ends[i] <= self.steps

    def tokens(self, i: int) -> int:
        return min(self.ends[i], self.steps)

    @property
    def done(self) -> bool:
        return self.steps >= self.max_new_tokens or all(
            self.finished(i) for i in range(self.rows))

    def step(self, n_tokens: int) -> int:
        """Up to n_tokens more steps; returns the tokens sampled (rows still running)."""
        sampled = steps = rows = row_context = 0
        if self.done:
            return 0
        for _ in range(n_tokens):
            if self.done:
                break
            sampled += sum(1 for e in self.ends if e > self.steps)
            self.steps += 1
            steps += 1
            if self.done:
                break  # as the live sampler: no forward pass after the last token
            rows += self.rows
            row_context += self.rows * (self.width + self.steps)
        self.charge(Decode(steps=steps, rows=rows, row_context=row_context))
        return sampled

    def reprefill(self) -> None:
        self.charge(Prefill(calls=1, tokens=self.rows * (self.width + self.steps)))


@dataclass
class PlanSample:
    """A finished attempt, as a rollout message carries it."""

    slot: PromptSlot
    prompt_tokens: int
    tokens: int
    finished: bool
    version: int  # of its oldest token


@dataclass
class PlanCut:
    """An attempt interrupted by a new version (`interrupt: resubmit`)."""

    slot: PromptSlot
    tokens: int


@dataclass
class PlanBatch:
    samples: list[PlanSample] = field(default_factory=list)
    cuts: list[PlanCut] = field(default_factory=list)


@dataclass
class PlanTrain:
    batch_id: int
    oldest: int  # the oldest version of any sample in the batch
    tokens: int  # rows x padded width, summed over minibatches (`work.py::Update`)
    prefill_tokens: int  # the decoupled objective's proximal recompute (0: none)


@dataclass
class PlanCommit:
    trainer: int
    batch_id: int
    base_version: int
    t_start: float


@dataclass
class PlanVerdict:
    trainer: int
    batch_id: int
    applied: bool
    base_version: int
    t: float


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
    busy_s: dict[str, float] = field(default_factory=dict)  # priced seconds per role
    commit_times: list[float] = field(default_factory=list)


class Plan:
    """One planned run: the clock, the channels between the roles, and the tally."""

    def __init__(self, cfg: RunConfig, clock: VirtualClock, profile: HardwareProfile,
                 tasks: list[Task], prompt_tokens: dict[str, int], lengths: Lengths,
                 weight_bytes: int):
        self.cfg, self.clock, self.profile, self.tasks = cfg, clock, profile, tasks
        self.prompt_tokens, self.lengths, self.weight_bytes = prompt_tokens, lengths, weight_bytes
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


def rollout_role(p: Plan, index: int) -> None:
    """rollout.py's loop: take prompts, generate in chunks, look at the version between."""
    cfg, ro = p.cfg, p.cfg.rollout
    role = f"rollout{index}"
    local = p.version
    held: deque[PromptSlot] = deque()

    def charge(work: Work) -> None:
        p.charge(role, work)

    p.start.wait()
    while not p.stop.is_set():
        if not held:  # rollout.py's PromptFeed
            try:
                held.extend(p.prompt_q.get(timeout=POLL_S))
            except queue.Empty:
                continue
        while len(held) < cfg.train.update_batch_size:
            try:
                held.extend(p.prompt_q.get_nowait())
            except queue.Empty:
                break
        batch = [held.popleft() for _ in range(min(cfg.train.update_batch_size, len(held)))]
        if not batch:
            continue
        if p.version > local:
            local = p.reload(role)
        start_version = local
        sampler = LengthSampler(charge, [p.prompt_tokens[s.prompt] for s in batch],
                                [p.lengths.draw(cfg.seed, s.slot_id, s.attempt)
                                 for s in batch], ro.max_new_tokens)
        out = PlanBatch()
        live = list(range(len(batch)))
        while not sampler.done:
            p.tally.tokens_sampled += sampler.step(ro.chunk_tokens)
            if p.stop.is_set():
                live = [i for i in live if sampler.finished(i)]
                break
            if sampler.done or p.version <= local:
                continue
            local = p.reload(role)
            unfinished = [i for i in live if not sampler.finished(i)]
            if cfg.staleness.interrupt == "continue":
                p.tally.tokens_reprefilled += sum(sampler.tokens(i) for i in unfinished)
                sampler.reprefill()
                continue
            if cfg.staleness.interrupt == "keep_kv":
                continue
            out.cuts = [PlanCut(batch[i], sampler.tokens(i)) for i in unfinished]
            live = [i for i in live if sampler.finished(i)]
            break
        out.samples = [PlanSample(batch[i], p.prompt_tokens[batch[i].prompt],
                                  sampler.tokens(i), sampler.finished(i), start_version)
                       for i in live]
        p.inbox.put(out)


def trainer_role(p: Plan, index: int) -> None:
    """trainer.py's loop: update, write the candidate, propose it; the commit round trip
    pipelined with the next update."""
    cfg, role = p.cfg, f"trainer{index}"
    version, pending = p.version, False

    def settle() -> bool:
        nonlocal pending, version
        while True:  # trainer.py's _wait_ack looks every 0.1 s (for a stop it never sees here)
            try:
                ack: PlanVerdict = p.ack_qs[index].get(timeout=0.1)
                break
            except queue.Empty:
                continue
        pending = False
        if not ack.applied:
            version = p.reload(role)
        return ack.applied

    def refuse(req: PlanTrain, t_start: float) -> None:
        p.inbox.put(PlanVerdict(index, req.batch_id, False, version, p.clock.now()))

    p.start.wait()
    while True:
        if pending and p.trainer_qs[index].empty():
            settle()
        req: PlanTrain | None = p.trainer_qs[index].get()
        if req is None:
            if pending:
                settle()
            return
        t_start = p.clock.now()
        if not pending and p.version != version:
            version = p.reload(role)
        if version - req.oldest > cfg.staleness.staleness_k:
            refuse(req, t_start)
            continue
        if req.prefill_tokens:
            p.charge(role, Prefill(calls=1, tokens=req.prefill_tokens))
        p.charge(role, Update(tokens=req.tokens))
        if pending and not settle():
            refuse(req, t_start)
            continue
        p.charge(role, Weights("write", p.weight_bytes))
        p.commit_q.put(PlanCommit(index, req.batch_id, version, t_start))
        pending = True
        version += 1


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


@dataclass
class _Pending:
    sample: PlanSample
    arrival_version: int


@dataclass
class _Group:
    unresolved: int
    accepted: list[_Pending] = field(default_factory=list)


class PlanController:
    """controller.py's decisions, fed by runtime.py's loop, counting instead of recording."""

    def __init__(self, p: Plan):
        cfg = p.cfg
        self.p, self.cfg, self.clock = p, cfg, p.clock
        self.k = cfg.staleness.staleness_k
        self.batch_size = cfg.train.update_batch_size
        self.filter_on_arrival = cfg.staleness.staleness_control in ("filter", "both")
        self.ratio = cfg.staleness.rollout_train_ratio
        self.manager = StalenessManager(self.k, self.batch_size)
        self.dispatch = Dispatcher(cfg, p.tasks, p.prompt_q, self.manager)
        self.groups: dict[int, _Group] = {}
        self.ready: deque[list[_Pending]] = deque()
        n = cfg.runtime.trainer_workers
        self.depth = 2 if n == 1 else 1
        self.outstanding = [0] * n
        self.in_training: dict[int, tuple[int, list[_Pending]]] = {}
        self.applied = self.next_batch = self.generated = 0
        self.waits = {"trainer_data_s": 0.0, "trainer_ratio_s": 0.0,
                      "rollout_throttle_s": 0.0, "rollout_ratio_s": 0.0}
        self.t_done: float | None = None
        self._last_pump = self.clock.now()
        self._blocked: set[str] = set()
        self.reward_kind: dict[str, Literal["answer", "code"]] = {
            t.prompt: "code" if t.kind == "code" else "answer" for t in p.tasks}

    @property
    def done(self) -> bool:
        return self.applied >= self.cfg.train.updates

    def buffered(self) -> int:
        return sum(len(g) for g in self.ready)

    def drive(self) -> float:
        """runtime.py's `drive`: feed the controller until the last update has committed."""
        self.p.start.set()
        while self.t_done is None:
            try:
                msg = self.p.inbox.get(timeout=POLL_S)
            except queue.Empty:
                msg = None
            if msg is not None:
                self.on_message(msg)
            self.pump()
        return self.t_done

    def stop(self) -> None:
        """runtime.py's `stop`: stop rollout and the trainers, then the parameter service,
        handling what they still send (the samples of the last chunks count, as in a run)."""
        p, n_rollout = self.p, self.cfg.runtime.rollout_workers
        p.stop.set()
        for _ in range(n_rollout):
            p.prompt_q.put([])
        for q in p.trainer_qs:
            q.put(None)
        self._drain({f"rollout{i}" for i in range(n_rollout)}
                    | {f"trainer{i}" for i in range(len(p.trainer_qs))})
        p.commit_q.put(None)
        self._drain({"param_service"})

    def _drain(self, roles: set[str]) -> None:
        while not roles <= set(self.clock.ended()):
            try:
                self.on_message(self.p.inbox.get(timeout=POLL_S))
            except queue.Empty:
                continue

    def on_message(self, msg: PlanBatch | PlanVerdict) -> None:
        p = self.p
        if isinstance(msg, PlanBatch):
            for sample in msg.samples:
                p.charge("controller", Reward(kind=self.reward_kind[sample.slot.prompt]))
                self.on_sample(sample)
            for cut in msg.cuts:
                self.on_cut(cut)
            p.charge("controller", Handle(samples=len(msg.samples) + len(msg.cuts)))
        else:
            self.on_update(msg)
            p.charge("controller", Handle(samples=0))

    def on_sample(self, sample: PlanSample) -> None:
        self.dispatch.returned()
        self.generated += 1
        group = self.groups[sample.slot.group_id]
        s = staleness(self.applied, sample.version)
        accepted = accept_on_arrival(s, self.k, self.filter_on_arrival)
        self.manager.returned(accepted=accepted)
        if accepted:
            group.accepted.append(_Pending(sample, self.applied))
        else:
            self.p.tally.dropped_stale += 1
        self._resolve(sample.slot.group_id)

    def on_cut(self, cut: PlanCut) -> None:
        self.dispatch.returned()
        self.manager.returned(accepted=False)
        if cut.slot.attempt < self.cfg.staleness.max_retries:
            self.p.tally.resubmissions += 1
            self.dispatch.retry(cut.slot)
            return
        self.p.tally.dropped_interrupted += 1
        self._resolve(cut.slot.group_id)

    def on_update(self, msg: PlanVerdict) -> None:
        planned_base, items = self.in_training.pop(msg.batch_id)
        self.outstanding[msg.trainer] -= 1
        tally = self.p.tally
        if not msg.applied:
            self.manager.released(len(items))
            tally.skipped_commits += 1
            tally.accepted += [staleness(planned_base, i.sample.version) for i in items]
            return
        tally.accepted += [staleness(msg.base_version, i.sample.version) for i in items]
        tally.tokens_trained += sum(i.sample.tokens for i in items)
        tally.commit_times.append(msg.t)
        self.manager.trained(len(items))
        self.applied += 1
        if self.done and self.t_done is None:
            self.t_done = msg.t

    def _resolve(self, group_id: int) -> None:
        group = self.groups[group_id]
        group.unresolved -= 1
        if group.unresolved == 0:
            del self.groups[group_id]
            if group.accepted:
                self.ready.append(group.accepted)

    def pump(self) -> None:
        now = self.clock.now()
        for reason in self._blocked:
            self.waits[reason] += now - self._last_pump
        self._last_pump = now
        self._blocked = set()
        if self.done:
            return
        starving = not self.in_training and self.buffered() < self.batch_size
        prompts, blocked = self.dispatch.pump(self.applied, self.generated, self.next_batch,
                                              trainer_starving=starving)
        for prompt in prompts:
            self.groups[prompt.group_id] = _Group(unresolved=self.cfg.rollout.group_size)
        if blocked is not None:
            self._blocked.add(blocked)
        self._dispatch_batches()

    def _dispatch_batches(self) -> None:
        while self.applied + len(self.in_training) < self.cfg.train.updates:
            trainer = min(range(len(self.outstanding)), key=self.outstanding.__getitem__)
            if self.outstanding[trainer] >= self.depth:
                return
            if self.ratio is not None and \
                    self.generated < self.ratio * self.batch_size * (self.next_batch + 1):
                self._blocked.add("trainer_ratio_s")
                return
            batch = self._take_batch(self.applied + len(self.in_training))
            if batch is None:
                if self.outstanding[trainer] == 0:
                    self._blocked.add("trainer_data_s")
                return
            self._send_batch(trainer, batch)

    def _take_batch(self, version: int) -> list[_Pending] | None:
        for group in self.ready:
            fresh = [i for i in group if fresh_for_batch(version, i.sample.version, self.k)]
            self.manager.released(len(group) - len(fresh))
            self.p.tally.dropped_stale += len(group) - len(fresh)
            group[:] = fresh
        taken = take_whole_groups([g for g in self.ready if g], self.batch_size)
        if taken is None:
            return None
        groups, rest = taken
        self.ready = deque(rest)
        return [item for group in groups for item in group]

    def _send_batch(self, trainer: int, batch: list[_Pending]) -> None:
        version = self.applied + len(self.in_training)
        self.outstanding[trainer] += 1
        batch_id = self.next_batch
        self.next_batch += 1
        self.in_training[batch_id] = (version, batch)
        lengths = [i.sample.prompt_tokens + i.sample.tokens for i in batch]
        self.p.trainer_qs[trainer].put(PlanTrain(
            batch_id, min(i.sample.version for i in batch),
            update_tokens(lengths, self.cfg.train.minibatches),
            len(lengths) * max(lengths) if self.cfg.train.objective == "decoupled" else 0))

    def unsettled(self) -> list[int]:
        """Staleness of the accepted samples never trained, at the version they arrived at."""
        left = [i for g in self.ready for i in g] \
            + [i for g in self.groups.values() for i in g.accepted]
        return [staleness(i.arrival_version, i.sample.version) for i in left]


def update_tokens(lengths: Sequence[int], minibatches: int) -> int:
    """rows x padded width summed over the minibatches an update splits its batch into
    (`HFPolicy.update`: near-equal consecutive parts)."""
    n, total = len(lengths), 0
    for m in range(minibatches):
        part = lengths[m * n // minibatches:(m + 1) * n // minibatches]
        total += len(part) * max(part, default=0)
    return total
