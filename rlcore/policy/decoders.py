"""How a batch's forward passes run while it samples (`model.decode`).

A decoder owns a batch's sequence so far (token ids and attention mask, left padded) and its
KV cache. The sampler asks it for the logits after the prompt (`refill`, also after new
weights under `interrupt: continue`), appends each sampled token (`append`) and asks for the
logits after it (`forward`). Two decoders:

- `HFDecoder` (`hf`): the model's own forward with a `DynamicCache` grown by concatenation,
  the ids and mask concatenated every token: the reference.
- `StaticDecoder` (`static`): the prompt's forward is the model's own; each next token runs
  `decode_step`, the same tensor operations as transformers' Qwen2 forward in the same order,
  over the model's own parameters (so weights loaded in place are seen at once) and a KV cache
  allocated once for the batch's longest sequence. The per-token module stack, mask building
  and concatenations are gone; on CPU its logits are the reference's bit for bit
  (tests/test_decoders.py), so no run's numbers depend on which one ran.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F  # noqa: N812 (torch's own convention)
from transformers import DynamicCache

from rlcore.config import ConfigError


class Decoder(Protocol):
    """A batch's sequence and KV cache, advanced a token at a time."""

    @property
    def context(self) -> int:
        """Columns of the sequence so far (prompt width + tokens appended)."""
        ...

    def refill(self) -> torch.Tensor:
        """A new KV cache of the whole sequence under the current weights; the last
        position's logits [B, V] (float32)."""
        ...

    def append(self, tok: torch.Tensor) -> None:
        """Append one token per row (tok [B]) to the sequence."""
        ...

    def forward(self) -> torch.Tensor:
        """The logits [B, V] (float32) after the last appended token, extending the cache."""
        ...


def static_unsupported(model: torch.nn.Module) -> str | None:
    """Why `StaticDecoder` cannot mirror `model`'s forward; None when it can."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) != "qwen2":
        return f"it mirrors Qwen2 decoders only, and this model is {type(model).__name__}"
    if cfg._attn_implementation != "sdpa":
        return f"it mirrors sdpa attention, and this model uses {cfg._attn_implementation}"
    if any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or ()):
        return "it mirrors full attention, and this model has sliding-window layers"
    rope = (getattr(cfg, "rope_parameters", None) or {}).get("rope_type", "default")
    if rope != "default":
        return f"it mirrors the default rotary embedding, and this model's is {rope!r}"
    return None


def resolve_decode(decode: str, model: torch.nn.Module) -> str:
    """`model.decode` for this model: `auto` is `static` where it can mirror the model, else
    `hf`; `static` on a model it cannot mirror is refused with the reason."""
    why = static_unsupported(model)
    if decode == "auto":
        return "hf" if why else "static"
    if decode == "static" and why:
        raise ConfigError(f"model.decode is 'static' but {why}: set model.decode: hf (or auto)")
    return decode


class HFDecoder:
    """The reference: transformers' forward with a `DynamicCache` grown every token."""

    def __init__(self, model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor,
                 autocast: Callable[[], AbstractContextManager[Any]], cache_kw: str):
        self.model, self.autocast, self.cache_kw = model, autocast, cache_kw
        self.ids, self.mask = ids, mask  # [B, T]
        self.cache = DynamicCache()

    @property
    def context(self) -> int:
        return self.mask.shape[1]

    def refill(self) -> torch.Tensor:
        self.cache = DynamicCache()
        return prefill(self.model, self.ids, self.mask, self.cache, self.autocast,
                       self.cache_kw)

    def append(self, tok: torch.Tensor) -> None:
        self.ids = torch.cat([self.ids, tok[:, None]], dim=1)
        self.mask = torch.cat([self.mask, torch.ones_like(tok[:, None])], dim=1)

    def forward(self) -> torch.Tensor:
        pos = self.mask.sum(-1, keepdim=True) - 1  # [B, 1]
        with torch.no_grad(), self.autocast():
            out = self.model(input_ids=self.ids[:, -1:], attention_mask=self.mask,
                             position_ids=pos, use_cache=True, **{self.cache_kw: self.cache})
        return out.logits[:, -1].float()


def prefill(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor,
            cache: DynamicCache, autocast: Callable[[], AbstractContextManager[Any]],
            cache_kw: str) -> torch.Tensor:
    """The model's forward over every position, filling `cache`; the last logits [B, V]."""
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad(), autocast():
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                    **{cache_kw: cache})
    return out.logits[:, -1].float()


@dataclass(frozen=True)
class Layer:
    """One decoder layer's parameters (the model's own tensors, not copies)."""

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
        layers = tuple(Layer(
            layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon,
            layer.self_attn.q_proj.weight, layer.self_attn.q_proj.bias,
            layer.self_attn.k_proj.weight, layer.self_attn.k_proj.bias,
            layer.self_attn.v_proj.weight, layer.self_attn.v_proj.bias,
            layer.self_attn.o_proj.weight,
            layer.post_attention_layernorm.weight,
            layer.post_attention_layernorm.variance_epsilon,
            layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight, layer.mlp.down_proj.weight,
        ) for layer in base.layers)
        cfg = model.config
        return cls(base.embed_tokens.weight, base.padding_idx, layers, base.norm.weight,
                   base.norm.variance_epsilon, model.lm_head.weight,
                   base.rotary_emb.inv_freq, base.rotary_emb.attention_scaling,
                   cfg.num_attention_heads, cfg.num_key_value_heads, attn.head_dim,
                   attn.scaling)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen2RMSNorm's arithmetic, op for op."""
    dtype = x.dtype
    x = x.to(torch.float32)
    variance = x.pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(variance + eps)
    return weight * x.to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """apply_rotary_pos_emb's arithmetic for one of q and k, op for op."""
    half = x.shape[-1] // 2
    return (x * cos) + (torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin)


def decode_step(w: Weights, tok: torch.Tensor, pos: torch.Tensor,
                keys: list[torch.Tensor], values: list[torch.Tensor], t: int,
                mask: torch.Tensor | None) -> torch.Tensor:
    """One token per row through the model: tok [B, 1] at positions pos [B, 1], written into
    column t of the caches ([B, kv_heads, T_max, head_dim] each) and attending to columns
    0..t under `mask` [B, 1, 1, t + 1] (None: every column); the logits [B, 1, V].

    transformers' Qwen2 forward for one new token under sdpa, in its order: a padded batch
    passes a boolean mask and packs the query's head groups onto the key heads; an
    unpadded one passes no mask and lets sdpa broadcast the key heads.
    """
    b = tok.shape[0]
    x = F.embedding(tok, w.embed, w.pad_idx)  # [B, 1, hidden]
    freqs = pos[..., None].float() * w.inv_freq.to(device=x.device, dtype=torch.float)
    emb = torch.cat((freqs, freqs), dim=-1)  # [B, 1, head_dim]
    cos = (emb.cos() * w.rope_scale).to(x.dtype)[:, None]  # [B, 1, 1, head_dim]
    sin = (emb.sin() * w.rope_scale).to(x.dtype)[:, None]
    shape = (b, 1, -1, w.head_dim)
    groups = w.heads // w.kv_heads
    for i, layer in enumerate(w.layers):
        h = rms_norm(x, layer.norm1, layer.eps1)
        q = F.linear(h, layer.q_w, layer.q_b).view(shape).transpose(1, 2)  # [B, H, 1, D]
        k = F.linear(h, layer.k_w, layer.k_b).view(shape).transpose(1, 2)  # [B, Hkv, 1, D]
        v = F.linear(h, layer.v_w, layer.v_b).view(shape).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        keys[i][:, :, t:t + 1] = k
        values[i][:, :, t:t + 1] = v
        k_all, v_all = keys[i][:, :, :t + 1], values[i][:, :, :t + 1]  # [B, Hkv, t+1, D]
        if mask is None:
            a = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=None, dropout_p=0.0,
                                               scale=w.scaling, is_causal=False,
                                               enable_gqa=groups > 1)
        else:
            if groups > 1:
                q = q.reshape(b, w.kv_heads, groups, w.head_dim)
            a = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask, dropout_p=0.0,
                                               scale=w.scaling, is_causal=False)
        a = a.reshape(b, -1, 1, w.head_dim).transpose(1, 2).contiguous()
        x = x + F.linear(a.reshape(b, 1, -1).contiguous(), layer.o_w)
        h = rms_norm(x, layer.norm2, layer.eps2)
        x = x + F.linear(F.silu(F.linear(h, layer.gate_w)) * F.linear(h, layer.up_w),
                         layer.down_w)
    return F.linear(rms_norm(x, w.norm, w.norm_eps), w.head)


class StaticDecoder:
    """The model's own prefill, then `decode_step` on a KV cache allocated once."""

    def __init__(self, model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor,
                 autocast: Callable[[], AbstractContextManager[Any]], cache_kw: str,
                 max_new_tokens: int):
        self.model, self.autocast, self.cache_kw = model, autocast, cache_kw
        self.w = Weights.of(model)
        b, width = ids.shape
        span = width + max_new_tokens
        dev = ids.device
        self.ids = torch.empty(b, span, dtype=ids.dtype, device=dev)
        self.mask = torch.empty(b, span, dtype=mask.dtype, device=dev)
        self.ids[:, :width], self.mask[:, :width] = ids, mask
        self.t = width
        self.filled = 0  # columns of the KV cache written
        # transformers passes sdpa no mask where no row is padded (the mask is all ones); the
        # padding is the prompts', fixed for the batch's life
        self.padded = not bool(mask.all())
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.ones = mask.sum(-1, keepdim=True)  # [B, 1]: ones in each row's mask

    @property
    def context(self) -> int:
        return self.t

    def refill(self) -> torch.Tensor:
        cache = DynamicCache()
        logits = prefill(self.model, self.ids[:, :self.t], self.mask[:, :self.t], cache,
                         self.autocast, self.cache_kw)
        if not self.keys:
            b, span = self.ids.shape
            like = cache.layers[0].keys
            self.keys = [like.new_empty(b, self.w.kv_heads, span, self.w.head_dim)
                         for _ in self.w.layers]
            self.values = [like.new_empty(b, self.w.kv_heads, span, self.w.head_dim)
                           for _ in self.w.layers]
        for i, layer in enumerate(cache.layers):
            self.keys[i][:, :, :self.t] = layer.keys
            self.values[i][:, :, :self.t] = layer.values
        self.filled = self.t
        return logits

    def append(self, tok: torch.Tensor) -> None:
        self.ids[:, self.t] = tok
        self.mask[:, self.t] = 1
        self.ones += 1
        self.t += 1

    def forward(self) -> torch.Tensor:
        t = self.t - 1  # the column of the last appended token
        mask = self.mask[:, None, None, :t + 1].bool() if self.padded else None
        with torch.no_grad(), self.autocast():
            logits = decode_step(self.w, self.ids[:, t:t + 1], self.ones - 1, self.keys,
                                 self.values, t, mask)
        self.filled = self.t
        return logits[:, -1].float()


def decoder_for(decode: str, model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor,
                autocast: Callable[[], AbstractContextManager[Any]], cache_kw: str,
                max_new_tokens: int) -> Decoder:
    """The decoder `decode` (`hf` or `static`, as `resolve_decode` gives) names."""
    if decode == "static":
        return StaticDecoder(model, ids, mask, autocast, cache_kw, max_new_tokens)
    return HFDecoder(model, ids, mask, autocast, cache_kw)


def stop_tensor(stop_ids: Collection[int], device: torch.device) -> torch.Tensor:
    """The stop ids as a tensor for `torch.isin` (an empty set stops nothing)."""
    return torch.tensor(sorted(stop_ids), dtype=torch.long, device=device)


__all__ = ["Decoder", "HFDecoder", "StaticDecoder", "decode_step", "decoder_for",
           "resolve_decode", "static_unsupported", "stop_tensor"]
