"""The schedule: what timing decided in a run, recorded so that `rlcore replay` can redo it.

A run is determined by its config, its base model and the decisions its clocks made. The
schedule records those decisions and nothing that depends on wall time:

  generate    one generation batch of a rollout worker: its rows (slot, attempt, group) in
              order, the policy version it started from, how many chunks it ran, the weight
              swaps between chunks (interrupts: `[after_chunk, version]`), and the rows cut off
              unfinished (`cut`, after chunk `cut_after`, by an `interrupt` or by the `stop`
              of the run); every other row was emitted;
  interrupt   an attempt abandoned by `interrupt: resubmit`, and whether it was resubmitted;
  sample      a sample's fate: its slot and attempt, the version it arrived at, its status
              (accepted, dropped_stale, dropped_interrupted), the version it was settled
              against and the batch that trained it;
  trainer_op  one trainer's step, numbered per trainer: `load` of a published version, or
              `update` of a batch from the trainer's own version (`version`);
  commit      the verdict on a batch: applied (and the version it made), skipped by the
              parameter service, or refused by the trainer; with the samples, in order;
  end         the last line, with the number of records before it: a truncated file has none.

Every record carries `seq`, its line number, so that a record removed from the file is
found. Sampling randomness is not recorded: it is re-derived per (seed, slot, attempt,
token position) (`rlcore/policy/sampler.py::token_uniform`).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlcore.errors import ReplayError

SCHEDULE_FILE = "schedule.jsonl"

# Every record type and its fields besides `seq` and `type`.
RECORD_FIELDS: dict[str, tuple[str, ...]] = {
    "generate": ("worker", "rows", "version", "chunks", "swaps", "cut_after", "cut",
                 "cut_reason"),
    "interrupt": ("slot", "attempt", "group_id", "tokens", "old_version", "new_version",
                  "resubmitted"),
    "sample": ("sample_id", "slot", "attempt", "group_id", "arrival_version", "status",
               "version", "batch_id"),
    "trainer_op": ("trainer", "trainer_seq", "op", "version", "batch_id"),
    "commit": ("batch_id", "trainer", "base_version", "sample_ids", "outcome", "version",
               "reason"),
    "end": ("records",),
}
OUTCOMES = ("applied", "skipped", "refused")


class ScheduleError(ReplayError):
    """A schedule that cannot be replayed: missing, truncated, edited or inconsistent."""


class Divergence(ReplayError):
    """A verification found a value that differs from the original's."""


@dataclass
class GenerationRecord:
    """One generation batch as it ran (a `generate` record)."""

    worker: str
    rows: list[tuple[int, int, int]]  # (slot, attempt, group_id) per row, in batch order
    version: int  # of the weights it started with
    chunks: int = 0  # sampler chunks it ran
    swaps: list[tuple[int, int]] = field(default_factory=list)  # (after chunk, new version)
    cut_after: int | None = None
    cut: list[int] = field(default_factory=list)  # row indices cut off unfinished
    cut_reason: str | None = None  # "interrupt" | "stop"
    seq: int = -1  # its line in the schedule, once read

    def swap(self, after_chunk: int, version: int) -> None:
        self.swaps.append((after_chunk, version))

    def cut_rows(self, after_chunk: int, rows: list[int], reason: str) -> None:
        if rows:
            self.cut_after, self.cut, self.cut_reason = after_chunk, list(rows), reason

    def versions(self) -> set[int]:
        """Every policy version whose weights this batch samples with."""
        return {self.version, *(v for _, v in self.swaps)}

    def fields(self) -> dict[str, Any]:
        return {"worker": self.worker, "rows": [list(r) for r in self.rows],
                "version": self.version, "chunks": self.chunks,
                "swaps": [list(s) for s in self.swaps], "cut_after": self.cut_after,
                "cut": self.cut, "cut_reason": self.cut_reason}


@dataclass(frozen=True)
class TrainerOp:
    """One trainer step: `load` the published `version`, or `update` batch `batch_id` from
    the trainer's own `version`."""

    trainer: int
    trainer_seq: int
    op: str
    version: int
    batch_id: int | None = None

    @property
    def batch(self) -> int:
        """The batch of a `train` step."""
        if self.batch_id is None:
            raise ScheduleError(f"trainer {self.trainer} step {self.trainer_seq} ({self.op}) "
                                "names no batch")
        return self.batch_id

    def fields(self) -> dict[str, Any]:
        return {"trainer": self.trainer, "trainer_seq": self.trainer_seq, "op": self.op,
                "version": self.version, "batch_id": self.batch_id}


class ScheduleLog:
    """The records of a run in the order the ledger learns them (held in memory, written
    once at the end, off the measured clock)."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def add(self, kind: str, **fields: Any) -> None:
        if tuple(fields) != RECORD_FIELDS[kind]:
            raise ValueError(f"schedule record '{kind}' carries {list(fields)}, expected "
                             f"{list(RECORD_FIELDS[kind])}")
        self.records.append({"seq": len(self.records), "type": kind, **fields})

    def lines(self) -> list[str]:
        """The file's lines, `end` last."""
        end = {"seq": len(self.records), "type": "end", "records": len(self.records)}
        return [json.dumps(r) for r in [*self.records, end]]


@dataclass(frozen=True)
class SampleFate:
    sample_id: int
    slot: int
    attempt: int
    group_id: int
    arrival_version: int | None
    status: str
    version: int
    batch_id: int | None
    seq: int


@dataclass(frozen=True)
class Commit:
    batch_id: int
    trainer: int
    base_version: int
    sample_ids: list[int]
    outcome: str
    version: int
    reason: str
    seq: int


@dataclass
class Schedule:
    """A schedule read back and checked: every record, indexed for replay."""

    generations: list[GenerationRecord]
    interrupts: list[dict[str, Any]]
    samples: list[SampleFate]  # in the order they were settled
    trainer_ops: dict[int, list[TrainerOp]]  # per trainer, in its own order
    commits: dict[int, Commit]  # by batch id
    records: int

    order: list[tuple[str, Any]]  # every record but `end`, in file order, as parsed

    def __post_init__(self) -> None:
        self.fates = {s.sample_id: s for s in self.samples}
        self._emitted = {(s.slot, s.attempt): s for s in self.samples
                         if s.status != "dropped_interrupted"}

    def sample(self, slot: int, attempt: int) -> SampleFate | None:
        """The fate of the emitted sample of this slot and attempt; None for one that was
        never scored (code rewards still queued when the run ended)."""
        return self._emitted.get((slot, attempt))


def _parse_line(n: int, line: str) -> dict[str, Any]:
    try:
        rec = json.loads(line)
    except json.JSONDecodeError:
        raise ScheduleError(f"{SCHEDULE_FILE} line {n + 1} is not a JSON record: the file is "
                            "truncated or was edited") from None
    if not isinstance(rec, dict) or rec.get("type") not in RECORD_FIELDS:
        raise ScheduleError(f"{SCHEDULE_FILE} line {n + 1} is not a schedule record (type "
                            f"{rec.get('type') if isinstance(rec, dict) else rec!r})")
    if rec.get("seq") != n:
        raise ScheduleError(f"{SCHEDULE_FILE}: record seq {n} is missing (line {n + 1} holds "
                            f"seq {rec.get('seq')}): a record was removed or reordered")
    expected = {"seq", "type", *RECORD_FIELDS[rec["type"]]}
    if set(rec) != expected:
        raise ScheduleError(f"{SCHEDULE_FILE} line {n + 1}: a '{rec['type']}' record needs "
                            f"fields {sorted(expected)}, it has {sorted(rec)}")
    return rec


def read_schedule(run_dir: str | Path) -> Schedule:
    """Read and check `run_dir`/schedule.jsonl; raises ScheduleError naming the problem."""
    path = Path(run_dir) / SCHEDULE_FILE
    if not path.is_file():
        raise ScheduleError(f"'{run_dir}' has no {SCHEDULE_FILE}: it is not a run directory, "
                            "or rlcore recorded it before schedules existed; rerun it to "
                            "replay it")
    text = path.read_text()
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    recs = [_parse_line(n, line) for n, line in enumerate(lines)]
    if not recs or recs[-1]["type"] != "end" or not text.endswith("\n"):
        raise ScheduleError(f"{SCHEDULE_FILE} ends without its 'end' record: the file is "
                            "truncated")
    if recs[-1]["records"] != len(recs) - 1:
        raise ScheduleError(f"{SCHEDULE_FILE}: the 'end' record counts {recs[-1]['records']} "
                            f"records, the file has {len(recs) - 1}")
    gens: list[GenerationRecord] = []
    interrupts: list[dict[str, Any]] = []
    samples: list[SampleFate] = []
    ops: dict[int, list[TrainerOp]] = defaultdict(list)
    commits: dict[int, Commit] = {}
    order: list[tuple[str, Any]] = []
    for r in recs[:-1]:
        kind, seq = r["type"], r["seq"]
        f = {k: r[k] for k in RECORD_FIELDS[kind]}
        item: Any
        if kind == "generate":
            item = GenerationRecord(f["worker"], [tuple(x) for x in f["rows"]], f["version"],
                                    f["chunks"], [tuple(s) for s in f["swaps"]],
                                    f["cut_after"], f["cut"], f["cut_reason"], seq)
            gens.append(item)
        elif kind == "interrupt":
            item = {**f, "seq": seq}
            interrupts.append(item)
        elif kind == "sample":
            item = SampleFate(**f, seq=seq)
            samples.append(item)
        elif kind == "trainer_op":
            item = TrainerOp(**f)
            ops[f["trainer"]].append(item)
        else:
            if f["outcome"] not in OUTCOMES:
                raise ScheduleError(f"{SCHEDULE_FILE} record {seq}: commit outcome "
                                    f"'{f['outcome']}' is not one of {list(OUTCOMES)}")
            item = Commit(**f, seq=seq)
            commits[f["batch_id"]] = item
        order.append((kind, item))
    for trainer, trainer_ops in ops.items():
        trainer_ops.sort(key=lambda o: o.trainer_seq)
        for i, op in enumerate(trainer_ops):
            if op.trainer_seq != i:
                raise ScheduleError(f"{SCHEDULE_FILE}: trainer{trainer}'s step {i} is missing "
                                    f"(its steps jump to {op.trainer_seq})")
    schedule = Schedule(gens, interrupts, samples, dict(ops), commits, len(recs) - 1, order)
    _check_references(schedule)
    return schedule


def _check_references(s: Schedule) -> None:
    """Every sample, interrupt, commit and version the schedule names is produced in it."""
    emitted: set[tuple[int, int]] = set()
    cut: set[tuple[int, int]] = set()
    for g in s.generations:
        for i, (slot, attempt, _) in enumerate(g.rows):
            (cut if i in g.cut else emitted).add((slot, attempt))
    for fate in s.samples:
        key = (fate.slot, fate.attempt)
        produced = cut if fate.status == "dropped_interrupted" else emitted
        if key not in produced:
            raise ScheduleError(
                f"{SCHEDULE_FILE} record {fate.seq}: sample {fate.sample_id} (slot {fate.slot}, "
                f"attempt {fate.attempt}) was never generated: its 'generate' record is missing")
    for rec in s.interrupts:
        if (rec["slot"], rec["attempt"]) not in cut:
            raise ScheduleError(
                f"{SCHEDULE_FILE} record {rec['seq']}: the interrupt of slot {rec['slot']}, "
                f"attempt {rec['attempt']} has no generation that cut it")
    ids = {f.sample_id for f in s.samples}
    published = {0} | {c.version for c in s.commits.values() if c.outcome == "applied"}
    for c in s.commits.values():
        missing = [i for i in c.sample_ids if i not in ids]
        if missing:
            raise ScheduleError(f"{SCHEDULE_FILE} record {c.seq}: batch {c.batch_id} trains "
                                f"samples {missing[:5]} that have no 'sample' record")
    for g in s.generations:
        for v in sorted(g.versions() - published):
            raise ScheduleError(f"{SCHEDULE_FILE} record {g.seq}: a generation samples with "
                                f"version {v}, which no applied commit produces")
    for trainer_ops in s.trainer_ops.values():
        for op in trainer_ops:
            if op.op == "load" and op.version not in published:
                raise ScheduleError(f"{SCHEDULE_FILE}: trainer{op.trainer}'s step "
                                    f"{op.trainer_seq} loads version {op.version}, which no "
                                    "applied commit produces")
            if op.op == "update" and op.batch_id not in s.commits:
                raise ScheduleError(f"{SCHEDULE_FILE}: trainer{op.trainer}'s step "
                                    f"{op.trainer_seq} trains batch {op.batch_id}, which has "
                                    "no 'commit' record")
