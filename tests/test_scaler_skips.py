"""One meaning for a step the fp16 loss scaler skipped, in every mode and the replay: the
step is counted (`scheduling.skipped_steps`), an update with a step applied commits, one with
none is a skipped commit that makes no version (paper §4.4), and a replay reproduces it.

fp16 needs CUDA, so the overflow is forced on CPU: a `GradScaler("cpu")` at 2**127 scales
any loss of this model past fp32's range, unscale_ finds inf and the step is skipped. On a
GPU (marker `cuda`) the same overflow is forced on fp16 runs, beside the scaler's own skips."""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import queue
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from rlcore.config import RunConfig, config_from_dict
from rlcore.policy import optim_steps
from rlcore.policy.hf_policy import HFPolicy
from rlcore.policy.optim_steps import (
    NO_STEP_APPLIED,
    SKIPPED_STEPS,
    STEPS,
    UpdateFailed,
    commit_verdict,
)
from rlcore.policy.sampler import Draws
from rlcore.policy.train_batch import TrainBatch
from rlcore.record.rundir import read_jsonl, validate_summary
from rlcore.record.schedule import ScheduleError
from rlcore.replay import trainer_process
from rlcore.replay.replayer import replay_run
from rlcore.runners import run_mode
from tests.conftest import small_config
from tests.test_async import async_config, check_invariants
from tests.test_virtual_clock import virtual_config

OVERFLOWING = 2.0 ** 127  # fp32's largest power of two: the scaled gradients overflow


def overflowing_scaler(backoff: float = 0.5, device: str = "cpu") -> torch.amp.GradScaler:
    """A scaler whose first step overflows; with a small `backoff` the next one does not."""
    return torch.amp.GradScaler(device, init_scale=OVERFLOWING, backoff_factor=backoff)


# --- the decision -----------------------------------------------------------------------

class TestCommitVerdict:
    def test_an_update_with_a_step_applied_commits(self):
        assert commit_verdict({STEPS: 2, SKIPPED_STEPS: 0, "loss": 0.3, "grad_norm": 1.5}) is None
        assert commit_verdict({STEPS: 2, SKIPPED_STEPS: 1, "loss": 0.3, "grad_norm": 1.5}) is None

    def test_an_update_with_no_step_applied_is_skipped(self):
        stats = {STEPS: 2, SKIPPED_STEPS: 2, "loss": 0.3, "grad_norm": math.nan}
        assert commit_verdict(stats) == NO_STEP_APPLIED

    def test_the_planners_updates_train_nothing_and_commit(self):
        assert commit_verdict({}) is None

    @pytest.mark.parametrize("loss,norm", [(math.nan, 1.0), (0.3, math.inf), (math.inf, 1.0)])
    def test_a_step_applied_with_non_finite_values_stops_the_run(self, loss: float,
                                                                  norm: float):
        with pytest.raises(UpdateFailed, match="no longer finite"):
            commit_verdict({STEPS: 1, SKIPPED_STEPS: 0, "loss": loss, "grad_norm": norm})


# --- the policy -------------------------------------------------------------------------

def policy_and_batch(cfg: RunConfig, minibatches: int) -> tuple[HFPolicy, TrainBatch]:
    policy = HFPolicy(cfg.model, dataclasses.replace(cfg.train, minibatches=minibatches),
                      role="trainer")
    ids = [policy.encode_prompt(p) for p in ("1+2=", "3+4=", "5+5=", "2+7=")]
    gens = policy.generate(ids, max_new_tokens=5, temperature=1.0, chunk_tokens=2,
                           draws=Draws(0, [(i, 0) for i in range(len(ids))]))
    return policy, TrainBatch([g.prompt_ids for g in gens], [g.response_ids for g in gens],
                              [g.logprobs for g in gens], [g.versions for g in gens],
                              advantages=[1.0, -1.0, 0.5, -0.5])


def test_an_update_whose_every_step_the_scaler_skipped_changes_nothing(cfg: RunConfig):
    policy, batch = policy_and_batch(cfg, minibatches=2)
    policy.scaler = overflowing_scaler(backoff=0.99)  # 2**127 * 0.99 overflows as well
    weights, adam = policy.export_state(), copy.deepcopy(policy.optimizer.state_dict())
    stats = policy.update(batch, temperature=1.0, current_version=0)
    assert (stats[STEPS], stats[SKIPPED_STEPS]) == (2, 2)
    assert commit_verdict(stats) == NO_STEP_APPLIED
    after = policy.export_state()
    assert all(torch.equal(weights[n], after[n]) for n in weights)
    assert policy.optimizer.state_dict() == adam and not policy.optimizer.state
    assert policy.scaler.get_scale() < OVERFLOWING  # backed off twice
    assert policy.skipped_in_a_row == 2


def test_an_update_with_one_step_applied_commits_with_that_steps_stats(cfg: RunConfig):
    policy, batch = policy_and_batch(cfg, minibatches=2)
    policy.scaler = overflowing_scaler(backoff=2.0 ** -27)  # then 2**100: no overflow
    weights = policy.export_state()
    stats = policy.update(batch, temperature=1.0, current_version=0)
    assert (stats[STEPS], stats[SKIPPED_STEPS]) == (2, 1)
    assert commit_verdict(stats) is None
    assert math.isfinite(stats["grad_norm"]) and stats["grad_norm"] > 0
    after = policy.export_state()
    assert all(not torch.equal(weights[n], after[n]) for n in weights)
    assert {int(s["step"]) for s in policy.optimizer.state.values()} == {1}
    assert policy.skipped_in_a_row == 0


def test_without_a_scaler_every_step_applies(cfg: RunConfig):
    policy, batch = policy_and_batch(cfg, minibatches=2)
    stats = policy.update(batch, temperature=1.0, current_version=0)
    assert (stats[STEPS], stats[SKIPPED_STEPS]) == (2, 0) and commit_verdict(stats) is None


def test_a_scaler_that_skips_for_ever_stops_the_run(cfg: RunConfig,
                                                    monkeypatch: pytest.MonkeyPatch):
    """A NaN loss overflows at any scale: rather than skip for ever, the policy stops."""
    monkeypatch.setattr(optim_steps, "MAX_SKIPPED_STEPS", 3)
    policy, batch = policy_and_batch(cfg, minibatches=1)
    policy.scaler = torch.amp.GradScaler("cpu")
    objective_loss = policy._objective_loss

    def nan_loss(x: Any) -> Any:
        loss, stats = objective_loss(x)
        return loss * math.nan, stats

    monkeypatch.setattr(policy, "_objective_loss", nan_loss)
    for _ in range(2):
        assert commit_verdict(policy.update(batch, temperature=1.0, current_version=0)) \
            == NO_STEP_APPLIED
    with pytest.raises(UpdateFailed, match="skipped the last 3 optimizer steps"):
        policy.update(batch, temperature=1.0, current_version=0)


# --- the runs ---------------------------------------------------------------------------

@pytest.fixture
def overflow(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """HFPolicy.update with an overflowing scaler on the calls numbered in `calls` (counted
    over every policy of this process from 0; `reset` restarts the count), with the scaler
    `backoff`; its own scaler (none on CPU) on every other call."""
    update = HFPolicy.update
    forced: dict[str, Any] = {"calls": set(), "backoff": 0.5, "n": 0}

    def forced_update(self: HFPolicy, *args: Any, **kwargs: Any) -> dict[str, float]:
        n, forced["n"] = forced["n"], forced["n"] + 1
        if n not in forced["calls"]:
            return update(self, *args, **kwargs)
        own, self.scaler = self.scaler, overflowing_scaler(forced["backoff"],
                                                           self.device.type)
        try:
            return update(self, *args, **kwargs)
        finally:
            self.scaler = own

    monkeypatch.setattr(HFPolicy, "update", forced_update)
    return forced


@pytest.fixture
def replay_trainer_in_a_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """The replay's trainer as a thread of this process, so that `overflow` reaches it."""
    monkeypatch.setattr(trainer_process, "die_with_parent", lambda *a, **k: None)
    monkeypatch.setattr(trainer_process, "_parent_pid", os.getpid)

    def start(self: trainer_process.TrainerProcess) -> None:
        self._steps, self._results = queue.Queue(), queue.Queue()
        self._trainer = threading.Thread(
            target=trainer_process.trainer_main, name="replay-trainer", daemon=True,
            args=(self.cfg, self.trainers, self.device, self.load_uses, self._steps,
                  self._results))
        self._trainer.start()
        assert self.result(timeout=120) == "ready"

    monkeypatch.setattr(trainer_process.TrainerProcess, "start", start)


def commits(run: Path) -> dict[int, dict[str, Any]]:
    return {r["batch_id"]: r for r in read_jsonl(run / "schedule.jsonl")
            if r["type"] == "commit"}


def check_skipped_batch(run: Path, batch_id: int, version: int) -> None:
    """The batch's commit was skipped for applying no step, at `version`, in every record."""
    commit = commits(run)[batch_id]
    assert (commit["outcome"], commit["reason"], commit["version"], commit["base_version"]) \
        == ("skipped", NO_STEP_APPLIED, version, version)
    events = read_jsonl(run / "events.jsonl")
    assert [e["batch_id"] for e in events if e["type"] == "commit_skipped"] == [batch_id]
    assert [e["reason"] for e in events if e["type"] == "update_skipped"] == [NO_STEP_APPLIED]
    samples = {s["sample_id"]: s for s in read_jsonl(run / "samples.jsonl")}
    assert all(samples[i]["status"] == "accepted" and samples[i]["batch_id"] is None
               for i in commit["sample_ids"])
    updates = read_jsonl(run / "updates.jsonl")
    assert batch_id not in [u["batch_id"] for u in updates]
    assert not any(k.startswith("optim/") for u in updates for k in u)


def sync_config(model_dir: Path, minibatches: int) -> RunConfig:
    return config_from_dict(small_config(
        model_dir, train={"updates": 3, "update_batch_size": 8, "minibatches": minibatches},
        runtime={"progress_every": 0, "save_policy": False}))


def test_sync_skips_the_commit_of_an_update_the_scaler_skipped_and_replays_it(
        tiny_model_dir: Path, tmp_path: Path, overflow: dict[str, Any],
        replay_trainer_in_a_thread: None):
    cfg = sync_config(tiny_model_dir, minibatches=1)
    overflow["calls"] = {1}
    summary = run_mode(cfg, tmp_path / "run")
    validate_summary(summary)
    assert (summary["updates"], summary["policy_version"]) == (3, 3)  # applied ones count
    assert summary["scheduling"]["skipped_steps"] == 1
    assert summary["scheduling"]["skipped_commits"] == 1
    check_skipped_batch(tmp_path / "run", batch_id=1, version=1)
    updates = read_jsonl(tmp_path / "run" / "updates.jsonl")
    assert [(u["version"], u["batch_id"]) for u in updates] == [(1, 0), (2, 2), (3, 3)]
    b = cfg.train.update_batch_size
    samples = read_jsonl(tmp_path / "run" / "samples.jsonl")
    assert [s["slot"] for s in samples] == list(range(4 * b))  # batch b holds b*B..b*B+B-1
    assert [s["current_version"] for s in samples] == [0] * b + [1] * 2 * b + [2] * b
    events = read_jsonl(tmp_path / "run" / "events.jsonl")
    assert [(e["old_version"], e["new_version"], e["batch_id"]) for e in events
            if e["type"] == "version_change"] == [(0, 1, 0), (1, 2, 2), (2, 3, 3)]

    overflow.update(calls={1}, n=0)  # the replay's trainer overflows on the same update
    replayed = replay_run(tmp_path / "run", tmp_path / "replay")
    assert replayed["reproducibility"]["replay"]["kind"] == "verification"
    assert replayed["reproducibility"]["state_digest"] \
        == summary["reproducibility"]["state_digest"]
    assert replayed["scheduling"]["skipped_steps"] == 1
    assert replayed["scheduling"]["skipped_commits"] == 1
    check_skipped_batch(tmp_path / "replay", batch_id=1, version=1)


def test_sync_commits_an_update_with_one_step_applied(tiny_model_dir: Path, tmp_path: Path,
                                                      overflow: dict[str, Any]):
    overflow.update(calls={1}, backoff=2.0 ** -27)  # its first step skipped, its second not
    summary = run_mode(sync_config(tiny_model_dir, minibatches=2), tmp_path / "run")
    assert summary["scheduling"]["skipped_steps"] == 1
    assert summary["scheduling"]["skipped_commits"] == 0
    updates = read_jsonl(tmp_path / "run" / "updates.jsonl")
    assert [(u["version"], u["batch_id"]) for u in updates] == [(1, 0), (2, 1), (3, 2)]
    assert all(math.isfinite(u["grad_norm"]) for u in updates)


def test_a_replay_whose_update_disagrees_with_the_scaler_says_so(
        tiny_model_dir: Path, tmp_path: Path, overflow: dict[str, Any]):
    """Replayed without the overflow, the update the run's scaler skipped applies here: the
    versions the schedule names cannot be made."""
    overflow["calls"] = {1}
    run_mode(sync_config(tiny_model_dir, minibatches=1), tmp_path / "run")
    with pytest.raises(ScheduleError, match=r"the run skipped the commit of batch 1 \(no "
                                            r"optimizer step applied.*here its update applied"):
        replay_run(tmp_path / "run", tmp_path / "replay")  # its trainer is another process


@pytest.mark.parametrize("mode", ["async", "areal"])
def test_async_skips_the_commit_of_an_update_the_scaler_skipped_and_replays_it(
        tiny_model_dir: Path, tmp_path: Path, overflow: dict[str, Any],
        replay_trainer_in_a_thread: None, mode: str):
    """Threaded on this machine's clock, and AReaL-style on the virtual clock, whose vehicle
    runs the AReaL-style roles (trainer, parameter service) as threads of this process."""
    if mode == "async":
        cfg = async_config(tiny_model_dir, "async", 2, "continue", "filter")
    else:
        cfg = virtual_config(tiny_model_dir, tmp_path, "areal", 2, interrupt="continue")
    overflow["calls"] = {1}  # the trainer's second update: batch 1, from version 1
    summary = run_mode(cfg, tmp_path / "run")
    check_invariants(tmp_path / "run", cfg)  # one version per applied commit, train.updates
    assert summary["scheduling"]["skipped_steps"] == 1
    assert summary["scheduling"]["skipped_commits"] == 1
    check_skipped_batch(tmp_path / "run", batch_id=1, version=1)
    # its verdict was taken at once and the published state loaded: nothing was computed on
    # the candidate the service was sure to skip
    ops = [(r["op"], r["version"], r["batch_id"]) for r in
           read_jsonl(tmp_path / "run" / "schedule.jsonl") if r["type"] == "trainer_op"]
    assert ops[ops.index(("update", 1, 1)) + 1] == ("load", 1, None)
    assert "refused" not in {c["outcome"] for c in commits(tmp_path / "run").values()}

    overflow.update(calls={1}, n=0)
    replayed = replay_run(tmp_path / "run", tmp_path / "replay")
    assert replayed["reproducibility"]["replay"]["kind"] == "verification"
    assert replayed["reproducibility"]["state_digest"] \
        == summary["reproducibility"]["state_digest"]
    assert replayed["scheduling"]["skipped_steps"] == 1
    check_skipped_batch(tmp_path / "replay", batch_id=1, version=1)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA GPU: torch.cuda.is_available() is False here")
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_fp16_overflow_on_the_gpu_is_a_skipped_commit(tiny_model_dir: Path, tmp_path: Path,
                                                         overflow: dict[str, Any], mode: str):
    """fp16 on cuda:0, its second update forced to overflow: whatever the scaler's own skips
    at its default scale, each update with no step applied is a skipped commit, and
    `train.updates` updates are applied all the same."""
    cfg = config_from_dict(small_config(
        tiny_model_dir, mode=mode,
        model={"rollout_device": "cuda:0", "trainer_device": "cuda:0", "dtype": "fp16"},
        staleness={} if mode == "sync" else {"staleness_k": 2, "interrupt": "continue"},
        train={"updates": 4, "update_batch_size": 8},
        rollout={"max_new_tokens": 5, "chunk_tokens": 1, "group_size": 4},
        runtime={"progress_every": 0, "save_policy": False}))
    overflow["calls"] = {1}
    summary = run_mode(cfg, tmp_path / "run")
    validate_summary(summary)
    assert (summary["updates"], summary["policy_version"]) == (4, 4)
    idle = [c for c in commits(tmp_path / "run").values() if c["reason"] == NO_STEP_APPLIED]
    assert 1 in [c["batch_id"] for c in idle]
    assert summary["scheduling"]["skipped_commits"] == len(idle)  # one trainer: none stale
    assert summary["scheduling"]["skipped_steps"] >= len(idle)
    updates = read_jsonl(tmp_path / "run" / "updates.jsonl")
    assert all(math.isfinite(u["loss"]) and math.isfinite(u["grad_norm"]) for u in updates)


def test_a_run_whose_update_cannot_commit_stops_with_what_to_set(
        tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]):
    """An applied step with a NaN loss (no scaler to skip it): `rlcore run` exits 1 with the
    message, no traceback, and leaves no summary that looks done."""
    import yaml

    from rlcore.cli import main

    objective_loss = HFPolicy._objective_loss

    def nan_loss(self: HFPolicy, x: Any) -> Any:
        loss, stats = objective_loss(self, x)
        return loss * math.nan, stats

    monkeypatch.setattr(HFPolicy, "_objective_loss", nan_loss)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(small_config(tiny_model_dir, train={"updates": 2})))
    out = tmp_path / "run"
    assert main(["run", str(config), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("rlcore: error: an update applied an optimizer step with a "
                          "non-finite loss"), err
    assert "Traceback" not in err and "lower train.lr" in err
    assert not (out / "summary.json").exists()
