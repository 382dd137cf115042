"""Chunked sampling with a KV cache (paper §4.5).

`ChunkedSampler` advances a batch `chunk_tokens` at a time so that the generation loop
(`generation.py`) can look at the policy clock between chunks, and records for every sampled
token its log-probability under the sampling distribution (logits / temperature) and the
policy version that sampled it. `HFPolicy.sampler` builds one.

Sampling randomness is a pure function of the run, not a generator's state: token j of
attempt a of sample slot s in a run seeded r is drawn by inverse CDF with the uniform
`token_uniform(r, s, a, j)`. So a draw does not depend on which other rows shared its batch,
on how the batch was chunked, or on what the worker sampled before, and `rlcore replay` can
re-derive every draw from the schedule alone (docs/replay.md).
"""

from __future__ import annotations

import hashlib
import inspect
import struct
from collections.abc import Collection, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from transformers import DynamicCache

from rlcore.clock import WALL, Clock
from rlcore.clock.work import Decode, Prefill


class SamplingPolicy(Protocol):
    """What the sampler needs of a policy (`HFPolicy` is one): a causal LM and its ids."""

    @property
    def model(self) -> Any:
        """A transformers causal LM: called with input ids and a KV cache."""
        ...

    @property
    def device(self) -> torch.device: ...

    @property
    def pad_id(self) -> int: ...

    @property
    def stop_ids(self) -> Collection[int]: ...

    def autocast(self) -> AbstractContextManager[Any]: ...


def token_uniform(seed: int, slot: int, attempt: int, position: int) -> float:
    """The uniform in [0, 1) that draws token `position` of `attempt` of sample `slot` in a
    run seeded `seed`: the top 53 bits of blake2b-64 over the four integers (little-endian
    int64s), over 2**53."""
    h = hashlib.blake2b(struct.pack("<4q", seed, slot, attempt, position), digest_size=8)
    return (int.from_bytes(h.digest(), "little") >> 11) / 2**53


def cache_keyword(model: torch.nn.Module) -> str:
    """The keyword under which `model`'s forward takes the KV cache.

    transformers 5.24 renamed `past_key_values` to `cache`: the old name still works there but
    raises a FutureWarning, and goes in 5.40. Releases 5.0 to 5.23 know only
    `past_key_values` (there `cache` would land in **kwargs and be ignored). The forward's
    signature tells which; the deprecation decorator keeps the signature (functools.wraps).
    """
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


@dataclass(frozen=True)
class Draws:
    """Where a batch's randomness comes from: the run seed and each row's (slot, attempt)."""

    seed: int
    keys: Sequence[tuple[int, int]]

    def uniforms(self, positions: Sequence[int]) -> list[float]:
        """One uniform per row, for the token at `positions[row]` of that row's response."""
        return [token_uniform(self.seed, slot, attempt, pos)
                for (slot, attempt), pos in zip(self.keys, positions, strict=True)]


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per row, the first token whose cumulative probability exceeds u times the row's total.

    probs [B, V], u [B] in [0, 1) -> token ids [B]. Scaling u by the total (float64) keeps
    the pick inside the support when the float32 probabilities do not sum to exactly 1, and
    a zero-probability token is never picked.
    """
    cdf = probs.double().cumsum(-1)  # [B, V]
    target = (u.to(cdf) * cdf[:, -1])[:, None]  # [B, 1]
    return torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp(max=probs.shape[-1] - 1)


@dataclass
class Generation:
    """One sampled response with its per-token log-probabilities and policy versions."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finished: bool = False  # ended with a stop token (else cut at max_new_tokens)


class ChunkedSampler:
    """Batched sampling with a KV cache, advanced `chunk_tokens` at a time.

    Between chunks the caller may swap the weights and call `reprefill` (AReaL's
    `interrupt: continue`), or abandon the batch (the paper's `interrupt: resubmit`).
    `draws` None means greedy (argmax) decoding. Each prefill and each chunk is reported to
    `clock` as it ends (`rlcore/clock/work.py`).
    """

    def __init__(
        self,
        policy: SamplingPolicy,
        prompt_ids: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        temperature: float,
        draws: Draws | None,
        version: int = 0,
        clock: Clock = WALL,
    ):
        if draws is not None and len(draws.keys) != len(prompt_ids):
            raise ValueError(f"{len(prompt_ids)} prompts but {len(draws.keys)} sample keys")
        self.policy = policy
        self.clock = clock
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.draws = draws
        self.version = version  # of the weights the next forward pass runs
        self.logits_version = version  # of the weights that computed next_logits
        self.gens = [Generation(prompt_ids=list(p)) for p in prompt_ids]
        dev = policy.device
        width = max(len(p) for p in prompt_ids)
        pad = policy.pad_id
        # Left padding keeps every row's next token in the last column.
        self.ids = torch.tensor(
            [[pad] * (width - len(p)) + list(p) for p in prompt_ids], device=dev
        )  # [B, width]
        self.mask = torch.tensor(
            [[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids], device=dev
        )  # [B, width]
        self.done_rows = torch.zeros(len(prompt_ids), dtype=torch.bool, device=dev)
        self.steps = 0
        self.chunks = 0  # calls of step() that sampled: the schedule counts in these
        self._cache_kw = cache_keyword(policy.model)
        self.next_logits = self._prefill()  # [B, V]

    @property
    def done(self) -> bool:
        return self.steps >= self.max_new_tokens or bool(self.done_rows.all())

    @property
    def rows(self) -> int:
        return len(self.gens)

    def finished(self, row: int) -> bool:
        """The row ended with a stop token."""
        return self.gens[row].finished

    def length(self, row: int) -> int:
        """Response tokens the row has so far."""
        return len(self.gens[row].response_ids)

    def _prefill(self) -> torch.Tensor:
        return self.clock.compute(Prefill(calls=1, tokens=self.ids.numel()), self._forward_all)

    def _forward_all(self) -> torch.Tensor:
        """A new KV cache of every position so far; returns the last position's logits."""
        self.cache = DynamicCache()
        pos = (self.mask.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad(), self.policy.autocast():
            out = self.policy.model(
                input_ids=self.ids, attention_mask=self.mask, position_ids=pos,
                use_cache=True, **{self._cache_kw: self.cache},
            )
        return out.logits[:, -1].float()

    def reprefill(self, version: int) -> None:
        """Rebuild the KV cache of prompt + partial response under the current weights."""
        self.version = self.logits_version = version
        self.next_logits = self._prefill()

    def keep_cache(self, version: int) -> None:
        """Go on under new weights on the KV cache the old ones computed (`keep_kv`).

        The next token is still drawn from logits of the old weights, so it keeps their
        version; the tokens after it are computed by the new weights, attending to old keys.
        """
        self.version = version

    def step(self, n_tokens: int) -> int:
        """Sample up to n_tokens more tokens per unfinished row; returns tokens sampled."""
        sampled = steps = rows = row_context = 0
        stop = self.policy.stop_ids
        if self.done:
            return 0
        self.chunks += 1
        for _ in range(n_tokens):
            if self.done:
                break
            logp = torch.log_softmax(self.next_logits / self.temperature, dim=-1)  # [B, V]
            if self.draws is None:
                tok = logp.argmax(-1)  # [B]
            else:
                u = self.draws.uniforms([len(g.response_ids) for g in self.gens])
                tok = inverse_cdf(logp.exp(), torch.tensor(u, dtype=torch.float64,
                                                           device=logp.device))
            tok_logp = logp.gather(-1, tok[:, None]).squeeze(-1)  # [B]
            live = (~self.done_rows).tolist()
            for i, (t, lp) in enumerate(zip(tok.tolist(), tok_logp.tolist(), strict=True)):
                if not live[i]:
                    continue
                g = self.gens[i]
                g.response_ids.append(t)
                g.logprobs.append(lp)
                g.versions.append(self.logits_version)
                sampled += 1
                if t in stop:
                    g.finished = True
            self.done_rows |= torch.tensor([g.finished for g in self.gens], device=tok.device)
            self.steps += 1
            steps += 1
            # Finished rows keep receiving the pad token; causal attention keeps it from
            # touching any position that was recorded.
            tok = torch.where(self.done_rows, torch.full_like(tok, self.policy.pad_id), tok)
            self.ids = torch.cat([self.ids, tok[:, None]], dim=1)
            self.mask = torch.cat([self.mask, torch.ones_like(tok[:, None])], dim=1)
            if self.done:
                break
            pos = self.mask.sum(-1, keepdim=True) - 1  # [B, 1]
            with torch.no_grad(), self.policy.autocast():
                out = self.policy.model(
                    input_ids=tok[:, None], attention_mask=self.mask, position_ids=pos,
                    use_cache=True, **{self._cache_kw: self.cache},
                )
            self.next_logits = out.logits[:, -1].float()
            self.logits_version = self.version
            rows += self.mask.shape[0]
            row_context += self.mask.numel()
        self.clock.charge(Decode(steps=steps, rows=rows, row_context=row_context))
        return sampled
