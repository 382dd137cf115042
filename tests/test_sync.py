"""The synchronous runner end to end: records, determinism, learning signal, crash safety."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from rlcore.config import RunConfig, config_from_dict
from rlcore.policy.hf_policy import HFPolicy
from rlcore.policy.sampler import Draws
from rlcore.policy.stand_in import build_stand_in
from rlcore.policy.train_batch import TrainBatch
from rlcore.record.rundir import read_jsonl, validate_summary
from rlcore.runners.sync import sync_train
from tests.conftest import small_config


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
        assert [e["role"] for e in spans] == ["rollout", "controller", "trainer"] * 4
        assert [e["worker"] for e in spans] == ["rollout0", "controller", "trainer0"] * 4
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

    from rlcore.policy.hf_policy import HFPolicy

    def boom(self, *args, **kwargs):
        raise RuntimeError("trainer died")

    monkeypatch.setattr(HFPolicy, "update", boom)
    with pytest.raises(RuntimeError, match="trainer died"):
        sync_train(cfg, out, force=True)
    after = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()
             and not p.name.endswith(".partial")}
    assert after == before


OBJECTIVES = ("pg", "behav_clip", "decoupled", "a3po")
SHIFT = 0.5  # the controlled batch's behaviour log-probs lie 0.5 below the current policy's


def off_policy_batch(policy: HFPolicy) -> TrainBatch:
    """Sampled responses made stale by hand: sampled at version 0, trained at version 2, by
    a behaviour policy that gave every token 0.5 less log-probability than pi_theta does."""
    prompts = [policy.encode_prompt(p) for p in ("1+2=", "13+27=", "3+4=", "9+9=")]
    gens = policy.generate(prompts, max_new_tokens=4, temperature=1.0, chunk_tokens=4,
                           draws=Draws(0, [(i, 0) for i in range(len(prompts))]))
    return TrainBatch(prompt_ids=[g.prompt_ids for g in gens],
                      response_ids=[g.response_ids for g in gens],
                      behav_logprobs=[[lp - SHIFT for lp in g.logprobs] for g in gens],
                      versions=[[0] * len(g.response_ids) for g in gens],
                      advantages=[1.0, -0.5, 1.0, -0.5])


def expected_loss(objective: str, batch: TrainBatch, eps: float) -> float:
    """The token-mean loss worked out by hand at the first step, where pi_theta is the
    sampling policy: log(pi_theta/pi_behav) = 0.5 on every token, staleness d = 2."""
    r = math.exp(SHIFT)  # pi_theta / pi_behav
    tokens = [(a, lp + SHIFT) for a, resp, lps in zip(batch.advantages, batch.response_ids,
                                                      batch.behav_logprobs, strict=True)
              for lp in lps[:len(resp)]]

    def clipped(ratio: float, a: float) -> float:  # -min(ratio A, clip(ratio) A)
        return -min(ratio * a, min(max(ratio, 1 - eps), 1 + eps) * a)

    per_token = {
        "pg": lambda a, logp: -a * logp,  # -A log pi_theta
        "behav_clip": lambda a, logp: clipped(r, a),  # ratio against pi_behav
        "decoupled": lambda a, logp: r * clipped(1.0, a),  # prox = pi_theta: u = 1
        # a3po: log prox = (behav + theta) / 2 (alpha = 1/d): prox/behav = u = e^0.25
        "a3po": lambda a, logp: math.exp(SHIFT / 2) * clipped(math.exp(SHIFT / 2), a),
    }[objective]
    return sum(per_token(a, logp) for a, logp in tokens) / len(tokens)


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_every_objective_runs(tiny_model_dir: Path, tmp_path: Path, objective: str):
    """Each objective trains end to end, and on an off-policy batch gives its own loss,
    importance weight and clip fraction, each as worked out by hand."""
    cfg = config_from_dict(small_config(tiny_model_dir, train={
        "updates": 2, "update_batch_size": 8, "objective": objective, "minibatches": 2}))
    summary = sync_train(cfg, tmp_path / objective)
    assert summary["objective"] == objective and summary["updates"] == 2

    eps = cfg.train.clip_eps
    policy = HFPolicy(dataclasses.replace(cfg.model), dataclasses.replace(cfg.train,
                                                                           minibatches=1))
    batch = off_policy_batch(policy)
    stats = policy.update(batch, temperature=1.0, current_version=2)
    assert stats["loss"] == pytest.approx(expected_loss(objective, batch, eps), rel=1e-3)
    weight = math.exp(SHIFT / 2) if objective == "a3po" else math.exp(SHIFT)
    assert stats["loss/imp_weight_mean"] == pytest.approx(weight, rel=1e-3)
    # the clipped branch is taken for A > 0 (half the sequences) when the ratio leaves the
    # trust region: behav_clip's r = e^0.5 and a3po's u = e^0.25 do, pg and decoupled's not
    clips = objective in ("behav_clip", "a3po")
    assert (stats["loss/clip_frac"] > 0.2) == clips and (stats["loss/clip_frac"] == 0) != clips
    others = {o: expected_loss(o, batch, eps) for o in OBJECTIVES if o != objective}
    assert all(abs(v - stats["loss"]) > 1e-2 for v in others.values()), others


def test_qwen_class_model_directory_with_chat_template(tmp_path: Path):
    """The paper's path: AutoTokenizer, a chat template and two stop tokens, from a local dir."""
    model_dir = tmp_path / "qwen-like"
    build_stand_in(model_dir, "tiny")
    cfg = config_from_dict(small_config(
        model_dir, model={"path": str(model_dir), "prompt_format": "chat"},
        rollout={"max_new_tokens": 8, "chunk_tokens": 4, "group_size": 2},
        train={"updates": 2, "update_batch_size": 4}))
    summary = sync_train(cfg, tmp_path / "run")
    assert summary["updates"] == 2
    from rlcore.policy.hf_policy import HFPolicy

    policy = HFPolicy(cfg.model, cfg.train)
    assert type(policy.tokenizer).__name__ == "Qwen2Tokenizer"
    assert len(policy.stop_ids) == 2
    prompt = policy.tokenizer.decode(policy.encode_prompt("3+4="))
    assert prompt.startswith("<|im_start|>system\n")  # a default system turn, as Qwen2.5's
    assert "<|im_start|>user\n3+4=<|im_end|>\n" in prompt and prompt.endswith("assistant\n")
