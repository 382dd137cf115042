"""Invariants of the asynchronous runners over K, interrupt modes and staleness controls.

The threaded runner shares every role with the AReaL-style runtime (only the vehicle
differs), so the full grid runs threaded on the virtual clock, where each run is a function
of its config and the decision a case is there for certainly happens (each case asserts
that it did); a cross-section runs threaded and as real processes on this machine's clock,
for the live path.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from rlcore.config import RunConfig, config_from_dict
from rlcore.policy.sampler import Draws
from rlcore.record.ledger import RunLedger
from rlcore.record.rundir import read_jsonl, validate_summary
from rlcore.runners import run_mode
from rlcore.runners.asynchronous.messages import Stopped
from rlcore.runners.asynchronous.placement import plan_cpus
from rlcore.runners.asynchronous.runtime import role_peaks
from tests.conftest import small_config
from tests.test_virtual_clock import RUN_PROFILE

MAX_RETRIES = 1



def async_config(model_dir: Path, mode: str, k: int, interrupt: str, control: str
                 ) -> RunConfig:
    return config_from_dict(small_config(
        model_dir, mode=mode,
        train={"updates": 6, "update_batch_size": 8},
        rollout={"max_new_tokens": 5, "chunk_tokens": 1, "group_size": 4},
        staleness={"staleness_k": k, "interrupt": interrupt, "staleness_control": control,
                   "max_retries": MAX_RETRIES},
        runtime={"progress_every": 0, "save_policy": False}))


def check_invariants(run_dir: Path, cfg: RunConfig) -> dict[str, Any]:
    """Assert every invariant of a finished asynchronous run; returns its summary."""
    k = cfg.staleness.staleness_k
    summary = json.loads((run_dir / "summary.json").read_text())
    validate_summary(summary)
    samples = read_jsonl(run_dir / "samples.jsonl")
    updates = read_jsonl(run_dir / "updates.jsonl")
    events = read_jsonl(run_dir / "events.jsonl")
    by_id = {s["sample_id"]: s for s in samples}
    assert len(by_id) == len(samples), "a sample was recorded twice"

    # every sample is exactly one of the three outcomes
    assert {s["status"] for s in samples} <= {"accepted", "dropped_stale", "dropped_interrupted"}
    counts = summary["samples"]
    assert counts["accepted"] + counts["dropped_stale"] + counts["dropped_interrupted"] \
        == counts["generated"] == len(samples)

    # no trained sample (or token) is staler than K, measured against the update's base
    trained = [s for s in samples if s["status"] == "accepted" and s.get("batch_id") is not None]
    assert all(s["staleness"] <= k for s in trained)
    assert all(s["staleness"] == s["current_version"] - s["policy_version"] for s in trained)
    per_token = json.loads((run_dir / "staleness.json").read_text())["per_token"]["accepted"]
    assert all(int(d) <= k for d in per_token)
    assert summary["staleness"]["max_accepted"] <= k

    # the clock: one version per applied commit, and never otherwise
    assert [u["version"] for u in updates] == list(range(1, cfg.train.updates + 1))
    changes = [e for e in events if e["type"] == "version_change"]
    assert [(e["old_version"], e["new_version"]) for e in changes] == \
        [(v, v + 1) for v in range(cfg.train.updates)]
    assert summary["policy_version"] == cfg.train.updates

    assert summary["gpu_peak_bytes"] == {"rollout": None, "trainer": None,  # on CPU
                                         "weight_slots": None}

    # each trained sample was trained exactly once, in the batch the sample row names
    trained_ids = [i for u in updates for i in u["sample_ids"]]
    assert len(trained_ids) == len(set(trained_ids))
    for u in updates:
        for i in u["sample_ids"]:
            assert by_id[i]["batch_id"] == u["batch_id"]
            assert by_id[i]["current_version"] == u["version"] - 1  # trained from v-1 to v

    # resubmissions are bounded per task slot
    assert all(s["attempt"] <= MAX_RETRIES for s in samples)
    assert all(s["attempt"] == MAX_RETRIES for s in samples
               if s["status"] == "dropped_interrupted")
    attempts = [e["attempt"] for e in events if e["type"] == "interrupted_attempt"]
    assert all(a <= MAX_RETRIES for a in attempts)
    assert summary["samples"]["resubmissions"] == sum(1 for a in attempts if a < MAX_RETRIES)

    # the token ledger balances exactly (generated is counted by the samplers themselves)
    t = summary["tokens"]
    assert t["generated"] == t["trained"] + t["stale_dropped"] + t["interrupted"] + t["untrained"]
    assert t["trained"] == sum(by_id[i]["response_tokens"] for i in trained_ids)

    if k == 0:  # with K = 0 every trained sample came from the version being updated
        for u in updates:
            for i in u["sample_ids"]:
                assert by_id[i]["policy_version"] == by_id[i]["policy_version_max"] \
                    == u["version"] - 1
    interrupt = cfg.staleness.interrupt
    if interrupt != "resubmit":  # the partial response goes on: nothing is abandoned
        assert t["interrupted"] == 0 and counts["dropped_interrupted"] == 0
    assert (t["reprefilled"] == 0) or interrupt == "continue"
    assert (t["kv_kept"] == 0) or interrupt == "keep_kv"
    return summary


# Two regimes of the virtual clock's test profile: a decode step of 20 ms makes a response
# (5 chunks) outlast several updates, so commits land inside generations (interrupts), and
# some resubmitted ones are cut again; at 2 ms rollout outruns the trainer, so samples wait
# in the buffer and go stale, and admission control holds rollout back.
ROLLOUT_BOUND, TRAINER_BOUND = 2e-2, 2e-3


def virtual_async_config(model_dir: Path, tmp: Path, k: int, interrupt: str, control: str,
                         decode_step_s: float) -> RunConfig:
    """async_config on the virtual clock of the test profile with the given decode step."""
    name = f"test-decode-{decode_step_s:g}"
    profile = tmp / f"{name}.yaml"
    profile.write_text(yaml.safe_dump({**RUN_PROFILE, "name": name, "decode": {
        **RUN_PROFILE["decode"], "step_s": decode_step_s}}))
    data = async_config(model_dir, "async", k, interrupt, control).to_dict()
    data["runtime"].update(clock="virtual", hardware=str(profile))
    return config_from_dict(data)


# What each interrupt mode does when a commit lands inside a generation.
INTERRUPTED = {"resubmit": lambda s: s["samples"]["resubmissions"] > 0,
               "continue": lambda s: s["tokens"]["reprefilled"] > 0,
               "keep_kv": lambda s: s["tokens"]["kv_kept"] > 0}


@pytest.mark.parametrize("control", ["filter", "throttle", "both"])
@pytest.mark.parametrize("interrupt", ["resubmit", "continue", "keep_kv"])
@pytest.mark.parametrize("k", [0, 1, 2, 4])
def test_invariants_hold_where_commits_interrupt_generations(
        tiny_model_dir: Path, tmp_path: Path, k: int, interrupt: str, control: str):
    cfg = virtual_async_config(tiny_model_dir, tmp_path, k, interrupt, control, ROLLOUT_BOUND)
    run_mode(cfg, tmp_path / "run")
    summary = check_invariants(tmp_path / "run", cfg)
    if k == 0 and control != "filter":
        # eq. 1 at K = 0 admits one batch at a time, generated at the version it trains: no
        # commit can meet a generation
        assert not any(exercised(summary) for exercised in INTERRUPTED.values())
    else:
        assert INTERRUPTED[interrupt](summary), f"no generation met a commit under {interrupt}"
    if interrupt == "resubmit" and k > 0:  # cut twice: past max_retries
        assert summary["samples"]["dropped_interrupted"] > 0


@pytest.mark.parametrize("interrupt", ["resubmit", "continue", "keep_kv"])
@pytest.mark.parametrize("k", [0, 1, 2])
def test_invariants_hold_where_the_filter_drops_stale_samples(
        tiny_model_dir: Path, tmp_path: Path, k: int, interrupt: str):
    cfg = virtual_async_config(tiny_model_dir, tmp_path, k, interrupt, "filter", TRAINER_BOUND)
    run_mode(cfg, tmp_path / "run")
    summary = check_invariants(tmp_path / "run", cfg)
    assert summary["samples"]["dropped_stale"] > 0
    assert summary["scheduling"]["waits"]["rollout_throttle_s"] == 0.0  # no admission control


@pytest.mark.parametrize("control", ["throttle", "both"])
@pytest.mark.parametrize("k", [0, 2])
def test_invariants_hold_where_admission_control_holds_rollout_back(
        tiny_model_dir: Path, tmp_path: Path, k: int, control: str):
    cfg = virtual_async_config(tiny_model_dir, tmp_path, k, "resubmit", control, TRAINER_BOUND)
    run_mode(cfg, tmp_path / "run")
    summary = check_invariants(tmp_path / "run", cfg)
    assert summary["scheduling"]["waits"]["rollout_throttle_s"] > 0
    # the throttle keeps rollout within K batches of training: what it admits stays fresh
    assert summary["samples"]["dropped_stale"] == 0


@pytest.mark.slow
@pytest.mark.parametrize(("k", "interrupt", "control"), [
    (0, "resubmit", "filter"), (2, "continue", "both"), (4, "keep_kv", "throttle")])
def test_threaded_invariants_on_this_machines_clock(tiny_model_dir: Path, tmp_path: Path,
                                                     k: int, interrupt: str, control: str):
    cfg = async_config(tiny_model_dir, "async", k, interrupt, control)
    run_mode(cfg, tmp_path / "run")
    check_invariants(tmp_path / "run", cfg)


@pytest.mark.slow
@pytest.mark.parametrize(("k", "interrupt", "control"), [
    (0, "resubmit", "filter"), (1, "continue", "throttle"), (2, "resubmit", "both"),
    (2, "keep_kv", "filter"),
])
def test_process_invariants(tiny_model_dir: Path, tmp_path: Path, k: int, interrupt: str,
                            control: str):
    cfg = async_config(tiny_model_dir, "areal", k, interrupt, control)
    summary = run_mode(cfg, tmp_path / "run")
    check_invariants(tmp_path / "run", cfg)
    events = read_jsonl(tmp_path / "run" / "events.jsonl")
    ready = {e["worker"]: e for e in events if e["type"] == "worker_ready"}
    assert set(ready) == {"param_service", "rollout0", "trainer0"}
    assert len({e["pid"] for e in ready.values()}) == 3  # three separate processes
    assert summary["time"]["cold_start_s"] > 0
    check_placement(summary, ready)


def check_placement(summary: dict[str, Any], ready: dict[str, dict[str, Any]]) -> None:
    """With two cores or more each heavy role runs on its own core, as the worker itself saw."""
    placement = summary["scheduling"]["placement"]
    if len(os.sched_getaffinity(0)) < 2:
        assert placement["cpus"] == {} and "allowed" in placement["unpinned_reason"]
        return
    assert placement["unpinned_reason"] == ""
    assert ready["rollout0"]["cpus"] == placement["cpus"]["rollout0"]
    assert ready["trainer0"]["cpus"] == placement["cpus"]["trainer0"]
    assert len(ready["rollout0"]["cpus"]) == len(ready["trainer0"]["cpus"]) == 1
    assert not set(ready["rollout0"]["cpus"]) & set(ready["trainer0"]["cpus"])
    assert set(ready["param_service"]["cpus"]) == os.sched_getaffinity(0)  # it floats


def test_threaded_roles_are_pinned_per_thread(tiny_model_dir: Path, tmp_path: Path):
    cfg = async_config(tiny_model_dir, "async", 1, "continue", "both")
    before = os.sched_getaffinity(0)
    summary = run_mode(cfg, tmp_path / "run")
    events = read_jsonl(tmp_path / "run" / "events.jsonl")
    check_placement(summary, {e["worker"]: e for e in events if e["type"] == "worker_ready"})
    assert os.sched_getaffinity(0) == before  # the calling thread (the controller) is free


def test_pin_cpus_false_leaves_every_role_free(tiny_model_dir: Path, tmp_path: Path):
    data = async_config(tiny_model_dir, "async", 1, "continue", "both").to_dict()
    data["runtime"]["pin_cpus"] = False
    summary = run_mode(config_from_dict(data), tmp_path / "run")
    assert summary["scheduling"]["placement"] == {"cpus": {},
                                             "unpinned_reason": "runtime.pin_cpus is false"}
    events = read_jsonl(tmp_path / "run" / "events.jsonl")
    assert all(set(e["cpus"]) == os.sched_getaffinity(0)
               for e in events if e["type"] == "worker_ready")


class TestPlanCpus:
    def test_each_role_gets_its_own_threads_cores_in_order(self):
        plan, reason = plan_cpus({3, 1, 0, 2}, ["rollout0", "trainer0"], threads=2)
        assert plan == {"rollout0": (0, 1), "trainer0": (2, 3)} and reason == ""

    def test_too_few_cores_means_no_plan_and_says_why(self):
        plan, reason = plan_cpus({0, 1}, ["rollout0", "rollout1", "trainer0"], threads=1)
        assert plan == {}
        assert reason == "3 roles x 1 threads need 3 cores, 2 allowed"


def test_interruptions_happen_and_are_accounted(tiny_model_dir: Path, tmp_path: Path):
    """One-token chunks against a trainer that commits every few milliseconds: the rollout
    must be interrupted, and every interrupted token appears in the ledger."""
    cfg = async_config(tiny_model_dir, "async", 4, "resubmit", "filter")
    summary = run_mode(cfg, tmp_path / "run")
    events = read_jsonl(tmp_path / "run" / "events.jsonl")
    interrupts = [e for e in events if e["type"] == "interrupted_attempt"]
    assert interrupts, "no rollout was interrupted: the test did not exercise the path"
    assert summary["tokens"]["interrupted"] == sum(e["tokens"] for e in interrupts)
    assert summary["samples"]["resubmissions"] > 0


@pytest.fixture
def first_updates_overlap(monkeypatch: pytest.MonkeyPatch) -> dict[str, bool]:
    """Each of two trainer threads holds its first update until the other has begun its own:
    neither has committed yet, so both train from version 0 and the second commit is stale.
    Returns {"met": whether they met} (a trainer waits at most 30 s)."""
    from rlcore.policy.hf_policy import HFPolicy

    update = HFPolicy.update
    begun = {"trainer0": threading.Event(), "trainer1": threading.Event()}
    met = {"met": False}

    def update_together(self: HFPolicy, *args: Any, **kwargs: Any) -> dict[str, float]:
        name = threading.current_thread().name
        if name in begun and not begun[name].is_set():
            begun[name].set()
            other = begun["trainer1" if name == "trainer0" else "trainer0"]
            met["met"] = other.wait(timeout=30) or met["met"]
        return update(self, *args, **kwargs)

    monkeypatch.setattr(HFPolicy, "update", update_together)
    return met


@pytest.mark.slow
def test_two_trainers_race_and_the_stale_commit_is_skipped(
        tiny_model_dir: Path, tmp_path: Path, first_updates_overlap: dict[str, bool],
        monkeypatch: pytest.MonkeyPatch):
    """Two trainers train their first batches from the same version (forced): the parameter
    service applies one and skips the other as stale, the clock stays exact, and the skipped
    batch's samples are recorded as accepted and never trained."""
    from rlcore.replay.replayer import replay_run

    cfg = async_config(tiny_model_dir, "async", 1, "continue", "both")
    cfg = config_from_dict({**cfg.to_dict(), "runtime": {
        **cfg.to_dict()["runtime"], "trainer_workers": 2}})
    summary = run_mode(cfg, tmp_path / "run")
    assert first_updates_overlap["met"], "the second trainer never began an update"
    check_invariants(tmp_path / "run", cfg)
    events = read_jsonl(tmp_path / "run" / "events.jsonl")
    schedule = read_jsonl(tmp_path / "run" / "schedule.jsonl")
    commits = {c["batch_id"]: c for c in schedule if c["type"] == "commit"}
    first = sorted((commits[b]["base_version"], commits[b]["outcome"]) for b in (0, 1))
    assert first == [(0, "applied"), (0, "skipped")]
    (lost,) = [commits[b] for b in (0, 1) if commits[b]["outcome"] == "skipped"]
    # The winner may commit its next batch before the loser's arrives: current is v1 or later.
    found = re.fullmatch(r"stale base \(candidate from v0, current v(\d+)\)", lost["reason"])
    assert found and int(found[1]) >= 1, lost["reason"]

    not_applied = [c for c in commits.values() if c["outcome"] != "applied"]
    skipped = [e for e in events if e["type"] == "update_skipped"]
    assert summary["scheduling"]["skipped_commits"] == len(skipped) == len(not_applied) >= 1
    assert sorted(e["batch_id"] for e in skipped) == sorted(c["batch_id"] for c in not_applied)
    assert sorted(e["batch_id"] for e in events if e["type"] == "commit_skipped") \
        == sorted(c["batch_id"] for c in not_applied if c["outcome"] == "skipped")
    samples = {s["sample_id"]: s for s in read_jsonl(tmp_path / "run" / "samples.jsonl")}
    trained = {i for u in read_jsonl(tmp_path / "run" / "updates.jsonl") for i in u["sample_ids"]}
    untrained = [i for c in not_applied for i in c["sample_ids"]]
    assert untrained and not set(untrained) & trained
    assert all(samples[i]["status"] == "accepted" and samples[i]["batch_id"] is None
               for i in untrained)
    # The schedule says which weights every update started from, the losing trainer's reload
    # included: replayed on it, the run reproduces bit for bit (a Divergence otherwise).
    monkeypatch.undo()  # the replay's trainer runs alone: nothing to wait for
    replayed = replay_run(tmp_path / "run", tmp_path / "replay")
    assert replayed["reproducibility"]["replay"]["kind"] == "verification"
    assert replayed["reproducibility"]["state_digest"] \
        == summary["reproducibility"]["state_digest"]


def test_rollout_train_ratio_holds_generation_to_beta(tiny_model_dir: Path, tmp_path: Path):
    beta = 1.0
    cfg = async_config(tiny_model_dir, "async", 4, "continue", "filter")
    data = cfg.to_dict()
    data["staleness"]["rollout_train_ratio"] = beta
    cfg = config_from_dict(data)
    summary = run_mode(cfg, tmp_path / "run")
    check_invariants(tmp_path / "run", cfg)
    b, n = cfg.train.update_batch_size, cfg.train.updates
    # the rollout may run at most two batches ahead of beta * B per update
    assert summary["samples"]["generated"] <= beta * b * (n + 2)
    # holding to beta made one side wait: rollout ahead of the ratio, or the trainer behind it
    waits = summary["scheduling"]["waits"]
    assert waits["rollout_ratio_s"] + waits["trainer_ratio_s"] > 0


class RecordingQueue:
    def __init__(self) -> None:
        self.items: list[Any] = []

    def put(self, item: Any) -> None:
        self.items.append(item)


def test_controller_dispatches_a_pump_as_one_message(cfg: RunConfig, tmp_path: Path):
    """A rollout worker takes whatever is queued when it wakes: prompts sent group by group
    would let it start on one group, at nearly the cost of a whole batch."""
    import multiprocessing
    from types import SimpleNamespace

    from rlcore.runners.asynchronous.controller import Controller
    from rlcore.runners.common import preflight

    channels = SimpleNamespace(prompt_q=RecordingQueue(), inbox=RecordingQueue(),
                               trainer_qs=[RecordingQueue()],
                               counters=multiprocessing.Array("q", 2))
    ledger = RunLedger(cfg, tmp_path / "run")
    controller = Controller(cfg, preflight(cfg), ledger, channels, n_trainers=1)
    try:
        controller.pump()
    finally:
        controller.rewards.close()
        ledger.close()
    b, g = cfg.train.update_batch_size, cfg.rollout.group_size
    (message,) = channels.prompt_q.items
    assert len(message) == 2 * b  # the batch being generated and the next
    assert [s.group_id for s in message] == [i // g for i in range(2 * b)]


def test_parameter_service_reports_each_verdict_with_the_trainers_stats():
    from rlcore.runners.asynchronous.messages import CommitAck, CommitRequest
    from rlcore.runners.asynchronous.param_service import verdict

    req = CommitRequest(trainer=1, batch_id=7, slot=2, base_version=3, updated=True,
                        stats={"loss": 0.5}, t_start=9.0, t_sent=10.0)
    done = verdict(req, CommitAck(True, 4, next_slot=0, t=10.25), commit_s=0.01)
    assert (done.trainer, done.batch_id, done.applied, done.version, done.base_version) \
        == (1, 7, True, 4, 3)
    assert done.stats == {"loss": 0.5, "time/commit_latency_s": 0.25}
    assert (done.t_start, done.t_commit, done.commit_s) == (9.0, 10.25, 0.01)
    skipped = verdict(req, CommitAck(False, 5, next_slot=2, t=11.0, reason="stale base"), 0.0)
    assert not skipped.applied and skipped.reason == "stale base"


def test_controller_records_the_commit_events_from_the_verdict(cfg: RunConfig, tmp_path: Path):
    """Trainer span, version change and skipped commit come from one UpdateDone each."""
    from types import SimpleNamespace

    from rlcore.runners.asynchronous.controller import Controller
    from rlcore.runners.asynchronous.messages import UpdateDone
    from rlcore.runners.common import preflight

    channels = SimpleNamespace(prompt_q=RecordingQueue(), inbox=RecordingQueue(),
                               trainer_qs=[RecordingQueue()], counters=[0, 0])
    ledger = RunLedger(cfg, tmp_path / "run")
    controller = Controller(cfg, preflight(cfg), ledger, channels, n_trainers=1)
    try:
        t0 = ledger.t0
        controller._record_commit(UpdateDone(0, 3, True, 4, 3, "", {}, t0 + 2.0, t0 + 1.5,
                                             commit_s=0.001), samples=8)
        controller._record_commit(UpdateDone(0, 4, False, 4, 4, "stale base", {}, t0 + 3.0,
                                             t0 + 2.5, commit_s=0.001), samples=8)
        controller._record_commit(UpdateDone(0, 5, False, 4, 4, "refused", {}, t0 + 4.0,
                                             t0 + 3.5), samples=8)
    finally:
        controller.rewards.close()
        ledger.close()
    assert [x for span in ledger.spans["trainer"] for x in span] \
        == pytest.approx([1.5, 2.0, 2.5, 3.0, 3.5, 4.0])
    events = read_jsonl(tmp_path / "run" / "events.jsonl.partial")
    changes = [e for e in events if e["type"] == "version_change"]
    assert [(e["old_version"], e["new_version"], e["batch_id"]) for e in changes] == [(3, 4, 3)]
    skips = [e for e in events if e["type"] == "commit_skipped"]
    assert [(e["batch_id"], e["reason"]) for e in skips] == [(4, "stale base")]  # not the refusal


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_unavailable_device_fails_before_the_run_directory_exists(tiny_model_dir: Path,
                                                                  tmp_path: Path):
    from rlcore.config import ConfigError

    data = async_config(tiny_model_dir, "areal", 1, "continue", "both").to_dict()
    data["model"]["trainer_device"] = "cuda:0"
    with pytest.raises(ConfigError, match="trainer_device is 'cuda:0'"):
        run_mode(config_from_dict(data), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_waits_and_a_skipped_commit_are_accounted(tiny_model_dir: Path, tmp_path: Path):
    """Driven by hand: the eq. 1 throttle holds dispatch, an idle trainer waits for data, and
    a skipped commit is counted, releases its capacity and leaves its samples untrained."""
    from types import SimpleNamespace

    from rlcore.record.ledger import build_summary
    from rlcore.runners.asynchronous.controller import Controller
    from rlcore.runners.asynchronous.messages import SampleMsg, UpdateDone
    from rlcore.runners.common import preflight

    cfg = async_config(tiny_model_dir, "async", 0, "continue", "both")
    b = cfg.train.update_batch_size
    channels = SimpleNamespace(prompt_q=RecordingQueue(), inbox=RecordingQueue(),
                               trainer_qs=[RecordingQueue()], counters=[0, 0])
    ledger = RunLedger(cfg, tmp_path / "run")
    controller = Controller(cfg, preflight(cfg), ledger, channels, n_trainers=1)
    try:
        controller.pump()
        (slots,) = channels.prompt_q.items
        assert len(slots) == b  # K = 0: eq. 1 admits one batch, not the two rollout could take
        time.sleep(0.05)
        controller.pump()  # nothing came back: rollout held by the throttle, the trainer idle
        assert controller.waits["rollout_throttle_s"] >= 0.05
        assert controller.waits["trainer_data_s"] >= 0.05
        for slot in slots:  # every sample comes back, sampled by version 0
            controller.on_sample(SampleMsg(slot, [1, 2], [3, 4], [-0.1, -0.2], [0, 0], True,
                                           "7", "rollout0", ledger.t0 + 0.1))
        controller.pump()
        (request,) = channels.trainer_qs[0].items
        assert controller.core.manager.accepted == b
        t = ledger.t0 + 0.2
        controller.on_message(UpdateDone(0, request.batch_id, False, 0, 0, "stale base", {},
                                         t, t - 0.1, commit_s=0.001))
        assert controller.core.manager.accepted == 0  # the batch gave its capacity back
        summary = build_summary(ledger.snapshot(), wall_s=1.0, cold_start_s=0.0,
                                waits=controller.waits,
                                placement={"cpus": {}, "unpinned_reason": "test"},
                                load=ledger.load.summary(worker_cpu_s=0.0),
                                weight_transport="host", rollout_dtype="fp32",
                                weight_bytes=0)
    finally:
        controller.rewards.close()
        ledger.close()
    assert summary["scheduling"]["skipped_commits"] == 1
    assert summary["updates"] == 0 and summary["samples"]["trained"] == 0
    assert [(r["status"], r["batch_id"]) for r in ledger.samples] == [("accepted", None)] * b
    assert summary["tokens"]["untrained"] == 2 * b


def test_keep_kv_decodes_on_across_versions_without_reprefill(tiny_model_dir: Path,
                                                             tmp_path: Path):
    """keep_kv: interrupted generations go on under the new weights with the old cache; their
    tokens span versions, and the ledger shows the re-prefill that was saved."""
    cfg = async_config(tiny_model_dir, "async", 4, "keep_kv", "filter")
    summary = run_mode(cfg, tmp_path / "run")
    check_invariants(tmp_path / "run", cfg)
    events = read_jsonl(tmp_path / "run" / "events.jsonl")
    assert [e for e in events if e["type"] == "rollout_interrupt"], "no interrupt: not exercised"
    t = summary["tokens"]
    assert t["kv_kept"] > 0 and t["reprefilled"] == 0
    samples = read_jsonl(tmp_path / "run" / "samples.jsonl")
    assert any(s["policy_version_max"] > s["policy_version"] for s in samples)


class TestKeepCache:
    """The sampler's keep_kv step: which version each token is tagged with."""

    def test_the_token_after_the_switch_keeps_the_old_version(self, cfg: RunConfig):
        from rlcore.policy.hf_policy import HFPolicy

        policy = HFPolicy(cfg.model, cfg.train)
        policy.stop_ids = set()  # no early stop: every row samples all six tokens
        sampler = policy.sampler([policy.encode_prompt("1+2=")], max_new_tokens=6,
                                 temperature=1.0, draws=Draws(0, [(0, 0)]),
                                 version=3)
        sampler.step(2)
        sampler.keep_cache(4)  # new weights would be loaded here; the cache stays
        sampler.step(2)
        sampler.step(2)
        # two tokens of v3, then one drawn from v3's last logits, then v4's
        assert sampler.gens[0].versions == [3, 3, 3, 4, 4, 4]


def test_a_roles_gpu_peak_is_the_largest_of_its_workers():
    stopped = {"rollout0": Stopped("rollout0", gpu_peak_bytes=5),
               "rollout1": Stopped("rollout1", gpu_peak_bytes=7),
               "rollout12": Stopped("rollout12", gpu_peak_bytes=6),
               "trainer0": Stopped("trainer0"), "param_service": Stopped("param_service")}
    assert role_peaks(stopped) == {"rollout": 7, "trainer": None}
