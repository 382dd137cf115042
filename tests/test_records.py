"""One record vocabulary: every mode writes the same event types, rows and summary keys, and
derives each number the same way from them (rlcore/record/ledger.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlcore.algo.metrics import merge_spans
from rlcore.config import MODES, config_from_dict
from rlcore.record.ledger import EVENT_FIELDS, RunLedger
from rlcore.record.rundir import read_jsonl
from rlcore.runners import run_mode
from rlcore.runners.sync import sync_train
from tests.conftest import small_config


def key_paths(data: dict[str, Any], prefix: str = "") -> set[str]:
    """Every key of a nested summary as a dotted path; `placement.cpus` is per run (its keys
    name the pinned workers), so only the section itself counts."""
    out = set()
    for k, v in data.items():
        path = f"{prefix}{k}"
        out.add(path)
        if isinstance(v, dict) and path != "scheduling.placement.cpus":
            out |= key_paths(v, path + ".")
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> dict[str, Path]:
    """One small run of each mode; the async ones under the paper's preset with K = 1
    and one-token chunks, so that interrupts, resubmissions and drops happen."""
    root = tmp_path_factory.mktemp("vocabulary")
    out = {}
    for mode in MODES:
        staleness = {} if mode == "sync" else {
            "staleness_k": 1, "interrupt": "resubmit", "staleness_control": "filter",
            "max_retries": 1}
        cfg = config_from_dict(small_config(
            tiny_model_dir, mode=mode, train={"updates": 5, "update_batch_size": 8},
            rollout={"max_new_tokens": 5, "chunk_tokens": 1, "group_size": 4},
            staleness=staleness, runtime={"progress_every": 0}))
        run_mode(cfg, root / mode)
        out[mode] = root / mode
    return out


def test_every_event_carries_the_fields_of_its_type(runs: dict[str, Path]):
    seen: dict[str, set[str]] = {}
    for mode, run_dir in runs.items():
        for e in read_jsonl(run_dir / "events.jsonl"):
            assert set(e) - {"t", "type"} == EVENT_FIELDS[e["type"]], (mode, e)
            seen.setdefault(e["type"], set()).add(mode)
    shared = {kind for kind, modes in seen.items() if modes == set(MODES)}
    assert {"run_start", "span", "version_change"} <= shared
    # the async runs did exercise the drop policy, so its events were checked too
    assert {"rollout_interrupt", "interrupted_attempt", "weight_reload", "queues"} <= set(seen)


def test_summaries_have_the_same_keys(runs: dict[str, Path]):
    keys = {mode: key_paths(json.loads((d / "summary.json").read_text()))
            for mode, d in runs.items()}
    assert keys["sync"] == keys["async"] == keys["areal"]


def test_rows_have_the_same_fields(runs: dict[str, Path]):
    sample_keys = {mode: {frozenset(r) for r in read_jsonl(d / "samples.jsonl")}
                   for mode, d in runs.items()}
    update_keys = {mode: {frozenset(r) for r in read_jsonl(d / "updates.jsonl")}
                   for mode, d in runs.items()}
    assert len(sample_keys["sync"]) == 1 and len(update_keys["sync"]) == 1
    assert sample_keys["sync"] == sample_keys["async"] == sample_keys["areal"]
    assert update_keys["sync"] == update_keys["async"] == update_keys["areal"]


@pytest.mark.parametrize("mode", MODES)
def test_summary_numbers_mean_the_same_in_every_mode(runs: dict[str, Path], mode: str):
    """Each summary figure recomputed from the records by one rule, whatever the mode."""
    run_dir = runs[mode]
    summary = json.loads((run_dir / "summary.json").read_text())
    events = read_jsonl(run_dir / "events.jsonl")
    samples = read_jsonl(run_dir / "samples.jsonl")

    def of_type(kind: str) -> list[dict[str, Any]]:
        return [e for e in events if e["type"] == kind]

    for role in ("rollout", "trainer"):
        spans = merge_spans([(e["start"], e["end"]) for e in of_type("span") if e["role"] == role])
        assert summary["time"][f"{role}_busy_s"] == pytest.approx(sum(e - s for s, e in spans))
    assert summary["time"]["controller_busy_s"] > 0
    sched = summary["scheduling"]
    assert sched["skipped_commits"] == len(of_type("update_skipped"))
    assert sched["weight_sync"]["reloads"] == len(of_type("weight_reload"))
    assert set(sched["waits"]) == {"trainer_data_s", "trainer_ratio_s", "rollout_throttle_s",
                                   "rollout_ratio_s"}
    assert summary["samples"]["resubmissions"] == len(of_type("resubmission"))
    assert summary["tokens"]["interrupted"] == sum(e["tokens"]
                                                   for e in of_type("interrupted_attempt"))
    trained = {i for u in read_jsonl(run_dir / "updates.jsonl") for i in u["sample_ids"]}
    assert summary["samples"]["trained"] == len(trained)
    for s in samples:
        assert (s["batch_id"] is not None) == (s["sample_id"] in trained)
        if s["status"] != "dropped_interrupted":
            assert s["staleness"] == s["current_version"] - s["policy_version"]
    # the run's CPU time is one of this window: positive, and no more than the cores could
    # give (a ratio to the busy time is the host's speed, and failed on a loaded host)
    load = summary["load"]
    assert load["window_s"] >= summary["time"]["wall_s"]
    assert 0 < load["run_cpu_s"] <= load["window_s"] * load["cores"]
    if mode == "sync":  # the trainer waits while a batch is generated and scored
        assert sched["waits"]["trainer_data_s"] == pytest.approx(
            summary["time"]["rollout_busy_s"] + summary["time"]["controller_busy_s"])
    else:  # the paper's preset dropped or cut something in this run
        assert summary["samples"]["dropped_stale"] + summary["samples"]["resubmissions"] > 0


def test_the_ledger_refuses_an_event_outside_the_vocabulary(cfg, tmp_path: Path):
    ledger = RunLedger(cfg, tmp_path / "run")
    try:
        with pytest.raises(ValueError, match="the vocabulary says"):
            ledger.event("version_change", old_version=0, new_version=1)
        with pytest.raises(KeyError):
            ledger.event("no_such_event")
    finally:
        ledger.close()


# --- the final state's digest ---------------------------------------------------------------
def test_state_digest_sees_every_bit_and_name_but_not_dict_order():
    import torch

    from rlcore.policy.digest import state_digest

    a = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.5])}
    assert state_digest(a) == state_digest({"b": a["b"].clone(), "w": a["w"].clone()})
    assert state_digest(a).startswith("sha256:") and len(state_digest(a)) == 7 + 64
    nudged = {"w": torch.tensor([1.0, torch.nextafter(torch.tensor(2.0),
                                                      torch.tensor(3.0)).item()]),
              "b": a["b"]}
    assert state_digest(nudged) != state_digest(a)  # one ulp in one element
    assert state_digest({"v": a["w"], "b": a["b"]}) != state_digest(a)  # a renamed tensor
    assert state_digest({"w": a["w"].double(), "b": a["b"]}) != state_digest(a)  # dtype


def test_summary_digest_is_the_saved_policy_and_repeats_for_sync(tiny_model_dir: Path,
                                                                  tmp_path: Path):
    """The digest describes the weights in policy/, and a seeded sync run ends in the same
    weights bit for bit when run again."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlcore.policy.digest import state_digest

    cfg = config_from_dict(small_config(tiny_model_dir, train={"updates": 3}))
    first = sync_train(cfg, tmp_path / "a")
    again = sync_train(cfg, tmp_path / "b")
    digest = first["reproducibility"]["state_digest"]
    assert again["reproducibility"]["state_digest"] == digest
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "a" / "policy", dtype=torch.float32)
    assert state_digest(dict(saved.named_parameters())) == digest
    env = first["reproducibility"]["environment"]
    assert env["torch"] == torch.__version__ and env["threads_per_role"] == 1


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_digests_the_policy_it_saved(runs: dict[str, Path], mode: str):
    """In the asynchronous modes the final weights are read back from the parameter service;
    the digest must still be the one of the policy/ directory."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlcore.policy.digest import state_digest

    summary = json.loads((runs[mode] / "summary.json").read_text())
    saved = AutoModelForCausalLM.from_pretrained(runs[mode] / "policy", dtype=torch.float32)
    assert state_digest(dict(saved.named_parameters())) == \
        summary["reproducibility"]["state_digest"]
