"""The planner's controller: controller.py's decisions, fed by runtime.py's loop, on the
planner's messages, counting instead of recording.

It uses the live controller's admission code (`Dispatcher`) and staleness rules
(`rlcore/algo/staleness.py`, `rlcore/algo/batching.py`); its message handling and batch
formation restate the live controller's, which `tests/test_plan.py` holds to the same
decisions at the same virtual times.
"""

from __future__ import annotations

import queue
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from rlcore.algo.batching import take_whole_groups
from rlcore.algo.staleness import (
    StalenessManager,
    accept_on_arrival,
    fresh_for_batch,
    staleness,
)
from rlcore.clock.work import Handle, Reward
from rlcore.plan.messages import PlanBatch, PlanCut, PlanSample, PlanTrain, PlanVerdict
from rlcore.plan.roles import POLL_S, Plan
from rlcore.runners.asynchronous.dispatch import Dispatcher


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
                p.charge("controller", Reward(kind=self.cfg.reward.verifier))
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
