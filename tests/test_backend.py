"""HFPolicy: tokenizer loading, chunked sampling vs recompute, state transfer, saving."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from rlcore.config import RunConfig
from rlcore.policy.hf_policy import HFPolicy
from rlcore.policy.loading import load_tokenizer
from rlcore.policy.sampler import Draws
from rlcore.policy.train_batch import TrainBatch

PROMPTS = ["1+2=", "13+27=", "3+4=", "9+9=", "0+0="]  # different lengths: left padding


def policy_for(cfg: RunConfig, path: Path | None = None) -> HFPolicy:
    model = cfg.model if path is None else dataclasses.replace(cfg.model, path=str(path))
    return HFPolicy(model, cfg.train)


def sample(policy: HFPolicy, chunk: int, seed: int = 0, max_new: int = 5):
    ids = [policy.encode_prompt(p) for p in PROMPTS]
    return policy.generate(ids, max_new_tokens=max_new, temperature=1.0, chunk_tokens=chunk,
                           draws=Draws(seed, [(i, 0) for i in range(len(ids))]))


class TestTokenizer:
    def test_round_trip_keeps_spaces_and_newlines(self, tiny_model_dir: Path):
        tok = load_tokenizer(tiny_model_dir)
        assert type(tok).__name__ != "Qwen2Tokenizer"
        text = "def f(x):\n    return x + 1  # two  spaces\n\n12+7=19"
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert len(ids) == len(text)  # one token per character
        assert tok.decode(ids) == text

    def test_specials_are_distinct(self, tiny_model_dir: Path):
        tok = load_tokenizer(tiny_model_dir)
        assert len({tok.pad_token_id, tok.eos_token_id, tok.unk_token_id}) == 3


class TestSampling:
    @pytest.mark.parametrize("chunk", [1, 2])
    def test_logprobs_equal_recompute(self, cfg: RunConfig, chunk: int):
        policy = policy_for(cfg)
        gens = sample(policy, chunk, max_new=6)
        assert max(len(g.response_ids) for g in gens) > chunk  # spans several chunks
        recomputed = policy.recompute_logprobs([g.prompt_ids for g in gens],
                                               [g.response_ids for g in gens], temperature=1.0)
        for g, lp in zip(gens, recomputed, strict=True):
            assert len(lp) == len(g.logprobs) == len(g.response_ids)
            assert torch.allclose(torch.tensor(lp), torch.tensor(g.logprobs), atol=1e-5)

    def test_chunk_size_does_not_change_samples(self, cfg: RunConfig):
        policy = policy_for(cfg)
        a = [g.response_ids for g in sample(policy, chunk=1)]
        b = [g.response_ids for g in sample(policy, chunk=5)]
        assert a == b

    def test_stop_token_ends_response(self, cfg: RunConfig):
        policy = policy_for(cfg)
        for g in sample(policy, chunk=2, max_new=6):
            stops = [i for i, t in enumerate(g.response_ids) if t in policy.stop_ids]
            assert stops in ([], [len(g.response_ids) - 1])
            assert g.finished == bool(stops)
            if not g.finished:
                assert len(g.response_ids) == 6

    def test_reprefill_continues_under_new_weights(self, cfg: RunConfig):
        """interrupt: continue -- after a weight swap, new tokens follow the new weights."""
        policy = policy_for(cfg)
        ids = [policy.encode_prompt(p) for p in PROMPTS]
        s = policy.sampler(ids, max_new_tokens=6, temperature=1.0,
                           draws=Draws(3, [(i, 0) for i in range(len(ids))]), version=0)
        s.step(2)
        with torch.no_grad():
            for p in policy.model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        s.reprefill(version=1)
        while not s.done:
            s.step(2)
        for g in s.gens:
            assert g.versions[:2] == [0, 0][: len(g.versions)]
            assert all(v == 1 for v in g.versions[2:])
            late = g.logprobs[2:]
            if late:
                lp = policy.recompute_logprobs([g.prompt_ids], [g.response_ids], 1.0)[0][2:]
                assert torch.allclose(torch.tensor(lp), torch.tensor(late), atol=1e-5)

    def test_greedy_is_deterministic(self, cfg: RunConfig):
        policy = policy_for(cfg)
        ids = [policy.encode_prompt(p) for p in PROMPTS]
        first = policy.greedy(ids, 5)
        assert len(first) == len(PROMPTS) and all(first), "greedy produced no tokens"
        assert policy.greedy(ids, 5) == first


class TestState:
    def test_export_load_round_trip(self, cfg: RunConfig):
        a, b = policy_for(cfg), policy_for(cfg)
        with torch.no_grad():
            for p in b.model.parameters():
                p.add_(1.0)
        b.load_state(a.export_state())
        for (n, pa), pb in zip(a.model.named_parameters(), b.model.parameters(), strict=True):
            assert torch.equal(pa, pb), n

    def test_export_is_a_copy(self, cfg: RunConfig):
        policy = policy_for(cfg)
        state = policy.export_state()
        name = next(iter(state))
        before = state[name].clone()
        with torch.no_grad():
            dict(policy.model.named_parameters())[name].add_(1.0)
        assert torch.equal(state[name], before)

    def test_update_moves_every_tensor_and_save_reloads(self, cfg: RunConfig, tmp_path: Path):
        policy = policy_for(cfg)
        before = policy.export_state()
        gens = sample(policy, chunk=2)
        batch = TrainBatch([g.prompt_ids for g in gens], [g.response_ids for g in gens],
                           [g.logprobs for g in gens], [g.versions for g in gens],
                           advantages=[1.0, -1.0, 0.5, -0.5, 1.0])
        stats = policy.update(batch, temperature=1.0, current_version=0)
        assert stats["grad_norm"] > 0
        after = policy.export_state()
        unchanged = [n for n in before if torch.equal(before[n], after[n])]
        assert unchanged == []
        policy.save(tmp_path / "saved")
        reloaded = policy_for(cfg, tmp_path / "saved")
        lp_a = policy.recompute_logprobs(batch.prompt_ids, batch.response_ids, 1.0)
        lp_b = reloaded.recompute_logprobs(batch.prompt_ids, batch.response_ids, 1.0)
        assert lp_a == lp_b

    def test_minibatches_of_a_short_batch_train_every_sample(self, cfg: RunConfig):
        """A batch of whole groups may fall short of B: 5 samples in 2 minibatches are split
        [0, 2) and [2, 5) (m * 5 // 2), so the one sample with an advantage is trained."""
        policy = HFPolicy(cfg.model, dataclasses.replace(cfg.train, minibatches=2))
        gens = sample(policy, chunk=2)
        assert gens[4].response_ids, "the test needs a response to train on"
        batch = TrainBatch([g.prompt_ids for g in gens], [g.response_ids for g in gens],
                           [g.logprobs for g in gens], [g.versions for g in gens],
                           advantages=[0.0, 0.0, 0.0, 0.0, 1.0])
        assert policy.update(batch, temperature=1.0, current_version=0)["grad_norm"] > 0

    def test_positive_advantage_raises_its_logprob(self, cfg: RunConfig):
        policy = policy_for(cfg)
        gens = sample(policy, chunk=2)[:2]
        batch = TrainBatch([g.prompt_ids for g in gens], [g.response_ids for g in gens],
                           [g.logprobs for g in gens], [g.versions for g in gens],
                           advantages=[1.0, -1.0])
        policy.update(batch, temperature=1.0, current_version=0)
        after = policy.recompute_logprobs(batch.prompt_ids, batch.response_ids, 1.0)
        assert sum(after[0]) > sum(gens[0].logprobs)
        assert sum(after[1]) < sum(gens[1].logprobs)
