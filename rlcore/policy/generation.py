"""The rollout's generation loop: chunks, a look between them, and interrupts (paper §4.5).

Written once for everything that generates: the rollout worker looks at the policy clock
between chunks (`runners/asynchronous/rollout.py`), the synchronous baseline does not look
(`runners/sync.py`), a replay looks at the swaps and the cut its schedule recorded
(`replay/replayer.py`), and the planner runs it on a sampler without a model
(`plan/sampler.py`). When newer weights have been loaded, `staleness.interrupt` decides:
  resubmit  the rows still running are cut (the controller resubmits or drops them);
  continue  the partial responses are re-prefilled under the new weights and go on;
  keep_kv   the new weights decode on the KV cache the old ones computed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


class Chunked(Protocol):
    """A batch that samples a chunk at a time (`ChunkedSampler`, or the planner's
    `LengthSampler`)."""

    @property
    def rows(self) -> int: ...

    @property
    def chunks(self) -> int:
        """Calls of `step` that sampled: the schedule counts in these."""
        ...

    @property
    def done(self) -> bool:
        """Every row has finished, or the batch reached `rollout.max_new_tokens`."""
        ...

    def step(self, n_tokens: int) -> int:
        """Up to `n_tokens` more tokens per running row; returns the tokens sampled."""
        ...

    def finished(self, row: int) -> bool:
        """The row ended with a stop token."""
        ...

    def length(self, row: int) -> int:
        """Response tokens the row has so far."""
        ...

    def reprefill(self, version: int) -> None: ...

    def keep_cache(self, version: int) -> None: ...


class Between(Protocol):
    """What the loop asks after each chunk."""

    def cut(self, running: list[int]) -> tuple[str, list[int]] | None:
        """Rows to cut off now and why (the run is stopping; a replay's recorded cut), given
        the rows still running; None to go on. Asked after every chunk until a cut."""
        ...

    def swap(self) -> int | None:
        """The version of newer weights, once loaded into the sampler's model; None if there
        are none. Asked after each chunk that leaves rows running, until a cut."""
        ...


@dataclass
class Generated:
    """How a batch's generation ended: the rows cut off (with their lengths at the cut) and
    the tokens sampled and re-prefilled."""

    cut: dict[int, int] = field(default_factory=dict)
    cut_reason: str | None = None
    cut_after: int | None = None  # the chunk after which the rows were cut
    sampled: int = 0
    reprefilled: int = 0  # response tokens recomputed by `continue`
    kv_kept: int = 0  # response tokens whose cache `keep_kv` kept (a re-prefill saved)

    def kept(self, rows: int) -> list[int]:
        """The rows that were not cut off: the batch's emitted responses."""
        return [i for i in range(rows) if i not in self.cut]


def generate(sampler: Chunked, chunk_tokens: int, interrupt: str,
             between: Between | None = None) -> Generated:
    """Run `sampler` to its end, a chunk at a time, asking `between` after each chunk.

    After a cut no more is asked; rows not cut that are still running go on under the
    weights they have (only a counterfactual replay has such rows: a live cut takes every
    running row).
    """
    out = Generated()
    while not sampler.done:
        if out.cut_after is not None and all(sampler.finished(i)
                                             for i in out.kept(sampler.rows)):
            break
        out.sampled += sampler.step(chunk_tokens)
        if between is None or out.cut_after is not None:
            continue
        running = [i for i in range(sampler.rows) if not sampler.finished(i)]
        order = between.cut(running)
        if order is not None:
            _cut(out, sampler, *order)
            continue
        if sampler.done:
            continue
        version = between.swap()
        if version is None:
            continue
        if interrupt == "continue":
            out.reprefilled += sum(sampler.length(i) for i in running)
            sampler.reprefill(version)
        elif interrupt == "keep_kv":
            out.kv_kept += sum(sampler.length(i) for i in running)
            sampler.keep_cache(version)
        else:
            _cut(out, sampler, "interrupt", running)
    return out


def _cut(out: Generated, sampler: Chunked, reason: str, rows: list[int]) -> None:
    if rows:
        out.cut = {i: sampler.length(i) for i in rows}
        out.cut_reason, out.cut_after = reason, sampler.chunks
