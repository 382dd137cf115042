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
import struct
from collections import deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from rlcore.clock import WALL, Clock
from rlcore.clock.work import Adapters, Decode, Prefill
from rlcore.policy.decoders import Decoders, stop_tensor
from rlcore.policy.graphs import captured_work


class SamplingPolicy(Protocol):
    """What the sampler needs of a policy (`HFPolicy` is one): its decoders and its ids."""

    @property
    def decoders(self) -> Decoders:
        """Makes the decoder that runs a batch's forward passes."""
        ...

    @property
    def device(self) -> torch.device: ...

    @property
    def pad_id(self) -> int: ...

    @property
    def stop_ids(self) -> Collection[int]: ...

    @property
    def adapter_elements(self) -> int:
        """The LoRA adapters' elements a row multiplies per decode step; 0 without them."""
        ...


def token_uniform(seed: int, slot: int, attempt: int, position: int) -> float:
    """The uniform in [0, 1) that draws token `position` of `attempt` of sample `slot` in a
    run seeded `seed`: the top 53 bits of blake2b-64 over the four integers (little-endian
    int64s), over 2**53."""
    h = hashlib.blake2b(struct.pack("<4q", seed, slot, attempt, position), digest_size=8)
    return (int.from_bytes(h.digest(), "little") >> 11) / 2**53


@dataclass(frozen=True)
class Draws:
    """Where a batch's randomness comes from: the run seed and each row's (slot, attempt)."""

    seed: int
    keys: Sequence[tuple[int, int]]

    def chunk(self, starts: Sequence[int | None], n: int) -> list[list[float]]:
        """Per row, the uniforms of the `n` tokens from response position `starts[row]` on
        ([B][n]); a row whose start is None (it has finished) gets zeros, never used."""
        return [[0.0] * n if pos is None else
                [token_uniform(self.seed, slot, attempt, pos + j) for j in range(n)]
                for (slot, attempt), pos in zip(self.keys, starts, strict=True)]


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per row, the first token whose cumulative probability exceeds u times the row's total.

    probs [B, V], u [B] in [0, 1) -> token ids [B]. Scaling u by the total (float64) keeps
    the pick inside the support when the float32 probabilities do not sum to exactly 1, and
    a zero-probability token is never picked.
    """
    cdf = probs.double().cumsum(-1)  # [B, V]
    target = (u.to(cdf) * cdf[:, -1])[:, None]  # [B, 1]
    return torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp(max=probs.shape[-1] - 1)


# Decode steps a batch may run past its finish before the host sees it, by device type.
# Reading the flag at once costs nothing on CPU; on a GPU it waits for the device to drain,
# which then idles while the host queues the next step. Two steps keep it busy.
FINISH_LAG = {"cuda": 2}


class FinishWatch:
    """Whether every row of a batch has finished, read `lag` steps late: a flag is read once
    `lag` more have been pushed, by then (on a GPU) copied back without stalling the device.

    On CUDA the copy is queued on the current stream of `device`, the flags' device, and an
    event recorded on that same stream says when it has landed; the current device of the
    calling thread plays no part."""

    def __init__(self, lag: int, device: torch.device):
        self.lag, self.device = lag, device
        self.pending: deque[tuple[torch.Tensor, Any]] = deque()

    def push(self, flag: torch.Tensor) -> None:
        """The flag (0-d bool, on `device`) of the step just queued."""
        event = None
        if self.device.type == "cuda":
            host = torch.empty((), dtype=torch.bool, pin_memory=True)
            host.copy_(flag, non_blocking=True)  # on the current stream of flag's device
            event = torch.cuda.current_stream(self.device).record_event()
            flag = host
        self.pending.append((flag, event))

    def seen(self) -> bool:
        """A flag pushed at least `lag` steps ago says every row has finished."""
        while len(self.pending) > self.lag:
            flag, event = self.pending.popleft()
            if event is not None:
                event.synchronize()
            if bool(flag):
                return True
        return False


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
    `clock` as it ends (`rlcore/clock/work.py`). Within a chunk the tokens, log-probabilities
    and finished rows stay tensors on the policy's device; the responses are read back once,
    at the chunk's end. Whether every row has finished is read `FINISH_LAG` steps late on a
    GPU; the steps run past the finish are dropped, so what is recorded and charged does not
    depend on the lag.
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
        ids = torch.tensor(
            [[pad] * (width - len(p)) + list(p) for p in prompt_ids], device=dev
        )  # [B, width]
        mask = torch.tensor(
            [[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids], device=dev
        )  # [B, width]
        self.decoder = policy.decoders.new(ids, mask, max_new_tokens)
        self.span = width + max_new_tokens  # the columns a captured step's bucket must hold
        # a virtual run of a device whose captured step its profile prices: charged the
        # bucket the step would compute there, whatever this machine's decoder computes
        self.captured = clock.profile is not None and clock.profile.prices_captured_steps
        self.stop = stop_tensor(policy.stop_ids, dev)
        self.done_rows = torch.zeros(len(prompt_ids), dtype=torch.bool, device=dev)
        self.steps = 0
        self.chunks = 0  # calls of step() that sampled: the schedule counts in these
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

    def _work(self) -> tuple[int, int]:
        """What the clock charges a decode step: the decoder's own rows and columns, or the
        captured step's bucket (`self.captured`)."""
        return captured_work(self.rows, self.span) if self.captured else self.decoder.work()

    def _prefill(self) -> torch.Tensor:
        tokens = self.rows * self.decoder.context
        return self.clock.compute(Prefill(calls=1, tokens=tokens), self.decoder.refill)

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
        if self.done:
            return 0
        self.chunks += 1
        n = min(n_tokens, self.max_new_tokens - self.steps)
        u = None
        if self.draws is not None:
            starts = [None if g.finished else len(g.response_ids) for g in self.gens]
            u = torch.tensor(self.draws.chunk(starts, n), dtype=torch.float64,
                             device=self.done_rows.device)  # [B, n]
        toks, logps, live, versions = [], [], [], []
        works: list[tuple[int, int]] = []  # rows and columns of each forward's step
        dev = self.done_rows.device
        watch = FinishWatch(FINISH_LAG.get(dev.type, 0), dev)
        pad = torch.full_like(self.done_rows, self.policy.pad_id, dtype=torch.long)
        for j in range(n):
            logp = torch.log_softmax(self.next_logits / self.temperature, dim=-1)  # [B, V]
            tok = logp.argmax(-1) if u is None else inverse_cdf(logp.exp(), u[:, j])  # [B]
            toks.append(tok)
            logps.append(logp.gather(-1, tok[:, None]).squeeze(-1))  # [B]
            live.append(~self.done_rows)
            versions.append(self.logits_version)
            self.done_rows = self.done_rows | (live[-1] & torch.isin(tok, self.stop))
            watch.push(self.done_rows.all())
            self.steps += 1
            # Finished rows keep receiving the pad token; causal attention keeps it from
            # touching any position that was recorded.
            self.decoder.append(torch.where(self.done_rows, pad, tok))
            if self.steps >= self.max_new_tokens or watch.seen():
                break
            self.next_logits = self.decoder.forward()
            self.logits_version = self.version
            works.append(self._work())
        sampled, steps = self._record(toks, logps, live, versions)
        if steps is not None:  # every row finished at this step: no forward after it
            self.steps -= len(toks) - steps  # those run past it, if seen late, are dropped
            works = works[:steps - 1]
        else:
            steps = len(toks)
        rows = sum(r for r, _ in works)
        self.clock.charge(Decode(steps=steps, rows=rows,
                                 row_context=sum(r * c for r, c in works)))
        if self.policy.adapter_elements:  # train.lora: each forward's products, unmerged
            self.clock.charge(Adapters(steps=len(works), rows=rows,
                                       params=self.policy.adapter_elements))
        return sampled

    def _record(self, toks: list[torch.Tensor], logps: list[torch.Tensor],
                live: list[torch.Tensor], versions: list[int]) -> tuple[int, int | None]:
        """Append a chunk's tokens to the rows that were running: one read back. Returns the
        tokens sampled, and the steps up to the one after which every row had finished (None
        if some row is still running)."""
        # A row runs for a prefix of the chunk: from its start until it samples a stop token.
        counts = torch.stack(live, dim=1).sum(-1).tolist()  # [B]
        tok_rows = torch.stack(toks, dim=1).tolist()  # [B, steps]
        logp_rows = torch.stack(logps, dim=1).tolist()
        finished = self.done_rows.tolist()
        for g, c, t, lp, f in zip(self.gens, counts, tok_rows, logp_rows, finished,
                                  strict=True):
            g.response_ids += t[:c]
            g.logprobs += lp[:c]
            g.versions += versions[:c]
            g.finished = f
        # A row's count ends at its stop token, so the last row to stop stopped at the longest
        return sum(counts), max(counts) if all(finished) else None
