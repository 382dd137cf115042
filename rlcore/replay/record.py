"""The replay's record: the replayed run written through the run ledger, record by record
in the original schedule's order, so that its files line up with the original's (sample
ids, row order, update rows), and only its times differ.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlcore.policy.sampler import Generation
from rlcore.record.ledger import RunLedger
from rlcore.record.schedule import Commit, SampleFate, Schedule, ScheduleError
from rlcore.tasks.prompts import Prompt


@dataclass
class Replayed:
    """One generated row of the replay: emitted (a sample) or cut (an interrupted attempt)."""

    gen: Generation
    text: str | None
    result: dict[str, Any] | None
    worker: str
    t_emit: float

    @property
    def reward(self) -> float:
        """The reward of an emitted sample."""
        assert self.result is not None, "an interrupted attempt has no reward"
        return self.result["reward"]


@dataclass(frozen=True)
class ReplayOutcome:
    """What a replay computed, as its record needs it."""

    schedule: Schedule
    rows: Mapping[tuple[int, int], Replayed]  # (slot, attempt): the generated row
    update_stats: Mapping[int, tuple[dict[str, float], float]]  # batch id: stats, time
    skipped_steps: int  # optimizer steps the loss scaler skipped, in every update replayed
    advantages: Mapping[int, float]  # sample id: the advantage its applied update used
    spans: Sequence[tuple[str, str, float, float, int]]  # role, worker, start, end, samples
    prompt: Callable[[int], Prompt]  # the prompt of a group id


def record_replay(led: RunLedger, rp: ReplayOutcome) -> None:
    """Write the replayed run through the ledger, record by record in the original order,
    so that its files line up with the original's."""
    s = rp.schedule
    led.count_skipped_steps(rp.skipped_steps)
    for role, worker, start, end, samples in sorted(rp.spans, key=lambda x: x[3]):
        # a replay re-executes a schedule, timed but not tallied: its spans carry no work
        led.span(role, worker, start, end, samples=samples, work={})
    waiting: dict[int, set[int]] = {}  # applied batches whose samples are not all settled
    interrupts = {(r["slot"], r["attempt"]): r for r in s.interrupts}
    for kind, item in s.order:
        if kind == "generate":
            led.generation(item)
        elif kind == "interrupt":
            row = rp.rows[(item["slot"], item["attempt"])]
            led.interrupted_attempt(
                worker=row.worker, slot=item["slot"], group_id=item["group_id"],
                attempt=item["attempt"], tokens=len(row.gen.response_ids),
                old_version=item["old_version"], new_version=item["new_version"],
                resubmitted=item["resubmitted"], t=row.t_emit)
        elif kind == "sample":
            _record_sample(led, rp, item, interrupts)
            for batch_id, ids in list(waiting.items()):
                ids.discard(item.sample_id)
                if not ids:
                    del waiting[batch_id]
                    _record_update(led, rp, s.commits[batch_id])
        elif kind == "trainer_op":
            led.trainer_steps([item])
        elif kind == "commit":
            led.commit(batch_id=item.batch_id, trainer=item.trainer,
                       base_version=item.base_version, sample_ids=item.sample_ids,
                       outcome=item.outcome, version=item.version, reason=item.reason)
            if item.outcome == "applied":  # recorded once its samples are settled
                waiting[item.batch_id] = set(item.sample_ids) - led.settled_ids()
                if not waiting[item.batch_id]:
                    del waiting[item.batch_id]
                    _record_update(led, rp, item)
            else:
                if item.outcome == "skipped":  # decided by a service, or by sync
                    led.event("commit_skipped", version=item.version, batch_id=item.batch_id,
                              trainer=item.trainer, reason=item.reason)
                led.event("update_skipped", batch_id=item.batch_id, trainer=item.trainer,
                          reason=item.reason)
    if waiting:
        raise ScheduleError(f"batches {sorted(waiting)} were applied but their samples "
                            "were never settled")

def _record_sample(led: RunLedger, rp: ReplayOutcome, fate: SampleFate,
                   interrupts: dict[tuple[int, int], dict[str, Any]]) -> None:
    prompt = rp.prompt(fate.group_id)
    row = rp.rows[(fate.slot, fate.attempt)]
    if fate.status == "dropped_interrupted":
        led.drop_interrupted(prompt, slot=fate.slot, attempt=fate.attempt,
                             tokens=len(row.gen.response_ids),
                             old_version=interrupts[(fate.slot, fate.attempt)]["old_version"],
                             new_version=fate.version, worker=row.worker, t_emit=row.t_emit,
                             sample_id=fate.sample_id)
        return
    assert row.result is not None and fate.arrival_version is not None, "an emitted sample"
    led.arrive(prompt, row.gen, {"response": row.text, **row.result},
               current_version=fate.arrival_version, slot=fate.slot, attempt=fate.attempt,
               worker=row.worker, t_emit=row.t_emit, sample_id=fate.sample_id)
    led.settle(fate.sample_id, fate.status, current_version=fate.version,
               batch_id=fate.batch_id,
               advantage=None if fate.batch_id is None else rp.advantages[fate.sample_id])

def _record_update(led: RunLedger, rp: ReplayOutcome, commit: Commit) -> None:
    stats, t = rp.update_stats[commit.batch_id]
    led.event("version_change", t=t, old_version=commit.version - 1,
              new_version=commit.version, batch_id=commit.batch_id, trainer=commit.trainer)
    led.record_update(commit.version, commit.batch_id, commit.sample_ids, stats, t_commit=t)
