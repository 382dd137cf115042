"""What `rlcore replay` reads from the run it replays, checked before anything is computed.

The run must be complete; its schedule must read back whole (`rlcore/record/schedule.py`) and be
the one its summary.json recorded; the output must lie outside it, so that a replay never
writes into the run it replays; and only train settings may change, because everything else
(the rollout, the staleness rules, the batch size, the number of updates) is either part of
the schedule or decided it.
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlcore.config import ConfigError, RunConfig, config_from_dict
from rlcore.config.files import apply_overrides
from rlcore.record.identity import RunId
from rlcore.record.rundir import is_complete, read_jsonl
from rlcore.record.schedule import SCHEDULE_FILE, Schedule, ScheduleError, read_schedule

# Train settings that shape the schedule itself, so a replay cannot change them.
SCHEDULE_TRAIN_KEYS = ("updates", "update_batch_size")


@dataclass
class Original:
    """The replayed run: its config, summary, schedule and per-sample and per-update rows."""

    run_dir: Path
    config: dict[str, Any]
    overrides: list[str]
    summary: dict[str, Any]
    schedule: Schedule
    samples: dict[int, dict[str, Any]]  # by sample id
    updates: dict[int, dict[str, Any]]  # by the version each made

    @property
    def cfg(self) -> RunConfig:
        return config_from_dict(self.config)

    def run_id(self) -> RunId:
        """The replayed run's name (derived from its record, so older runs have one too)."""
        return RunId.of(self.cfg, self.summary["clock"])

    @property
    def environment(self) -> dict[str, Any]:
        return self.summary["reproducibility"]["environment"]

    @property
    def state_digest(self) -> str:
        return self.summary["reproducibility"]["state_digest"]

    @property
    def schedule_digest(self) -> str:
        return self.summary["reproducibility"]["schedule_digest"]

    def replay_config(self, threads: int | None) -> RunConfig:
        """The run's config with the overrides, and `threads` per role if given."""
        data = apply_overrides(self.config, self.overrides)
        if threads is not None:
            data["runtime"]["threads_per_role"] = threads
        cfg = config_from_dict(data)
        for key in SCHEDULE_TRAIN_KEYS:
            if getattr(cfg.train, key) != getattr(self.cfg.train, key):
                raise ConfigError(f"train.{key} is part of the schedule: a replay cannot "
                                  "change it")
        return cfg

    def is_verification(self, cfg: RunConfig) -> bool:
        """True when the training is the run's own: the replay must then match bit for bit."""
        return cfg.train == self.cfg.train

    def train_changes(self, cfg: RunConfig) -> dict[str, Any]:
        """The train settings that differ from the run's, with their new values."""
        old, new = self.cfg.train.__dict__, cfg.train.__dict__
        return {f"train.{k}": _plain(new[k]) for k in new if new[k] != old[k]}


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def environment_differences(recorded: dict[str, Any], here: dict[str, Any]) -> list[str]:
    """What differs between the recorded environment and this one, in words (a key missing
    on either side is not compared: the CPU matters under native kernels only)."""
    return [f"{key} was {recorded[key]!r}, here it is {here[key]!r}"
            for key in ("torch", "threads_per_role", "cpu", "devices")
            if key in recorded and key in here and recorded[key] != here[key]]


def check_environment(original: Original, cfg: RunConfig, *, exact: bool) -> None:
    """Say on stderr what differs from the run's environment; refuse, when the replay must be
    `exact` (a verification without --tolerance), to go on in another one."""
    import torch

    from rlcore.kernels import cpu_name
    from rlcore.policy.device import resolve_device

    here = {"torch": torch.__version__, "threads_per_role": cfg.runtime.threads_per_role,
            **({"cpu": cpu_name()} if cfg.runtime.kernels == "native" else {}),
            "devices": {r: str(resolve_device(cfg.model.trainer_device, "trainer"))
                        for r in original.environment["devices"]}}
    differences = environment_differences(original.environment, here)
    if cfg.runtime.trainer_ranks > 1:  # the ranks summed their gradients in their own order
        differences.append(f"its trainer had {cfg.runtime.trainer_ranks} data-parallel ranks, "
                           "a replay trains in one process (equal up to the order of sums)")
    for d in differences:
        print(f"rlcore replay: the environment differs from the run's: {d}", file=sys.stderr)
    if differences and exact:
        raise ConfigError("a verification needs the run's environment for bit-exactness, and "
                          f"it differs ({'; '.join(differences)}); pass --tolerance T to "
                          "report the largest divergence instead of failing")


def read_original(run_dir: str | Path, out_dir: str | Path, overrides: list[str] | tuple
                  ) -> Original:
    """Read and check the run to replay; raises ConfigError or ScheduleError saying why not."""
    run, out = Path(run_dir), Path(out_dir)
    if not is_complete(run):
        raise ConfigError(f"'{run}' is not a complete run directory (no summary.json)")
    if out.resolve() == run.resolve() or run.resolve() in out.resolve().parents:
        raise ConfigError(f"--out '{out}' lies in the replayed run '{run}': a replay never "
                          "writes there; choose another directory")
    bad = [o for o in overrides if not o.startswith("train.")]
    if bad:
        raise ConfigError(f"a replay changes train settings only (the rest is the schedule "
                          f"or decided it): {bad}")
    schedule = read_schedule(run)
    summary = json.loads((run / "summary.json").read_text())
    recorded = summary["reproducibility"].get("schedule_digest")
    actual = "sha256:" + hashlib.sha256((run / SCHEDULE_FILE).read_bytes()).hexdigest()
    if recorded != actual:
        raise ScheduleError(f"{SCHEDULE_FILE} is not the schedule this run recorded: its digest "
                            f"is {actual}, summary.json says {recorded}; it was changed after "
                            "the run")
    config = json.loads((run / "config.json").read_text())["config"]
    samples = {r["sample_id"]: r for r in read_jsonl(run / "samples.jsonl")}
    updates = {r["version"]: r for r in read_jsonl(run / "updates.jsonl")}
    original = Original(run, config, list(overrides), summary, schedule, samples, updates)
    missing = [f.sample_id for f in schedule.samples if f.sample_id not in samples]
    if missing:
        raise ScheduleError(f"samples {missing[:5]} of the schedule are not in samples.jsonl")
    return original



