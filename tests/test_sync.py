"""The synchronous runner end to end: records, determinism, learning signal, crash safety."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from rlcore.config import RunConfig, config_from_dict
from rlcore.records import validate_summary
from rlcore.runners.sync import sync_train
from tests.conftest import small_config
from tests.qwen_like import build_qwen_like


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def untimed(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows without their timing fields (t_*), which legitimately differ between runs."""
    return [{k: v for k, v in r.items() if not k.startswith("t_")} for r in rows]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    out = tmp_path_factory.mktemp("runs") / "sync"
    sync_train(config_from_dict(small_config(tiny_model_dir)), out)
    return out


class TestRunDirectory:
    def test_files_and_no_partials(self, run_dir: Path):
        names = {p.name for p in run_dir.iterdir()}
        assert {"summary.json", "samples.jsonl", "updates.jsonl", "events.jsonl",
                "staleness.json", "config.json", "policy"} <= names
        assert not [n for n in names if n.endswith((".partial", ".tmp"))]

    def test_summary_matches_records(self, run_dir: Path):
        summary = json.loads((run_dir / "summary.json").read_text())
        validate_summary(summary)
        samples = read_jsonl(run_dir / "samples.jsonl")
        updates = read_jsonl(run_dir / "updates.jsonl")
        assert summary["updates"] == len(updates) == 4
        assert [u["version"] for u in updates] == [1, 2, 3, 4]
        assert summary["samples"]["generated"] == len(samples) == 4 * 8
        trained = [i for u in updates for i in u["sample_ids"]]
        assert sorted(trained) == [s["sample_id"] for s in samples]  # each trained once
        assert all(s["staleness"] == 0 and s["status"] == "accepted" for s in samples)
        ledger = summary["tokens"]
        assert ledger["generated"] == sum(s["response_tokens"] for s in samples)
        assert ledger["generated"] == (ledger["trained"] + ledger["stale_dropped"]
                                       + ledger["interrupted"] + ledger["untrained"])
        # a sample generated for update v is scored by the policy of version v
        assert all(s["policy_version"] == s["current_version"] for s in samples)
        assert {s["policy_version"] for s in samples} == {0, 1, 2, 3}

    def test_config_json_records_environment(self, run_dir: Path):
        cfg = json.loads((run_dir / "config.json").read_text())
        assert cfg["config"]["mode"] == "sync"
        assert cfg["environment"]["packages"]["torch"]
        assert cfg["environment"]["packages"]["transformers"]
        assert cfg["devices"] == {"rollout": "cpu", "trainer": "cpu"}

    def test_events_show_alternating_spans(self, run_dir: Path):
        spans = [e for e in read_jsonl(run_dir / "events.jsonl") if e["type"] == "span"]
        workers = [e["worker"] for e in spans]
        assert workers == ["rollout", "reward", "trainer"] * 4
        assert all(a["end"] <= b["start"] + 1e-9 for a, b in zip(spans, spans[1:], strict=False))

    def test_every_trainable_tensor_changed(self, run_dir: Path, tiny_model_dir: Path):
        base = load_file(str(tiny_model_dir / "model.safetensors"))
        final = load_file(str(run_dir / "policy" / "model.safetensors"))
        assert base.keys() == final.keys()
        unchanged = [n for n in base if torch.equal(base[n], final[n])]
        assert unchanged == []


def test_same_seed_same_samples(run_dir: Path, tiny_model_dir: Path, tmp_path: Path):
    sync_train(config_from_dict(small_config(tiny_model_dir)), tmp_path / "again")
    a = untimed(read_jsonl(run_dir / "samples.jsonl"))
    b = untimed(read_jsonl(tmp_path / "again" / "samples.jsonl"))
    assert a == b


def test_other_seed_other_samples(run_dir: Path, tiny_model_dir: Path, tmp_path: Path):
    sync_train(config_from_dict(small_config(tiny_model_dir, seed=1)), tmp_path / "s1")
    a = untimed(read_jsonl(run_dir / "samples.jsonl"))
    b = untimed(read_jsonl(tmp_path / "s1" / "samples.jsonl"))
    assert a != b


def test_crash_keeps_previous_complete_run(cfg: RunConfig, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch):
    out = tmp_path / "run"
    sync_train(cfg, out)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}

    from rlcore.backend import HFPolicy

    def boom(self, *args, **kwargs):
        raise RuntimeError("trainer died")

    monkeypatch.setattr(HFPolicy, "update", boom)
    with pytest.raises(RuntimeError, match="trainer died"):
        sync_train(cfg, out, force=True)
    after = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()
             and not p.name.endswith(".partial")}
    assert after == before


@pytest.mark.parametrize("objective", ["behav_clip", "decoupled", "a3po"])
def test_every_objective_runs(tiny_model_dir: Path, tmp_path: Path, objective: str):
    cfg = config_from_dict(small_config(tiny_model_dir, train={
        "updates": 2, "update_batch_size": 8, "objective": objective, "minibatches": 2}))
    summary = sync_train(cfg, tmp_path / objective)
    updates = read_jsonl(tmp_path / objective / "updates.jsonl")
    assert summary["objective"] == objective
    assert all("loss/clip_frac" in u and "loss/imp_weight_max" in u for u in updates)
    if objective == "decoupled":
        assert all(u["time/prox_recompute_s"] > 0 for u in updates)


def test_qwen_class_model_directory_with_chat_template(tmp_path: Path):
    """The paper's path: AutoTokenizer, a chat template and two stop tokens, from a local dir."""
    model_dir = build_qwen_like(tmp_path / "qwen-like")
    cfg = config_from_dict(small_config(
        model_dir, model={"path": str(model_dir), "prompt_format": "chat"},
        rollout={"max_new_tokens": 8, "chunk_tokens": 4, "group_size": 2},
        train={"updates": 2, "update_batch_size": 4}))
    summary = sync_train(cfg, tmp_path / "run")
    assert summary["updates"] == 2
    from rlcore.backend import HFPolicy

    policy = HFPolicy(cfg.model, cfg.train)
    assert type(policy.tokenizer).__name__ == "Qwen2Tokenizer"
    assert len(policy.stop_ids) == 2
    prompt = policy.tokenizer.decode(policy.encode_prompt("3+4="))
    assert prompt.startswith("<|im_start|>user\n3+4=") and prompt.endswith("assistant\n")
