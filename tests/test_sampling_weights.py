"""The weights sampling computes with (`model.rollout_weights`, rlcore/policy/sampling_weights.py).

fp16 is CUDA's, so here the mechanics run in bfloat16, which the CPU computes in; the fp16
path itself is tests/test_cuda.py's.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from rlcore.config import RunConfig, config_from_dict
from rlcore.policy.hf_policy import HFPolicy
from rlcore.policy.loading import load_model
from rlcore.policy.sampler import Draws
from rlcore.policy.sampling_weights import SamplingCopy, hold, sampling_dtype
from rlcore.policy.train_batch import TrainBatch
from tests.conftest import small_config

CUDA, CPU = torch.device("cuda:0"), torch.device("cpu")


@pytest.mark.parametrize(("weights", "dtype", "device", "held"), [
    ("compute", "fp16", CUDA, torch.float16),
    ("compute", "fp16", CPU, torch.float32),  # fp16 autocast is CUDA's only
    ("compute", "fp32", CUDA, torch.float32),
    ("fp32", "fp16", CUDA, torch.float32),
])
def test_sampling_holds_the_dtype_it_computes_in_unless_told_fp32(
        cfg: RunConfig, weights: str, dtype: str, device: torch.device, held: torch.dtype):
    model_cfg = dataclasses.replace(cfg.model, rollout_weights=weights, dtype=dtype)
    assert sampling_dtype(model_cfg, device) == held


def test_hold_casts_parameters_in_place_and_keeps_buffers_and_ties(tiny_model_dir: Path):
    model = load_model(tiny_model_dir)
    params = {n: p for n, p in model.named_parameters()}
    before = {n: p.detach().clone() for n, p in params.items()}
    hold(model, torch.bfloat16)
    for n, p in model.named_parameters():
        assert p is params[n] and p.dtype == torch.bfloat16
        assert torch.equal(p.detach(), before[n].to(torch.bfloat16))
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_a_sampling_copy_follows_its_model_in_place(tiny_model_dir: Path):
    model = load_model(tiny_model_dir)
    copy = SamplingCopy(model, torch.bfloat16)
    addresses = [p.data_ptr() for p in copy.model.parameters()]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.25)
    copy.refresh()
    for mine, theirs in zip(model.parameters(), copy.model.parameters(), strict=True):
        assert mine.dtype == torch.float32 and theirs.dtype == torch.bfloat16
        assert torch.equal(theirs.detach(), mine.detach().to(torch.bfloat16))
    assert [p.data_ptr() for p in copy.model.parameters()] == addresses


def test_on_cpu_sampling_reads_the_models_own_fp32_weights(tiny_model_dir: Path):
    cfg = config_from_dict(small_config(tiny_model_dir, model={"dtype": "fp16"}))
    for role in ("rollout", "trainer"):
        policy = HFPolicy(cfg.model, cfg.train, role=role)
        assert policy.decoders.model is policy.model and policy.sampling_copy is None
        assert all(p.dtype == torch.float32 for p in policy.model.parameters())


def test_a_trainer_that_samples_refreshes_its_copy_after_each_update(tiny_model_dir: Path):
    cfg = config_from_dict(small_config(tiny_model_dir))
    policy = HFPolicy(cfg.model, cfg.train, role="trainer")
    policy.sampling_dtype = torch.bfloat16  # what fp16 on CUDA does, in the CPU's half dtype
    prompts = [policy.encode_prompt(p) for p in ("1+2=", "13+27=", "9+9=", "4+5=")]
    gens = policy.generate(prompts, max_new_tokens=4, temperature=1.0, chunk_tokens=2,
                           draws=Draws(0, [(i, 0) for i in range(len(prompts))]))
    copy = policy.sampling_copy
    assert copy is not None and policy.decoders.model is copy.model
    batch = TrainBatch(prompts, [g.response_ids for g in gens], [g.logprobs for g in gens],
                       [[0] * len(g.response_ids) for g in gens], [1.0, -1.0, 0.5, -0.5])
    before = [p.detach().clone() for p in policy.model.parameters()]
    policy.update(batch, temperature=1.0, current_version=0)
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, policy.model.parameters(),
                                                              strict=True))
    for mine, theirs in zip(policy.model.parameters(), copy.model.parameters(), strict=True):
        assert torch.equal(theirs.detach(), mine.detach().to(torch.bfloat16))


def test_a_lora_trainers_copy_keeps_fp32_adapters_and_follows_them(tiny_model_dir: Path):
    cfg = config_from_dict(small_config(tiny_model_dir, train={"lora": {"rank": 4}}))
    policy = HFPolicy(cfg.model, cfg.train, role="trainer")
    policy.sampling_dtype = torch.bfloat16
    prompts = [policy.encode_prompt(p) for p in ("1+2=", "13+27=", "9+9=", "4+5=")]
    gens = policy.generate(prompts, max_new_tokens=4, temperature=1.0, chunk_tokens=2,
                           draws=Draws(0, [(i, 0) for i in range(len(prompts))]))
    copy = policy.sampling_copy
    assert copy is not None and policy.decoders.model is copy.model
    held = dict(copy.model.named_parameters())
    assert {n for n, p in held.items() if p.dtype == torch.float32} == \
        {n for n in held if ".lora_" in n} != set()
    batch = TrainBatch(prompts, [g.response_ids for g in gens], [g.logprobs for g in gens],
                       [[0] * len(g.response_ids) for g in gens], [1.0, -1.0, 0.5, -0.5])
    policy.update(batch, temperature=1.0, current_version=0)
    live = dict(policy.plain.named_parameters())
    moved = [n for n in held if ".lora_B." in n and bool(live[n].detach().any())]
    assert moved and all(torch.equal(held[n].detach(), live[n].detach()) for n in held
                         if ".lora_" in n)
