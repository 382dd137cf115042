"""The static decoder against transformers' forward: the same logits bit for bit on CPU, token
after token, padded or not, whatever the head grouping, across weight swaps; and the sampler
records the same responses through either."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from rlcore.config import ConfigError, RunConfig
from rlcore.policy import decoders as decoders_mod
from rlcore.policy.decoders import (
    HFDecoder,
    StaticDecoder,
    cache_keyword,
    resolve_decode,
    static_unsupported,
)
from rlcore.policy.generation import generate
from rlcore.policy.graphs import GraphDecoder, GraphPool, rows_bucket, span_bucket
from rlcore.policy.sampler import Draws, token_uniform
from tests.test_backend import PROMPTS, policy_for


def qwen2(heads: int, kv_heads: int, attn: str = "sdpa", seed: int = 0) -> Qwen2ForCausalLM:
    """A random two-layer Qwen2 with the given head grouping."""
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=50, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, max_position_embeddings=128,
                         tie_word_embeddings=True, pad_token_id=0)
    config._attn_implementation = attn
    return Qwen2ForCausalLM(config).eval()


def llama(heads: int, kv_heads: int, seed: int = 0) -> LlamaForCausalLM:
    """A random two-layer Llama (no attention biases) with the given head grouping."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, max_position_embeddings=128,
                         tie_word_embeddings=True, pad_token_id=0)
    config._attn_implementation = "sdpa"
    return LlamaForCausalLM(config).eval()


def batch(lengths: list[int], seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded random prompts of the given lengths: ids and mask [B, max length]."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.tensor([[0] * (width - n) + torch.randint(3, 50, (n,), generator=g).tolist()
                        for n in lengths])
    mask = torch.tensor([[0] * (width - n) + [1] * n for n in lengths])
    return ids, mask


def both(model: Qwen2ForCausalLM, lengths: list[int], steps: int
         ) -> tuple[HFDecoder, StaticDecoder]:
    ids, mask = batch(lengths)
    kw = cache_keyword(model)
    return (HFDecoder(model, ids.clone(), mask.clone(), contextlib.nullcontext, kw),
            StaticDecoder(model, ids, mask, contextlib.nullcontext, kw, steps))


def advance(decoders: tuple[HFDecoder, StaticDecoder], tok: torch.Tensor) -> None:
    """Append the same token to both and assert the next logits are bit for bit equal."""
    ref, fast = decoders
    ref.append(tok)
    fast.append(tok)
    assert ref.context == fast.context
    assert torch.equal(ref.forward(), fast.forward())


class TestStaticDecoderMatchesTransformers:
    @pytest.mark.parametrize("arch", [qwen2, llama], ids=["qwen2", "llama"])
    @pytest.mark.parametrize(("heads", "kv_heads"), [(4, 2), (4, 4), (4, 1)])
    @pytest.mark.parametrize("lengths", [[3, 7, 5, 7], [6, 6, 6]], ids=["padded", "even"])
    def test_logits_bit_for_bit(self, arch: Any, heads: int, kv_heads: int,
                                lengths: list[int]):
        model = arch(heads, kv_heads)
        decoders = both(model, lengths, steps=20)
        assert torch.equal(decoders[0].refill(), decoders[1].refill())
        g = torch.Generator().manual_seed(2)
        with torch.no_grad():
            for _ in range(20):
                advance(decoders, torch.randint(3, 50, (len(lengths),), generator=g))

    def test_weights_loaded_in_place_are_seen_with_and_without_refill(self):
        model = qwen2(4, 2)
        decoders = both(model, [4, 9, 6], steps=12)
        for d in decoders:
            d.refill()
        tok = torch.tensor([5, 6, 7])
        advance(decoders, tok)
        with torch.no_grad():  # as the rollout worker loads a version: copy_ in place
            for p in model.parameters():
                p.add_(0.01 * torch.randn_like(p))
        advance(decoders, tok)  # keep_kv: new weights on the old cache
        assert torch.equal(decoders[0].refill(), decoders[1].refill())  # continue
        advance(decoders, tok)


class TestFixedShapeStep:
    """What `graph` captures, run eagerly on CPU: the step at a bucket's fixed shapes, over
    every column of the cache under a mask. Its rounding may differ from the reference's,
    so it is held within 1e-5, not bit for bit."""

    def test_buckets_round_rows_to_powers_of_two_and_columns_to_128(self):
        assert [rows_bucket(n) for n in (1, 2, 3, 5, 32, 33)] == [1, 2, 4, 8, 32, 64]
        assert [span_bucket(n) for n in (1, 128, 129)] == [128, 128, 256]

    @pytest.mark.parametrize(("heads", "kv_heads"), [(4, 2), (4, 4)])
    def test_logits_agree_with_the_reference_in_a_padded_bucket(self, heads: int,
                                                                 kv_heads: int):
        model = qwen2(heads, kv_heads)
        lengths = [3, 7, 5]  # 3 rows in a bucket of 4: one row of padding
        ids, mask = batch(lengths)
        kw = cache_keyword(model)
        ref = HFDecoder(model, ids.clone(), mask.clone(), contextlib.nullcontext, kw)
        pool = GraphPool(model, contextlib.nullcontext, cache_keyword(model), capture=False)
        fixed = GraphDecoder(pool, ids, mask, kw, 16)
        assert torch.equal(ref.refill(), fixed.refill())  # the same eager prefill
        assert fixed.bucket is not None and fixed.bucket.keys[0].shape[0] == 4
        g = torch.Generator().manual_seed(2)
        with torch.no_grad():
            for _ in range(16):
                tok = torch.randint(3, 50, (3,), generator=g)
                ref.append(tok)
                fixed.append(tok)
                a, b = ref.forward(), fixed.forward()
                assert a.shape == b.shape
                assert (a - b).abs().max().item() < 1e-5

    def test_under_autocast_over_fp32_weights_it_agrees_with_the_static_step(self):
        """Autocast (bf16 on CPU, fp16 on CUDA) over fp32 weights, as `rollout_weights: fp32`
        runs: the rotated keys come out fp32 and the values in the autocast dtype, and the
        step writes both into its cache, as the static step's slice assignment does."""
        model = qwen2(4, 2)
        ids, mask = batch([3, 7, 5])
        kw = cache_keyword(model)

        def bf16() -> contextlib.AbstractContextManager[object]:
            return torch.autocast("cpu", dtype=torch.bfloat16)

        ref = StaticDecoder(model, ids.clone(), mask.clone(), bf16, kw, 8)
        fixed = GraphDecoder(GraphPool(model, bf16, kw, capture=False), ids, mask, kw, 8)
        ref.refill()
        fixed.refill()
        with torch.no_grad():
            for tok in ([7, 8, 9], [10, 11, 12], [13, 14, 15]):
                ref.append(torch.tensor(tok))
                fixed.append(torch.tensor(tok))
                a, b = ref.forward(), fixed.forward()
                assert (a - b).abs().max().item() < 1e-2  # bf16: ~3 digits

    def test_a_second_batch_reuses_the_bucket_and_forgets_the_first(self):
        model = qwen2(4, 2)
        pool = GraphPool(model, contextlib.nullcontext, cache_keyword(model), capture=False)
        kw = cache_keyword(model)
        outs = []
        for seed in (1, 5, 1):  # the third batch is the first again, after another
            ids, mask = batch([4, 6], seed=seed)
            d = GraphDecoder(pool, ids, mask, kw, 8)
            d.refill()
            d.append(torch.tensor([7, 8]))
            outs.append(d.forward())
        assert len(pool.buckets) == 1
        assert torch.equal(outs[0], outs[2]) and not torch.equal(outs[0], outs[1])


def adapted(model: Qwen2ForCausalLM, dtype: torch.dtype = torch.float32
            ) -> dict[str, torch.Tensor]:
    """`model` with LoRA on every target as a rollout holds it (base in `dtype`, adapters
    fp32), B drawn nonzero; its live adapters."""
    from rlcore.config import LoraConfig
    from rlcore.policy import lora

    cfg = LoraConfig(rank=4)
    model.name_or_path = "qwen2-test"  # PEFT records it as the adapters' base
    adapter = lora.rollout_wrap(model, cfg, lora.targets(model, cfg), dtype)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, t in adapter.items():
            if ".lora_B." in name:
                t.copy_(0.05 * torch.randn(t.shape, generator=g))
    return adapter


class TestAdaptersUnmerged:
    """Under train.lora the static and fixed-shape steps apply the adapters unmerged, as
    PEFT's forward does, and read each version's adapters where its load wrote them."""

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
    def test_logits_bit_for_bit_and_loads_seen_in_place(self, dtype: torch.dtype):
        model = qwen2(4, 2)
        adapter = adapted(model, dtype)
        decoders = both(model, [3, 7, 5], steps=12)
        assert torch.equal(decoders[0].refill(), decoders[1].refill())
        tok = torch.tensor([5, 6, 7])
        advance(decoders, tok)
        with torch.no_grad():  # a new version's adapters, loaded in place
            before = decoders[1].forward()
            for t in adapter.values():
                t.add_(0.05 * torch.randn_like(t))
        advance(decoders, tok)
        assert not torch.equal(decoders[1].forward(), before)
        assert torch.equal(decoders[0].refill(), decoders[1].refill())
        advance(decoders, tok)

    def test_the_fixed_shape_step_agrees_and_reads_new_adapters(self):
        model = qwen2(4, 2)
        adapter = adapted(model)
        ids, mask = batch([3, 7, 5])
        kw = cache_keyword(model)
        ref = HFDecoder(model, ids.clone(), mask.clone(), contextlib.nullcontext, kw)
        pool = GraphPool(model, contextlib.nullcontext, kw, capture=False)
        fixed = GraphDecoder(pool, ids, mask, kw, 8)
        assert torch.equal(ref.refill(), fixed.refill())
        with torch.no_grad():
            for step, tok in enumerate(([7, 8, 9], [10, 11, 12], [13, 14, 15])):
                if step == 1:
                    for t in adapter.values():
                        t.mul_(-1.5)
                ref.append(torch.tensor(tok))
                fixed.append(torch.tensor(tok))
                assert (ref.forward() - fixed.forward()).abs().max().item() < 1e-5


class TestResolve:
    def test_auto_is_static_on_cpu_for_qwen2_under_sdpa_and_hf_otherwise(self):
        assert resolve_decode("auto", qwen2(4, 2)) == "static"
        assert resolve_decode("auto", qwen2(4, 2, attn="eager")) == "hf"
        assert resolve_decode("hf", qwen2(4, 2)) == "hf"

    def test_a_llama_is_mirrored_unless_its_mlp_has_biases(self):
        assert resolve_decode("auto", llama(4, 2)) == "static"
        model = llama(4, 2)
        model.config.mlp_bias = True
        assert "biases" in (static_unsupported(model) or "")

    def test_auto_says_once_why_it_falls_back_to_transformers(
            self, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch):
        monkeypatch.setattr(decoders_mod, "_SAID", set())
        model = qwen2(4, 2, attn="eager")
        for _ in range(3):
            assert resolve_decode("auto", model) == "hf"
        err = capsys.readouterr().err
        assert err.count("samples through transformers' own decoding") == 1
        assert "eager" in err

    def test_static_on_a_model_it_cannot_mirror_says_what_to_set(self):
        assert "eager" in (static_unsupported(qwen2(4, 2, attn="eager")) or "")
        with pytest.raises(ConfigError, match="model.decode: hf"):
            resolve_decode("static", qwen2(4, 2, attn="eager"))

    def test_graph_off_cuda_says_what_to_set(self):
        with pytest.raises(ConfigError, match="model.decode: static"):
            resolve_decode("graph", qwen2(4, 2))


class TestSampler:
    def test_a_chunks_uniforms_are_the_tokens_own(self):
        draws = Draws(7, [(3, 0), (4, 1)])
        assert draws.chunk([2, None], 3) == [[token_uniform(7, 3, 0, p) for p in (2, 3, 4)],
                                             [0.0, 0.0, 0.0]]

    @pytest.mark.parametrize("swap", [None, "continue", "keep_kv", "resubmit"])
    def test_static_and_hf_sample_the_same_responses(self, cfg: RunConfig, swap: str | None):
        """Sampled tokens, log-probs, versions and stops agree exactly, through a swap of
        weights between chunks under each interrupt rule."""
        runs = []
        for decode in ("hf", "static"):
            policy = policy_for(dataclasses.replace(
                cfg, model=dataclasses.replace(cfg.model, decode=decode)))
            assert policy.decoders.kind == decode
            ids = [policy.encode_prompt(p) for p in PROMPTS * 2]
            s = policy.sampler(ids, max_new_tokens=9, temperature=1.0,
                               draws=Draws(3, [(i, 0) for i in range(len(ids))]))
            out = generate(s, 2, swap or "resubmit", Swap(policy) if swap else None)
            runs.append(([(g.response_ids, g.logprobs, g.versions, g.finished)
                          for g in s.gens], out.cut, out.sampled, s.chunks))
        assert runs[0] == runs[1]
        assert runs[0][2] > 0


class Swap:
    """Between chunks: new weights once, after the first chunk."""

    def __init__(self, policy):
        self.policy, self.swapped = policy, False

    def cut(self, running: list[int]) -> None:
        return None

    def swap(self) -> int | None:
        if self.swapped:
            return None
        self.swapped = True
        with torch.no_grad():
            for p in self.policy.model.parameters():
                p.mul_(1.01)
        return 1
