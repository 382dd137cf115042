"""How a batch's forward passes run while it samples (`model.decode`).

A decoder owns a batch's sequence so far (token ids and attention mask, left padded) and its
KV cache. The sampler asks it for the logits after the prompt (`refill`, also after new
weights under `interrupt: continue`), appends each sampled token (`append`) and asks for the
logits after it (`forward`). Three decoders:

- `HFDecoder` (`hf`): the model's own forward with a `DynamicCache` grown by concatenation,
  the ids and mask concatenated every token: the reference.
- `StaticDecoder` (`static`, and `auto` off CUDA where it applies): the prompt's forward is the
  model's own; each next token runs `decode_step`, the same tensor operations as
  transformers' Qwen2 forward in the same order, over the model's own parameters (so weights
  loaded in place are seen at once) and a KV cache allocated once for the batch's longest
  sequence. The per-token module stack, mask building and concatenations are gone; on CPU its
  logits are the reference's bit for bit (tests/test_decoders.py), so no run's numbers depend
  on which one ran.
- `GraphDecoder` (`graph`, and `auto` on CUDA where it applies; `rlcore/policy/graphs.py`):
  `decode_step` at fixed shapes, captured once per batch bucket as a CUDA graph and
  replayed, so a token costs one launch instead of one per operation.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Collection, Iterable
from contextlib import AbstractContextManager
from typing import Any, Protocol

import torch
from transformers import DynamicCache

from rlcore.config import ConfigError
from rlcore.policy.decode_step import Tokens, Weights, decode_step, prefill
from rlcore.policy.graphs import GraphDecoder, GraphPool


class Decoder(Protocol):
    """A batch's sequence and KV cache, advanced a token at a time."""

    @property
    def context(self) -> int:
        """Columns of the sequence so far (prompt width + tokens appended)."""
        ...

    def work(self) -> tuple[int, int]:
        """The rows a decode step computes and the columns each attends to (what the clock
        charges for it)."""
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
    return config_unsupported(getattr(model, "config", None), type(model).__name__)


# The decoders the static step mirrors, by their config's model_type. A Llama layer is a
# Qwen2 layer without the attention biases (and, in Llama 3's configs, another rotary
# embedding, which the rope check below refuses).
STATIC_MODELS = {"qwen2": "Qwen2", "llama": "Llama"}


def config_unsupported(cfg: Any, name: str) -> str | None:
    """Why `StaticDecoder` cannot mirror a model of config `cfg` (a transformers config, or
    None), named `name`; None when it can."""
    if cfg is None or getattr(cfg, "model_type", None) not in STATIC_MODELS:
        return (f"it mirrors {' and '.join(STATIC_MODELS.values())} decoders only, and this "
                f"model is {name}")
    if getattr(cfg, "mlp_bias", False):
        return "it mirrors MLPs without biases, and this model's have them"
    if cfg._attn_implementation != "sdpa":
        return f"it mirrors sdpa attention, and this model uses {cfg._attn_implementation}"
    if any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or ()):
        return "it mirrors full attention, and this model has sliding-window layers"
    rope = (getattr(cfg, "rope_parameters", None) or {}).get("rope_type", "default")
    if rope != "default":
        return f"it mirrors the default rotary embedding, and this model's is {rope!r}"
    return None


def resolve_decode(decode: str, model: torch.nn.Module) -> str:
    """`model.decode` for this model: `auto` is `graph` on CUDA and `static` elsewhere where
    the step can mirror the model, else `hf`; `static` on a model it cannot mirror, or
    `graph` off CUDA, is refused with the reason and what to set."""
    return decode_for(decode, static_unsupported(model), next(model.parameters()).device)


_SAID: set[str] = set()  # the fallbacks to `hf` this process has reported


def decode_for(decode: str, why: str | None, device: torch.device) -> str:
    """`resolve_decode`'s rule for a model on `device` that the static step cannot mirror
    for the reason `why` (None: it can)."""
    if decode == "auto":
        if why and why not in _SAID:
            _SAID.add(why)  # once a process: every role and evaluation resolves it
            print(f"rlcore: model.decode auto samples through transformers' own decoding, "
                  f"slower than the static step, because {why}", file=sys.stderr)
        return "hf" if why else "graph" if device.type == "cuda" else "static"
    if decode in ("static", "graph") and why:
        raise ConfigError(f"model.decode is '{decode}' but {why}: set model.decode: hf "
                          "(or auto)")
    if decode == "graph" and device.type != "cuda":
        raise ConfigError(f"model.decode is 'graph', which captures CUDA graphs, but the model "
                          f"is on {device}: set model.decode: static (or auto)")
    return decode


def cache_keyword(model: torch.nn.Module) -> str:
    """The keyword under which `model`'s forward takes the KV cache.

    transformers 5.24 renamed `past_key_values` to `cache`: the old name still works there but
    raises a FutureWarning, and goes in 5.40. Releases 5.0 to 5.23 know only
    `past_key_values` (there `cache` would land in **kwargs and be ignored). The forward's
    signature tells which; the deprecation decorator keeps the signature (functools.wraps).
    """
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


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

    def work(self) -> tuple[int, int]:
        return self.ids.shape[0], self.mask.shape[1]

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


class StaticDecoder(Tokens):
    """The model's own prefill, then `decode_step` on a KV cache allocated once."""

    def __init__(self, model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor,
                 autocast: Callable[[], AbstractContextManager[Any]], cache_kw: str,
                 max_new_tokens: int):
        super().__init__(ids, mask, max_new_tokens)
        self.model, self.autocast, self.cache_kw = model, autocast, cache_kw
        self.w = Weights.of(model)
        self.filled = 0  # columns of the KV cache written
        # transformers passes sdpa no mask where no row is padded (the mask is all ones); the
        # padding is the prompts', fixed for the batch's life
        self.padded = not bool(mask.all())
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    def refill(self) -> torch.Tensor:
        logits, cache = self.prefill_all(self.model, self.autocast, self.cache_kw)
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

    def forward(self) -> torch.Tensor:
        t = self.t - 1  # the column of the last appended token
        mask = self.mask[:, None, None, :t + 1].bool() if self.padded else None
        with torch.no_grad(), self.autocast():
            logits = decode_step(self.w, self.ids[:, t:t + 1], self.ones - 1, self.keys,
                                 self.values, t, mask)
        self.filled = self.t
        return logits[:, -1].float()


class Decoders:
    """Makes each batch's decoder for one model, as `model.decode` says; holds what batches
    share (the captured steps of `graph`)."""

    def __init__(self, model: torch.nn.Module, decode: str,
                 autocast: Callable[[], AbstractContextManager[Any]]):
        self.kind = resolve_decode(decode, model)
        self.model, self.autocast = model, autocast
        self.cache_kw = cache_keyword(model)
        self.graphs = (GraphPool(model, autocast, self.cache_kw) if self.kind == "graph"
                       else None)

    def prepare(self, rows: Iterable[int], spans: Iterable[int]) -> None:
        """Before the run: capture the steps of batches of each of `rows` rows at each of
        `spans` columns (`graph`; the other decoders keep nothing)."""
        if self.graphs is not None:
            self.graphs.prepare(rows, spans)

    def new(self, ids: torch.Tensor, mask: torch.Tensor, max_new_tokens: int) -> Decoder:
        """A decoder for a batch of left-padded prompts (ids and mask [B, width])."""
        if self.graphs is not None:
            return GraphDecoder(self.graphs, ids, mask, self.cache_kw, max_new_tokens)
        if self.kind == "static":
            return StaticDecoder(self.model, ids, mask, self.autocast, self.cache_kw,
                                 max_new_tokens)
        return HFDecoder(self.model, ids, mask, self.autocast, self.cache_kw)


def stop_tensor(stop_ids: Collection[int], device: torch.device) -> torch.Tensor:
    """The stop ids as a tensor for `torch.isin` (an empty set stops nothing)."""
    return torch.tensor(sorted(stop_ids), dtype=torch.long, device=device)


__all__ = ["Decoder", "Decoders", "HFDecoder", "StaticDecoder", "cache_keyword",
           "config_unsupported", "decode_for", "resolve_decode", "static_unsupported",
           "stop_tensor"]
