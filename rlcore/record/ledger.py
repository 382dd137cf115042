"""The run ledger: the one owner of what a run records, in every mode.

Runners only schedule; every fact they learn goes through a `RunLedger` call, which writes it
in the one vocabulary `docs/metrics.md` defines:

  samples   `arrive` opens a sample when it is scored; `settle` decides its fate (accepted,
            trained in a batch or not, dropped as stale) and records the row, final from then
            on; `drop_interrupted` records a slot whose last attempt was interrupted;
  updates   `record_update`, one row per applied commit, computed from its settled samples;
            `count_skipped_steps`, the loss scaler's skipped steps of every update computed;
  events    `event`, checked against `EVENT_FIELDS`; `span` and `busy` time the roles;
  schedule  what timing decided (`rlcore/record/schedule.py`): `generation`, `trainer_steps` and
            `commit`, plus a record from every `settle`, `drop_interrupted` and
            `interrupted_attempt`;
  tokens    `count_tokens` from the samplers, so the token ledger is a real check;
  summary   `finish` derives summary.json and staleness.json from the above
            (`rlcore/record/summary.py`) and hands them, with config.json, to the run directory
            (`rlcore/record/rundir.py`), summary.json last.

Times are on the measured clock: seconds since every worker was ready (`start_clock`).
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from rlcore.algo import metrics
from rlcore.algo.staleness import rollout_version, staleness, token_staleness
from rlcore.clock import WALL, Clock
from rlcore.config import RunConfig
from rlcore.policy.hf_policy import HFPolicy
from rlcore.policy.optim_steps import STEP_KEYS
from rlcore.policy.sampler import Generation
from rlcore.policy.sampling_weights import DTYPE_NAMES, sampling_dtype
from rlcore.record.identity import RunId
from rlcore.record.live_metrics import TB_DIR, LiveMetrics, update_scalars
from rlcore.record.machine_load import LoadMeter, process_age_s
from rlcore.record.rundir import RunDirectory, environment_info
from rlcore.record.samples import OpenSample, sample_row
from rlcore.record.schedule import SCHEDULE_FILE, GenerationRecord, ScheduleLog, TrainerOp
from rlcore.record.summary import (
    LedgerSnapshot,
    build_summary,
    mismatch_warning,
    profile_mismatch,
    reproducibility,
    staleness_stats,
)
from rlcore.tasks.prompts import Prompt
from rlcore.tasks.sandbox import detect_isolation

ROLES = ("rollout", "controller", "trainer")

# Every event type and the fields it carries (besides `t` and `type`), in every mode.
EVENT_FIELDS: dict[str, frozenset[str]] = {k: frozenset(v) for k, v in {
    "run_start": ("cold_start_s",),
    "worker_ready": ("worker", "pid", "device", "load_s", "cpus"),
    "span": ("role", "worker", "start", "end", "samples", "work"),
    "queues": ("prompt_queue", "sample_queue", "generating", "ready_buffer",
               "trainer_queue", "version"),
    "version_change": ("old_version", "new_version", "batch_id", "trainer"),
    "commit_skipped": ("version", "batch_id", "trainer", "reason"),
    "update_skipped": ("batch_id", "trainer", "reason"),
    "rollout_interrupt": ("worker", "old_version", "new_version", "interrupt"),
    "interrupted_attempt": ("worker", "group_id", "attempt", "tokens"),
    "resubmission": ("group_id", "attempt"),
    "weight_reload": ("worker", "version", "reload_s"),
    "handoff": ("worker", "samples", "handoff_s"),
}.items()}

# The commit timings of an update applied in place, where no weights move (sync): zero.
IN_PLACE_COMMIT = {"time/weight_write_s": 0.0, "time/commit_latency_s": 0.0,
                   "time/commit_s": 0.0}


class RunLedger:
    """Records one run into its directory; see the module docstring for the vocabulary."""

    def __init__(self, cfg: RunConfig, out_dir: str | Path, force: bool = False,
                 clock: Clock = WALL):
        self.cfg, self.clock = cfg, clock
        self.profile_mismatch = profile_mismatch(cfg, clock.profile)  # None on the wall clock
        if clock.profile is not None and self.profile_mismatch:
            print(mismatch_warning(clock.profile, self.profile_mismatch), file=sys.stderr)
        self.dir = RunDirectory(out_dir, force=force)
        self.t0 = clock.now()
        # What the job spent before this run began: interpreter start, imports, config.
        self.startup_s = process_age_s() or 0.0
        # When the job began, in this machine's epoch seconds: which runs ran back to back
        self.started_unix = time.time() - self.startup_s
        self._host_t0 = time.perf_counter()  # on any clock: what the job costs this machine
        self.samples: list[dict[str, Any]] = []
        self.updates: list[dict[str, Any]] = []
        self._open: dict[int, OpenSample] = {}
        self._rows: dict[int, dict[str, Any]] = {}
        self._next_id = 0
        self.spans: dict[str, list[tuple[float, float]]] = {r: [] for r in ROLES}
        self._untraced = dict.fromkeys(ROLES, 0.0)
        self.event_counts = dict.fromkeys(EVENT_FIELDS, 0)
        self.reload_s: list[float] = []
        self.token_staleness: dict[str, list[int]] = {"accepted": [], "dropped_stale": []}
        self.tokens = {"sampled": 0, "reprefilled": 0, "kv_kept": 0, "abandoned": 0,
                       "interrupted": 0, "trained": 0}
        self.skipped_steps = 0
        self.load = LoadMeter()
        self._worker_cpu_s = 0.0
        self.schedule = ScheduleLog()
        self.live = LiveMetrics(self.dir.stage_dir(TB_DIR)) if cfg.runtime.tensorboard else None
        self.epoch0 = time.time()  # the wall time at which the measured clock started

    # --- clock ---------------------------------------------------------------------------
    def start_clock(self, t0: float | None = None) -> None:
        """Start the measured clock (after every worker has loaded its model).

        The run's clock is one clock for every role (the wall clock is CLOCK_MONOTONIC on
        Linux, one for every process), so worker timestamps can be placed on it (`on_clock`).
        """
        self.t0 = self.clock.now() if t0 is None else t0
        self.epoch0 = time.time()
        self.load.start()

    def now(self) -> float:
        """Seconds since the measured clock started."""
        return self.clock.now() - self.t0

    def on_clock(self, t: float) -> float:
        """An absolute reading of the run's clock (from any role) on the measured clock."""
        return t - self.t0

    # --- samples -------------------------------------------------------------------------
    def _new_id(self, sample_id: int | None) -> int:
        """The next sample id, or the given one (a replay keeps the ids it replays)."""
        if sample_id is None:
            sample_id = self._next_id
        self._next_id = max(self._next_id, sample_id + 1)
        return sample_id

    def arrive(self, prompt: Prompt, gen: Generation, scored: dict[str, Any], *,
               current_version: int, slot: int, attempt: int, worker: str, t_emit: float,
               sample_id: int | None = None) -> int:
        """Open a scored sample (its staleness taken now, on arrival); returns its id."""
        sample_id = self._new_id(sample_id)
        v = rollout_version(gen.versions, current_version)
        self._open[sample_id] = OpenSample(prompt, gen, scored, current_version,
                                           staleness(current_version, v), slot, attempt,
                                           worker, t_emit)
        return sample_id

    def settle(self, sample_id: int, status: str, *, current_version: int,
               batch_id: int | None = None, advantage: float | None = None) -> dict[str, Any]:
        """Decide an open sample's fate and record its row: `accepted` (trained in
        `batch_id` with `advantage`, or never trained when None) or `dropped_stale`, against
        `current_version`."""
        if (batch_id is None) != (advantage is None):
            raise ValueError(f"sample {sample_id}: a trained sample has a batch and an "
                             f"advantage, an untrained one neither ({batch_id=}, {advantage=})")
        s = self._open.pop(sample_id)
        g = s.gen
        v = rollout_version(g.versions, current_version)  # the oldest token's
        row = sample_row(
            sample_id, s.prompt, slot=s.slot, attempt=s.attempt, worker=s.worker,
            policy_version=v,
            policy_version_max=max(g.versions) if g.versions else current_version,
            current_version=current_version, staleness=staleness(current_version, v),
            staleness_at_arrival=s.staleness_at_arrival, status=status, batch_id=batch_id,
            advantage=advantage, scored=s.scored, response_ids=list(g.response_ids),
            response_tokens=len(g.response_ids), finished=g.finished,
            logprob_sum=sum(g.logprobs), t_emit=s.t_emit)
        self.schedule.add("sample", sample_id=sample_id, slot=s.slot, attempt=s.attempt,
                          group_id=s.prompt.group_id, arrival_version=s.arrival_version,
                          status=status, version=current_version, batch_id=batch_id)
        if status == "dropped_stale":
            self.token_staleness["dropped_stale"] += token_staleness(current_version, g.versions)
        elif batch_id is not None:
            self.token_staleness["accepted"] += token_staleness(current_version, g.versions)
        self._record_sample(row)
        return row

    def interrupted_attempt(self, *, worker: str, slot: int, group_id: int, attempt: int,
                            tokens: int, old_version: int, new_version: int,
                            resubmitted: bool, t: float) -> None:
        """An attempt abandoned because the policy moved (`interrupt: resubmit`), and whether
        its slot gets another attempt."""
        self.tokens["interrupted"] += tokens
        self.event("interrupted_attempt", t=t, worker=worker, group_id=group_id,
                   attempt=attempt, tokens=tokens)
        self.schedule.add("interrupt", slot=slot, attempt=attempt, group_id=group_id,
                          tokens=tokens, old_version=old_version, new_version=new_version,
                          resubmitted=resubmitted)
        if resubmitted:
            self.event("resubmission", t=t, group_id=group_id, attempt=attempt + 1)

    def drop_interrupted(self, prompt: Prompt, *, slot: int, attempt: int, tokens: int,
                         old_version: int, new_version: int, worker: str, t_emit: float,
                         sample_id: int | None = None) -> None:
        """The row of a slot whose last allowed attempt was interrupted: no response."""
        sample_id = self._new_id(sample_id)
        self._record_sample(sample_row(
            sample_id, prompt, slot=slot, attempt=attempt, worker=worker,
            policy_version=old_version, policy_version_max=old_version,
            current_version=new_version, staleness=None, staleness_at_arrival=None,
            status="dropped_interrupted", batch_id=None, advantage=None,
            scored={"reward": 0.0, "pass": False, "response": None}, response_ids=None,
            response_tokens=tokens, finished=False, logprob_sum=None, t_emit=t_emit))
        self.schedule.add("sample", sample_id=sample_id, slot=slot, attempt=attempt,
                          group_id=prompt.group_id, arrival_version=None,
                          status="dropped_interrupted", version=new_version, batch_id=None)

    def settled_ids(self) -> set[int]:
        """Ids of the samples whose rows are recorded."""
        return set(self._rows)

    def _record_sample(self, row: dict[str, Any]) -> None:
        self.samples.append(row)
        self._rows[row["sample_id"]] = row

    # --- the schedule's own records --------------------------------------------------------
    def generation(self, record: GenerationRecord) -> None:
        """A generation batch as it ran: rows, versions, swaps and cuts."""
        self.schedule.add("generate", **record.fields())

    def trainer_steps(self, ops: Sequence[TrainerOp]) -> None:
        """Trainer steps (loads and updates) as a trainer reported them."""
        for op in ops:
            self.schedule.add("trainer_op", **op.fields())

    def commit(self, *, batch_id: int, trainer: int, base_version: int,
               sample_ids: Sequence[int], outcome: str, version: int, reason: str) -> None:
        """The verdict on a batch: applied (making `version`), skipped or refused."""
        self.schedule.add("commit", batch_id=batch_id, trainer=trainer,
                          base_version=base_version, sample_ids=list(sample_ids),
                          outcome=outcome, version=version, reason=reason)

    # --- updates -------------------------------------------------------------------------
    def record_update(self, version: int, batch_id: int, sample_ids: Sequence[int],
                      stats: dict[str, float], t_commit: float) -> dict[str, Any]:
        """One line of updates.jsonl: the applied commit that produced `version`."""
        rows = [self._rows[i] for i in sample_ids]
        row = {
            "version": version,
            "batch_id": batch_id,
            "sample_ids": list(sample_ids),
            "batch_size": len(rows),
            "reward_mean": sum(r["reward"] for r in rows) / len(rows),
            "pass_rate": sum(r["pass"] for r in rows) / len(rows),
            "staleness_mean": sum(r["staleness"] for r in rows) / len(rows),
            "staleness_max": max(r["staleness"] for r in rows),
            "tokens": sum(r["response_tokens"] for r in rows),
            **{k: v for k, v in stats.items() if k not in STEP_KEYS},
            "t_commit": t_commit,
        }
        self.updates.append(row)
        self.tokens["trained"] += row["tokens"]
        self.dir.write("updates", row)
        if self.live is not None:
            self.live.write(update_scalars(row), step=version, walltime=self.epoch0 + t_commit)
        return row

    # --- events and time -----------------------------------------------------------------
    def event(self, kind: str, t: float | None = None, **fields: Any) -> None:
        """One line of events.jsonl; `t` on the measured clock (now if None)."""
        if fields.keys() != EVENT_FIELDS[kind]:
            raise ValueError(f"event '{kind}' carries {sorted(fields)}, the vocabulary says "
                             f"{sorted(EVENT_FIELDS[kind])}")
        self.event_counts[kind] += 1
        if kind == "weight_reload":
            self.reload_s.append(fields["reload_s"])
        self.dir.write("events", {"t": self.now() if t is None else t, "type": kind, **fields})

    def span(self, role: str, worker: str, start: float, end: float, samples: int,
             work: dict[str, float]) -> None:
        """A busy span of one worker of a role (measured clock), for the trace and busy time,
        with the work it computed (`clock.take_work()`), which `calibrate --from-runs` fits."""
        self.spans[role].append((start, end))
        self.event("span", t=end, role=role, worker=worker, start=start, end=end,
                   samples=samples, work=work)

    def busy(self, role: str, seconds: float) -> None:
        """Busy time too fine-grained to trace as spans (the controller's handlers)."""
        self._untraced[role] += seconds

    def busy_s(self, role: str) -> float:
        return sum(e - s for s, e in metrics.merge_spans(self.spans[role])) \
            + self._untraced[role]

    def snapshot(self) -> LedgerSnapshot:
        """The ledger as it stands, frozen for the summary."""
        return LedgerSnapshot(
            cfg=self.cfg, samples=tuple(self.samples), updates=tuple(self.updates),
            tokens=dict(self.tokens), event_counts=dict(self.event_counts),
            skipped_steps=self.skipped_steps,
            reload_s=tuple(self.reload_s),
            token_staleness={k: tuple(v) for k, v in self.token_staleness.items()},
            startup_s=self.startup_s,
            started_unix=self.started_unix,
            job_s=self.startup_s + time.perf_counter() - self._host_t0,
            spans={r: metrics.merge_spans(self.spans[r]) for r in ROLES},
            busy_s={r: self.busy_s(r) for r in ROLES})

    def count_skipped_steps(self, steps: int) -> None:
        """Optimizer steps of an update, applied or not, that the fp16 loss scaler skipped
        (`optim_steps.skipped_steps`)."""
        self.skipped_steps += steps

    def count_tokens(self, *, sampled: int = 0, reprefilled: int = 0, kv_kept: int = 0,
                     abandoned: int = 0) -> None:
        """Tokens as the samplers counted them: sampled, recomputed by a re-prefill, kept in
        the cache instead (keep_kv), and cut off unfinished by the end of the run."""
        self.tokens["sampled"] += sampled
        self.tokens["reprefilled"] += reprefilled
        self.tokens["kv_kept"] += kv_kept
        self.tokens["abandoned"] += abandoned

    def worker_cpu(self, seconds: float) -> None:
        """CPU time a worker process of this run used over the measured window."""
        self._worker_cpu_s += seconds

    # --- the end -------------------------------------------------------------------------
    def finish(self, policy: HFPolicy, *, wall_s: float, cold_start_s: float,
               waits: dict[str, float], placement: dict[str, Any],
               devices: dict[str, str], gpu_peak_bytes: dict[str, int | None],
               weight_transport: str, weight_bytes: int,
               replay: dict[str, Any] | None = None,
               run_id: RunId | None = None) -> dict[str, Any]:
        """Save the final policy and finalize the run directory (summary.json last);
        `gpu_peak_bytes` is each role's allocator peak on its GPU (None off CUDA);
        `weight_transport` where the weight slots lived (`none`: one process, no slots),
        `weight_bytes` what a version hands over through them (0: none);
        `replay` says what a replay run replayed, `run_id` its name (default: the config's)."""
        if self._open:
            raise RuntimeError(f"{len(self._open)} samples were never settled")
        snapshot = self.snapshot()
        held = sampling_dtype(self.cfg.model, torch.device(devices["rollout"]))
        summary = build_summary(snapshot, wall_s=wall_s, cold_start_s=cold_start_s, waits=waits,
                                placement=placement, weight_transport=weight_transport,
                                weight_bytes=weight_bytes,
                                rollout_dtype=DTYPE_NAMES[held],
                                load=self.load.summary(self._worker_cpu_s))
        summary["clock"] = self.clock.describe()
        summary["profile_mismatch"] = self.profile_mismatch
        summary["run"] = (run_id or RunId.of(self.cfg, summary["clock"])).to_dict()
        summary["gpu_peak_bytes"] = gpu_peak_bytes
        schedule = "\n".join(self.schedule.lines()) + "\n"
        summary["reproducibility"] = reproducibility(
            policy.state_digest(), self.cfg, devices,
            schedule_digest="sha256:" + hashlib.sha256(schedule.encode()).hexdigest(),
            replay=replay)
        cfg = self.cfg
        if cfg.runtime.save_policy:
            policy.save(self.dir.stage_dir("policy"))
        base_info = Path(cfg.model.path) / "rlcore_base.json"
        config_json = {
            "config": cfg.to_dict(),
            "environment": environment_info(cfg.runtime.kernels),
            "base_model": json.loads(base_info.read_text()) if base_info.is_file() else None,
            "devices": devices,
            "clock": summary["clock"],
        }
        if self.clock.profile is not None:  # the costs in full, beside their digest
            config_json["hardware_profile"] = self.clock.profile.to_dict()
        if any("tests_passed" in s for s in self.samples):  # code was run: say what isolated it
            config_json["sandbox"] = detect_isolation(cfg.reward).describe()
        dirs = (("policy",) if cfg.runtime.save_policy else ()) + \
            ((TB_DIR,) if self.live is not None else ())
        self._close_live()  # its files must be complete before they move into place
        self.dir.finalize(summary, self.samples,
                          {"staleness.json": staleness_stats(snapshot), "config.json": config_json},
                          texts={SCHEDULE_FILE: schedule}, dirs=dirs)
        return summary

    def _close_live(self) -> None:
        if self.live is not None:
            self.live.close()
            self.live = None

    def close(self) -> None:
        self._close_live()
        self.dir.close()
