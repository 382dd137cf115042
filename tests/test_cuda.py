"""The runtime's CUDA path: each mode with both roles on cuda:0, fp16 autocast, weight slots
holding device tensors, the held-out eval and a replay with a tolerance, on a GPU.

Every test here is marked `cuda` and skips, with its reason, where torch sees no GPU (CI and
the 2-core development machine). Run them on a GPU machine with `pytest -m cuda`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from rlcore.config import config_from_dict
from rlcore.evaluation import evaluate_run
from rlcore.policy.hf_policy import HFPolicy
from rlcore.record.rundir import read_jsonl, validate_summary
from rlcore.replay.replayer import replay_run
from rlcore.runners import run_mode
from rlcore.runners.asynchronous.vehicles import Processes
from rlcore.runners.asynchronous.weight_slots import WeightSlots
from tests.conftest import small_config

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="needs a CUDA GPU: torch.cuda.is_available() is False here"),
]

GPU = "cuda:0"


def gpu_config(model_dir: Path, mode: str, **sections: object) -> dict:
    """A short run with both roles on the one GPU (the device tool lends a single H100)."""
    model = {"rollout_device": GPU, "trainer_device": GPU, **sections.pop("model", {})}
    staleness = {} if mode == "sync" else {"staleness_k": 2, "interrupt": "continue"}
    return small_config(
        model_dir, mode=mode, model=model, staleness=staleness,
        train={"updates": 4, "update_batch_size": 8},
        rollout={"max_new_tokens": 5, "chunk_tokens": 1, "group_size": 4}, **sections)


@pytest.mark.parametrize("mode", ["sync", "async", "areal"])
def test_each_mode_runs_and_evaluates_on_the_gpu(tiny_model_dir: Path, tmp_path: Path,
                                                 mode: str):
    out = tmp_path / mode
    summary = run_mode(config_from_dict(gpu_config(tiny_model_dir, mode)), out)
    validate_summary(summary)
    assert summary["reproducibility"]["environment"]["devices"] == {"rollout": GPU,
                                                                 "trainer": GPU}
    assert summary["samples"]["accepted"] > 0
    assert all(b > 0 for b in summary["gpu_peak_bytes"].values())
    losses = [u["loss"] for u in read_jsonl(out / "updates.jsonl")]
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses)
    result, path = evaluate_run(out)
    assert path == out / "eval.json" and json.loads(path.read_text()) == result
    assert 0.0 <= result["sampled_pass_rate"] <= 1.0


def test_fp16_autocast_samples_in_half_and_keeps_fp32_weights(tiny_model_dir: Path):
    cfg = config_from_dict(gpu_config(tiny_model_dir, "sync", model={"dtype": "fp16"}))
    policy = HFPolicy(cfg.model, cfg.train, role="trainer")
    assert policy.use_fp16 and policy.scaler is not None
    ids = torch.tensor([policy.encode_prompt("3+4=")], device=policy.device)
    with torch.no_grad(), policy.autocast():
        logits = policy.model(ids).logits
    assert logits.dtype == torch.float16
    assert all(p.dtype == torch.float32 for p in policy.model.parameters())


def test_an_fp16_run_trains_with_finite_losses(tiny_model_dir: Path, tmp_path: Path):
    cfg = config_from_dict(gpu_config(tiny_model_dir, "areal", model={"dtype": "fp16"}))
    summary = run_mode(cfg, tmp_path / "run")
    validate_summary(summary)
    losses = [u["loss"] for u in read_jsonl(tmp_path / "run" / "updates.jsonl")]
    assert losses and all(math.isfinite(x) for x in losses)


def test_weight_slots_take_and_give_device_tensors(tiny_model_dir: Path):
    """A trainer publishes its GPU parameters through the (host, shared) slots and a rollout
    worker loads them back onto the GPU, bit for bit."""
    cfg = config_from_dict(gpu_config(tiny_model_dir, "areal"))
    trainer = HFPolicy(cfg.model, cfg.train, role="trainer")
    rollout = HFPolicy(cfg.model, cfg.train, role="rollout")
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(0.5)
    spec = [(n, tuple(p.shape), p.dtype) for n, p in trainer.model.named_parameters()]
    slots = WeightSlots(spec, 2, Processes().locked_array(4), shared=True)
    slots.write(1, slots.ordered(dict(trainer.model.named_parameters())))
    slots.publish(1, 1)
    assert slots.read_into(slots.ordered(dict(rollout.model.named_parameters()))) == 1
    assert rollout.state_digest() == trainer.state_digest()
    assert next(rollout.model.parameters()).device == torch.device(GPU)


def test_a_gpu_run_replays_within_a_tolerance(tiny_model_dir: Path, tmp_path: Path):
    run = tmp_path / "run"
    run_mode(config_from_dict(gpu_config(tiny_model_dir, "areal")), run)
    summary = replay_run(run, tmp_path / "replay", tolerance=1e-3)
    divergence = summary["reproducibility"]["replay"]["max_divergence"]
    assert set(divergence) == {"logprob_sum", "loss", "token_mismatches"}
    # same GPU, same kernels: any difference is float reordering, far below the tolerance
    assert divergence["logprob_sum"] < 1e-3 and divergence["loss"] < 1e-3
