"""The controller: dispatches prompts, rewards samples, filters by staleness, batches.

It is transport-agnostic: the AReaL-style runtime feeds it messages from worker processes,
the threaded baseline from threads; the rules below are the same for both (paper §4.2).

Staleness of a sample is `v - v_rollout`, where `v_rollout` is the version of its *oldest*
token: under `interrupt: continue` a response can span versions, and its oldest token is the
one furthest from the policy being trained (a conservative choice; the newest-token reading
would admit tokens older than K). It is checked twice:
  * on arrival against the current version (the paper's Listing 1), when `filter` is on;
  * when a batch is formed, against the version the update will start from -- always, so the
    bound `staleness <= K` holds for every trained sample whatever the control mode
    (`throttle` alone normally leaves nothing for this check to drop).
`throttle` bounds prompt dispatch by AReaL's eq. 1 (`StalenessManager`), so rollout cannot run
more than K batches ahead of training. `rollout_train_ratio` (Parallel Q-Learning's beta)
holds generated samples per update at a fixed ratio by making the faster side wait.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

from rlcore.backend import Generation
from rlcore.config import RunConfig
from rlcore.records import RunRecorder
from rlcore.reward import RewardPool
from rlcore.runners.areal.protocol import (
    Event,
    InterruptedMsg,
    PromptSlot,
    RewardsReady,
    RolloutBatch,
    SampleMsg,
    TrainRequest,
    UpdateDone,
)
from rlcore.runners.common import (
    Progress,
    Prompt,
    PromptStream,
    sample_row,
    train_batch,
    update_row,
)
from rlcore.tasks import Task


class StalenessManager:
    """Admission control of AReaL eq. 1, floor(N_r / B) <= v + K, as a sample capacity.

    capacity = (v + K + 1) * B - (accepted + running): samples accepted into the buffer or
    still being generated may fill at most K + 1 batches beyond what training has consumed.
    Samples dropped after acceptance give their capacity back, or rollout would stall.
    """

    def __init__(self, k: int, batch_size: int):
        self.k, self.batch_size = k, batch_size
        self.accepted = 0
        self.running = 0
        self._lock = threading.Lock()

    def capacity(self, version: int) -> int:
        with self._lock:
            return (version + self.k + 1) * self.batch_size - (self.accepted + self.running)

    def submitted(self, n: int) -> None:
        with self._lock:
            self.running += n

    def returned(self, accepted: bool) -> None:
        with self._lock:
            self.running -= 1
            self.accepted += int(accepted)

    def released(self, n: int) -> None:
        """n accepted samples will never be trained (dropped at batching, or a skipped commit)."""
        with self._lock:
            self.accepted -= n


@dataclass
class Pending:
    """An accepted sample waiting in the replay buffer."""

    row: dict[str, Any]
    gen: Generation


@dataclass
class Group:
    """The samples of one prompt; it enters the replay buffer once every slot is resolved."""

    prompt: Prompt
    unresolved: int
    accepted: list[Pending] = field(default_factory=list)


class Controller:
    """Message handlers and the dispatch pump; records every sample and update it decides."""

    def __init__(self, cfg: RunConfig, tasks: list[Task], rec: RunRecorder, channels: Any,
                 n_trainers: int):
        self.cfg, self.rec, self.ch = cfg, rec, channels
        self.k = cfg.staleness.staleness_k
        self.batch_size = cfg.train.update_batch_size
        control = cfg.staleness.staleness_control
        self.filter_on_arrival = control in ("filter", "both")
        self.throttle = control in ("throttle", "both")
        self.ratio = cfg.staleness.rollout_train_ratio
        self.manager = StalenessManager(self.k, self.batch_size)
        self.stream = PromptStream(tasks, cfg.seed)
        self.groups: dict[int, Group] = {}
        self.ready: deque[list[Pending]] = deque()  # resolved groups, FIFO
        self.resubmit: deque[PromptSlot] = deque()
        # A single trainer may hold one batch queued behind the one it is training on, so it
        # never waits for the controller; with several, each takes one at a time.
        self.depth = 2 if n_trainers == 1 else 1
        self.outstanding = [0] * n_trainers
        self.in_training: dict[int, list[Pending]] = {}
        self.next_slot = 0
        self.next_sample = 0
        self.next_batch = 0
        self.in_flight = 0  # slots dispatched and not yet returned
        self.dispatched = 0  # slots ever dispatched (resubmissions included)
        self.received = 0  # rollout messages processed
        self.generated = 0  # finished samples returned
        self.samples: list[dict[str, Any]] = []
        self.updates: list[dict[str, Any]] = []
        self.token_staleness: dict[str, list[int]] = {"accepted": [], "dropped_stale": []}
        self.interrupted_tokens = 0
        self.resubmissions = 0
        self.skipped_commits = 0
        self.waits = {"trainer_data_s": 0.0, "trainer_ratio_s": 0.0,
                      "rollout_throttle_s": 0.0, "rollout_ratio_s": 0.0}
        self.controller_s = 0.0
        self.spans: dict[str, list[tuple[float, float]]] = {"rollout": [], "trainer": []}
        self.reload_times: list[float] = []  # rollout weight reloads, seconds each
        self.t_done: float | None = None
        self.progress = Progress(cfg)
        self.rewards = RewardPool(cfg.reward, done=self._scored_elsewhere)
        self.scored: deque[tuple[SampleMsg, dict[str, Any]]] = deque()
        self.trained_tokens = 0
        self._last_pump = time.monotonic()
        self._blocked: set[str] = set()
        self._last_depths = 0.0

    # --- state -----------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return len(self.updates) >= self.cfg.train.updates

    def version(self) -> int:
        """The policy version as the controller has seen it committed.

        Counted from the trainers' reports rather than read from the clock, so that it moves
        together with `in_training`; the clock can be a commit ahead of both.
        """
        return len(self.updates)

    def buffered(self) -> int:
        return sum(len(g) for g in self.ready)

    # --- incoming ----------------------------------------------------------------------
    def on_message(self, msg: Any) -> None:
        t0 = time.monotonic()
        if isinstance(msg, RolloutBatch):
            self.received += 1
            for e in msg.events:
                self.on_event(e)
            for m in msg.samples:
                self.on_sample(m)
            for m in msg.interrupted:
                self.on_interrupted(m)
        elif isinstance(msg, RewardsReady):
            while self.scored:
                self.on_scored(*self.scored.popleft())
        elif isinstance(msg, UpdateDone):
            self.on_update(msg)
        elif isinstance(msg, Event):
            self.on_event(msg)
        self.controller_s += time.monotonic() - t0

    def on_event(self, msg: Event) -> None:
        f = dict(msg.fields)
        if msg.type == "span":  # worker clocks are absolute: put spans on the run's clock
            f["start"], f["end"] = self.rec.since_start(f["start"]), self.rec.since_start(f["end"])
            self.spans.setdefault(f["role"], []).append((f["start"], f["end"]))
        elif msg.type == "weight_reload":
            self.reload_times.append(f["reload_s"])
        self.rec.event(msg.type, t=self.rec.since_start(msg.t), **f)

    def async_stats(self) -> dict[str, Any]:
        """The `async` section of summary.json: waits, weight sync, controller cost."""
        def mean(xs: list[float]) -> float:
            return sum(xs) / len(xs) if xs else 0.0

        write = mean([u["time/weight_write_s"] for u in self.updates])
        commit = mean([u["time/commit_latency_s"] for u in self.updates])
        reload = mean(self.reload_times)
        return {
            "skipped_commits": self.skipped_commits,
            "waits": dict(self.waits),
            "controller_ms_per_sample": 1000 * self.controller_s / max(len(self.samples), 1),
            "weight_sync": {"write_s": write, "commit_latency_s": commit, "reload_s": reload,
                            "per_version_s": write + commit + reload,
                            "reloads": len(self.reload_times)},
        }

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
        self.in_flight -= 1
        self.generated += 1
        group = self.groups[msg.slot.group_id]
        gen = Generation(msg.prompt_ids, msg.response_ids, msg.logprobs, msg.versions,
                         msg.finished)
        scored = {"response": msg.text, **result}
        version = self.version()
        row = sample_row(self.next_sample, group.prompt, gen, scored, version, "accepted",
                         t_emit=self.rec.since_start(msg.t_emit), attempt=msg.slot.attempt,
                         worker=msg.worker)
        row["staleness_at_arrival"] = row["staleness"]
        self.next_sample += 1
        stale = self.filter_on_arrival and row["staleness"] > self.k
        self.manager.returned(accepted=not stale)
        if stale:
            self._drop_stale(Pending(row, gen), version)
        else:
            group.accepted.append(Pending(row, gen))
        self._resolve(group)

    def on_interrupted(self, msg: InterruptedMsg) -> None:
        self.in_flight -= 1
        self.manager.returned(accepted=False)
        self.interrupted_tokens += msg.tokens
        self.rec.event("interrupted_attempt", t=self.rec.since_start(msg.t),
                       group_id=msg.slot.group_id, attempt=msg.slot.attempt, tokens=msg.tokens)
        if msg.slot.attempt < self.cfg.staleness.max_retries:
            self.resubmissions += 1
            self.resubmit.append(replace(msg.slot, attempt=msg.slot.attempt + 1))
            self.rec.event("resubmission", group_id=msg.slot.group_id,
                           attempt=msg.slot.attempt + 1)
            return
        group = self.groups[msg.slot.group_id]
        row = {
            "sample_id": self.next_sample, "task_id": group.prompt.task.task_id,
            "group_id": group.prompt.group_id, "policy_version": msg.old_version,
            "policy_version_max": msg.old_version, "current_version": msg.new_version,
            "staleness": None, "status": "dropped_interrupted", "reward": 0.0, "pass": False,
            "response": None, "response_tokens": msg.tokens, "finished": False,
            "logprob_sum": None, "attempt": msg.slot.attempt, "worker": msg.worker,
            "t_emit": self.rec.since_start(msg.t),
        }
        self.next_sample += 1
        self._write(row)
        self._resolve(group)

    def on_update(self, msg: UpdateDone) -> None:
        items = self.in_training.pop(msg.batch_id)
        rows = [i.row for i in items]
        self.outstanding[msg.trainer] -= 1
        self._record_commit(msg)
        if not msg.applied:
            self.skipped_commits += 1
            self.manager.released(len(rows))
            self.rec.event("update_skipped", batch_id=msg.batch_id, trainer=msg.trainer,
                           reason=msg.reason)
            for r in rows:
                r["batch_id"] = None  # accepted, never trained
            return
        # Rows are encoded only when the run is finalized, so correcting them here is safe:
        # the base actually used is exact even when several trainers raced past the plan.
        for item in items:
            item.row["current_version"] = msg.base_version
            item.row["staleness"] = msg.base_version - item.row["policy_version"]
            self.token_staleness["accepted"] += [msg.base_version - v for v in item.gen.versions]
        t = self.rec.since_start(msg.t_commit)
        row = update_row(msg.version, msg.batch_id, rows, msg.stats, t_commit=t)
        self.updates.append(row)
        self.rec.update(row)
        self.trained_tokens += row["tokens"]
        self.progress(len(self.updates), row["pass_rate"], self.trained_tokens, t)
        if self.done and self.t_done is None:
            self.t_done = msg.t_commit

    def _record_commit(self, msg: UpdateDone) -> None:
        """The events of an update attempt: the trainer's busy span, and the parameter
        service's decision when it made one."""
        self.on_event(Event("span", msg.t_commit, {
            "worker": f"trainer{msg.trainer}", "role": "trainer", "start": msg.t_start,
            "end": msg.t_commit}))
        if msg.commit_s is None:
            return
        ids = {"trainer": msg.trainer, "batch_id": msg.batch_id}
        if msg.applied:
            self.on_event(Event("version_change", msg.t_commit, {
                "old_version": msg.version - 1, "new_version": msg.version, **ids,
                "commit_s": msg.commit_s}))
        else:
            self.on_event(Event("commit_skipped", msg.t_commit, {
                "version": msg.version, **ids, "reason": msg.reason}))

    # --- bookkeeping -------------------------------------------------------------------
    def _write(self, row: dict[str, Any]) -> None:
        self.samples.append(row)
        self.rec.sample(row)

    def _drop_stale(self, item: Pending, version: int) -> None:
        item.row.update(status="dropped_stale", current_version=version,
                        staleness=version - item.row["policy_version"])
        self.token_staleness["dropped_stale"] += [version - v for v in item.gen.versions]
        self._write(item.row)

    def _resolve(self, group: Group) -> None:
        group.unresolved -= 1
        if group.unresolved == 0:
            del self.groups[group.prompt.group_id]
            if group.accepted:
                self.ready.append(group.accepted)

    # --- dispatch ----------------------------------------------------------------------
    def pump(self) -> None:
        """Dispatch what the rules allow; account the time spent blocked since the last call."""
        now = time.monotonic()
        for reason in self._blocked:
            self.waits[reason] += now - self._last_pump
        self._last_pump = now
        self._blocked = set()
        if not self.done:
            self._dispatch_prompts()
            self._dispatch_batches()
        self.controller_s += time.monotonic() - now
        if now - self._last_depths >= 0.025:
            self._last_depths = now
            counters = list(self.ch.counters)
            taken, sent = sum(counters[0::2]), sum(counters[1::2])
            self.rec.event("queues", prompt_queue=self.dispatched - taken,
                           sample_queue=sent - self.received, generating=taken - (
                               self.dispatched - self.in_flight),
                           replay_buffer=self.buffered(), trainer_queue=len(self.in_training),
                           version=self.version())

    def _dispatch_prompts(self) -> None:
        # Resubmissions first and outside the throttle: their group already holds capacity.
        if self.resubmit:
            self._put(list(self.resubmit))
            self.resubmit.clear()
        target = 2 * self.batch_size  # keep rollout fed: the batch being generated and the next
        g = self.cfg.rollout.group_size
        slots: list[PromptSlot] = []
        while self.in_flight + len(slots) < target:
            if self.throttle and self.manager.capacity(self.version()) <= len(slots):
                self._blocked.add("rollout_throttle_s")
                break
            if self.ratio is not None and self._rollout_ahead_of_ratio(len(slots) + g):
                self._blocked.add("rollout_ratio_s")
                break
            prompt = self.stream.take(1)[0]
            self.groups[prompt.group_id] = Group(prompt, unresolved=g)
            slots += [PromptSlot(self.next_slot + i, prompt.group_id, prompt.task.prompt)
                      for i in range(g)]
            self.next_slot += g
        # One message per pump: a rollout worker woken by the first of several group messages
        # would start generating a fraction of a batch, at nearly the cost of a whole one.
        if slots:
            self._put(slots)

    def _put(self, slots: list[PromptSlot]) -> None:
        self.ch.prompt_q.put(slots)
        self.in_flight += len(slots)
        self.dispatched += len(slots)
        self.manager.submitted(len(slots))

    def _rollout_ahead_of_ratio(self, n: int) -> bool:
        """The rollout side waits when more than two batches ahead of the beta ratio --
        unless the trainer is idle for lack of data (then rollout is the slow side)."""
        trainer_starving = not self.in_training and self.buffered() < self.batch_size
        limit = self.ratio * self.batch_size * (self.next_batch + 2)
        return not trainer_starving and self.generated + self.in_flight + n > limit

    def base_version(self) -> int:
        """The version the next dispatched batch will be trained from: the current one plus
        every update still in flight (an upper bound if one of them is skipped)."""
        return self.version() + len(self.in_training)

    def _dispatch_batches(self) -> None:
        while len(self.updates) + len(self.in_training) < self.cfg.train.updates:
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
        """Exactly B fresh samples from the front of the buffer, whole groups first."""
        for group in self.ready:  # drop what went stale while waiting
            fresh = []
            for item in group:
                if version - item.row["policy_version"] > self.k:
                    self.manager.released(1)
                    self._drop_stale(item, version)
                else:
                    fresh.append(item)
            group[:] = fresh
        while self.ready and not self.ready[0]:
            self.ready.popleft()
        if self.buffered() < self.batch_size:
            return None
        batch: list[Pending] = []
        while len(batch) < self.batch_size:
            group = self.ready[0]
            room = self.batch_size - len(batch)
            batch += group[:room]
            del group[:room]
            if not group:
                self.ready.popleft()
        return batch

    def _send_batch(self, trainer: int, batch: list[Pending]) -> None:
        version = self.base_version()
        self.outstanding[trainer] += 1
        batch_id = self.next_batch
        self.next_batch += 1
        rows = []
        for item in batch:
            item.row.update(current_version=version, batch_id=batch_id,
                            staleness=version - item.row["policy_version"])
            self._write(item.row)
            rows.append(item.row)
        self.in_training[batch_id] = batch
        self.ch.trainer_qs[trainer].put(TrainRequest(
            batch_id, version, train_batch(rows, [i.gen for i in batch], self.cfg)))

    def flush_buffer(self) -> None:
        """At the end: accepted samples never trained are recorded as such."""
        self.rewards.close()  # lets the evaluations under way finish (each within its timeout)
        while self.scored:
            self.on_scored(*self.scored.popleft())
        for group in list(self.ready) + [g.accepted for g in self.groups.values()]:
            for item in group:
                item.row["batch_id"] = None
                self._write(item.row)
        self.ready.clear()
