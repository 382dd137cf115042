"""One token through a Qwen2 decoder, op for op as transformers computes it (`decode_step`),
over the model's own parameters (`Weights`); and the prompt's forward (`prefill`), which is
transformers' own. The decoders (`decoders.py`, `graphs.py`) run these."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 (torch's own convention)
from transformers import DynamicCache


def prefill(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor,
            cache: DynamicCache, autocast: Callable[[], AbstractContextManager[Any]],
            cache_kw: str) -> torch.Tensor:
    """The model's forward over every position, filling `cache`; the last logits [B, V]."""
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    # Only the last position's logits: [B, T, V] of them would be 4 GB at batch 32 for a
    # Qwen2.5 vocabulary and a few hundred tokens. A row of the head's product does not
    # depend on the other rows, so the last one is the same either way.
    last = {"logits_to_keep": 1} if keeps_logits(model) else {}
    with torch.no_grad(), autocast():
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                    **{cache_kw: cache}, **last)
    return out.logits[:, -1].float()


def keeps_logits(model: torch.nn.Module) -> bool:
    """Whether the model's forward takes `logits_to_keep` (transformers' causal LMs do; a
    model of its own may not)."""
    return "logits_to_keep" in inspect.signature(model.forward).parameters


@dataclass(frozen=True)
class Adapter:
    """A LoRA target's adapters as PEFT holds them in the model (the live tensors, which each
    version's load overwrites in place: a captured step reads them by address): A [rank, in],
    B [out, rank], and alpha / rank."""

    a: torch.Tensor
    b: torch.Tensor
    scale: float

    @classmethod
    def of(cls, module: torch.nn.Module) -> Adapter | None:
        """The adapters of a PEFT LoRA layer (its one adapter, PEFT's `default`); None for a
        plain linear layer."""
        lora_a: Any = getattr(module, "lora_A", None)
        if not lora_a:
            return None
        (name,) = lora_a.keys()
        lora_b: Any = module.lora_B
        scaling: Any = module.scaling
        return cls(lora_a[name].weight, lora_b[name].weight, float(scaling[name]))


def linear(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
           adapter: Adapter | None) -> torch.Tensor:
    """A linear layer, plus its adapters' product unmerged where it has them, op for op as
    PEFT's LoRA forward computes it.

    A and B stay in fp32 (the weight slots' dtype, as PEFT keeps them over an fp16 base), and
    the input is cast to it, as PEFT casts it: under fp16 autocast the two rank-r products then
    run in fp16, as in the trainer's forward; off autocast in fp32, added to the base's output
    and rounded to its dtype once. A small update is never rounded onto the base's grid."""
    out = F.linear(h, weight, bias)
    if adapter is None:
        return out
    return (out + adapter_product(h, adapter)).to(out.dtype)


def adapter_product(h: torch.Tensor, adapter: Adapter) -> torch.Tensor:
    """alpha / rank * B (A h), with h cast to the adapters' dtype (what `Adapters` prices)."""
    x = h if h.dtype == adapter.a.dtype else h.to(adapter.a.dtype)
    return F.linear(F.linear(x, adapter.a), adapter.b) * adapter.scale


@dataclass(frozen=True)
class Layer:
    """One decoder layer's parameters (the model's own tensors, not copies), and the
    adapters of those of its linear layers that `train.lora` targets."""

    norm1: torch.Tensor
    eps1: float
    q_w: torch.Tensor
    q_b: torch.Tensor
    k_w: torch.Tensor
    k_b: torch.Tensor
    v_w: torch.Tensor
    v_b: torch.Tensor
    o_w: torch.Tensor
    norm2: torch.Tensor
    eps2: float
    gate_w: torch.Tensor
    up_w: torch.Tensor
    down_w: torch.Tensor
    q_ad: Adapter | None = None
    k_ad: Adapter | None = None
    v_ad: Adapter | None = None
    o_ad: Adapter | None = None
    gate_ad: Adapter | None = None
    up_ad: Adapter | None = None
    down_ad: Adapter | None = None


@dataclass(frozen=True)
class Weights:
    """What `decode_step` reads of a Qwen2ForCausalLM, by reference."""

    embed: torch.Tensor
    pad_idx: int | None
    layers: tuple[Layer, ...]
    norm: torch.Tensor
    norm_eps: float
    head: torch.Tensor
    inv_freq: torch.Tensor
    rope_scale: float
    heads: int
    kv_heads: int
    head_dim: int
    scaling: float

    @classmethod
    def of(cls, model: Any) -> Weights:
        base = model.model
        attn = base.layers[0].self_attn
        # a PEFT LoRA layer's weight and bias are its base layer's
        layers = tuple(Layer(
            layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon,
            layer.self_attn.q_proj.weight, layer.self_attn.q_proj.bias,
            layer.self_attn.k_proj.weight, layer.self_attn.k_proj.bias,
            layer.self_attn.v_proj.weight, layer.self_attn.v_proj.bias,
            layer.self_attn.o_proj.weight,
            layer.post_attention_layernorm.weight,
            layer.post_attention_layernorm.variance_epsilon,
            layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight, layer.mlp.down_proj.weight,
            *(Adapter.of(m) for m in (layer.self_attn.q_proj, layer.self_attn.k_proj,
                                      layer.self_attn.v_proj, layer.self_attn.o_proj,
                                      layer.mlp.gate_proj, layer.mlp.up_proj,
                                      layer.mlp.down_proj)),
        ) for layer in base.layers)
        cfg = model.config
        return cls(base.embed_tokens.weight, base.padding_idx, layers, base.norm.weight,
                   base.norm.variance_epsilon, model.lm_head.weight,
                   base.rotary_emb.inv_freq, base.rotary_emb.attention_scaling,
                   cfg.num_attention_heads, cfg.num_key_value_heads, attn.head_dim,
                   attn.scaling)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen2RMSNorm's arithmetic, op for op (its casts skipped where they change nothing)."""
    dtype = x.dtype
    if dtype != torch.float32:
        x = x.to(torch.float32)
    variance = x.pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(variance + eps)
    return weight * (x if dtype == torch.float32 else x.to(dtype))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """apply_rotary_pos_emb's arithmetic for one of q and k, op for op."""
    half = x.shape[-1] // 2
    return (x * cos) + (torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin)


def decode_step(w: Weights, tok: torch.Tensor, pos: torch.Tensor,
                keys: list[torch.Tensor], values: list[torch.Tensor], t: int | torch.Tensor,
                mask: torch.Tensor | None) -> torch.Tensor:
    """One token per row through the model: tok [B, 1] at positions pos [B, 1], written into
    column t of the caches ([B, kv_heads, T_max, head_dim] each); the logits [B, 1, V].

    With t an int it attends to columns 0..t under `mask` [B, 1, 1, t + 1] (None: every
    column): transformers' Qwen2 forward for one new token under sdpa, with its arithmetic in
    its order (a padded batch passes a boolean mask and packs the query's head groups onto the
    key heads; an unpadded one passes no mask and lets sdpa broadcast the key heads). Rows
    are [B, hidden] between attentions: one token each, the same products and elementwise
    ops as transformers' [B, 1, hidden]. With t a tensor [1] on the device, every shape is
    fixed (what a CUDA graph needs): it attends to all T_max columns under `mask`
    [B, 1, 1, T_max], which must hide the columns after t.
    """
    if isinstance(t, torch.Tensor) and mask is None:
        raise ValueError("a fixed-shape step needs the mask that hides the unwritten columns")
    b, d = tok.shape[0], w.head_dim
    x = F.embedding(tok.view(b), w.embed, w.pad_idx)  # [B, hidden]
    freqs = pos.float() * w.inv_freq.to(device=x.device, dtype=torch.float)  # [B, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [B, head_dim]
    cos = (emb.cos() * w.rope_scale).to(x.dtype).view(b, 1, 1, d)
    sin = (emb.sin() * w.rope_scale).to(x.dtype).view(b, 1, 1, d)
    groups = w.heads // w.kv_heads
    for i, layer in enumerate(w.layers):
        h = rms_norm(x, layer.norm1, layer.eps1)
        q = linear(h, layer.q_w, layer.q_b, layer.q_ad).view(b, w.heads, 1, d)
        k = linear(h, layer.k_w, layer.k_b, layer.k_ad).view(b, w.kv_heads, 1, d)
        v = linear(h, layer.v_w, layer.v_b, layer.v_ad).view(b, w.kv_heads, 1, d)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        if isinstance(t, torch.Tensor):
            # index_copy_ does not cast, as the eager path's slice assignment does: under
            # autocast over fp32 weights the rotated keys are fp32 and the values are not
            keys[i].index_copy_(2, t, k.to(keys[i].dtype))
            values[i].index_copy_(2, t, v.to(values[i].dtype))
            k_all, v_all = keys[i], values[i]  # [B, Hkv, T_max, D]
        else:
            keys[i][:, :, t:t + 1] = k
            values[i][:, :, t:t + 1] = v
            k_all, v_all = keys[i][:, :, :t + 1], values[i][:, :, :t + 1]  # [B, Hkv, t+1, D]
        if mask is None:
            a = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=None, dropout_p=0.0,
                                               scale=w.scaling, is_causal=False,
                                               enable_gqa=groups > 1)
        else:
            if groups > 1:
                q = q.view(b, w.kv_heads, groups, d)
            a = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask, dropout_p=0.0,
                                               scale=w.scaling, is_causal=False)
        x = x + linear(a.reshape(b, w.heads * d), layer.o_w, None, layer.o_ad)
        h = rms_norm(x, layer.norm2, layer.eps2)
        x = x + linear(F.silu(linear(h, layer.gate_w, None, layer.gate_ad))
                       * linear(h, layer.up_w, None, layer.up_ad), layer.down_w, None,
                       layer.down_ad)
    return F.linear(rms_norm(x, w.norm, w.norm_eps), w.head).view(b, 1, -1)


class Tokens:
    """A batch's sequence so far, in buffers allocated once for its longest: ids and mask
    [B, width + max_new_tokens], left padded, the first `t` columns written. The decoders
    that run `decode_step` build on it."""

    def __init__(self, ids: torch.Tensor, mask: torch.Tensor, max_new_tokens: int):
        b, width = ids.shape
        span = width + max_new_tokens
        self.ids = torch.empty(b, span, dtype=ids.dtype, device=ids.device)
        self.mask = torch.empty(b, span, dtype=mask.dtype, device=mask.device)
        self.ids[:, :width], self.mask[:, :width] = ids, mask
        self.t = width
        self.ones = mask.sum(-1, keepdim=True)  # [B, 1]: ones in each row's mask

    @property
    def context(self) -> int:
        return self.t

    def work(self) -> tuple[int, int]:
        """The rows a decode step computes and the columns each attends to: the batch's own
        (a captured step computes its bucket's: `graphs.GraphDecoder.work`)."""
        return self.ids.shape[0], self.t

    def append(self, tok: torch.Tensor) -> None:
        self.ids[:, self.t] = tok
        self.mask[:, self.t] = 1
        self.ones += 1
        self.t += 1

    def prefill_all(self, model: torch.nn.Module,
                    autocast: Callable[[], AbstractContextManager[Any]], cache_kw: str
                    ) -> tuple[torch.Tensor, DynamicCache]:
        """The model's own forward over the sequence so far: its last logits and cache."""
        cache = DynamicCache()
        logits = prefill(model, self.ids[:, :self.t], self.mask[:, :self.t], cache, autocast,
                         cache_kw)
        return logits, cache

