"""The rollout's sampler without a model: `ChunkedSampler`'s chunks, steps and prices, with
each row's response length drawn (`lengths.py`) instead of sampled. The generation loop
(`rlcore/policy/generation.py`) runs it as it runs the live one."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rlcore.clock.work import Decode, Prefill, Work


class LengthSampler:
    """`ChunkedSampler` without a model: the same chunks, steps and prices, with each row's
    length drawn instead of sampled."""

    def __init__(self, charge: Callable[[Work], None], widths: Sequence[int],
                 draws: Sequence[tuple[int, bool]], max_new_tokens: int):
        self.charge, self.max_new_tokens = charge, max_new_tokens
        self.rows, self.width = len(widths), max(widths)  # left-padded to the longest prompt
        self.draws = draws
        # the step at which a row stops appending: its stop token, or the cap
        self.ends = [n if fin else max_new_tokens for n, fin in draws]
        self.steps = 0
        self.chunks = 0
        charge(Prefill(calls=1, tokens=self.rows * self.width))

    def finished(self, row: int) -> bool:
        """The row has sampled its stop token."""
        return self.draws[row][1] and self.ends[row] <= self.steps

    def length(self, row: int) -> int:
        return min(self.ends[row], self.steps)

    @property
    def done(self) -> bool:
        return self.steps >= self.max_new_tokens or all(
            self.finished(i) for i in range(self.rows))

    def step(self, n_tokens: int) -> int:
        """Up to n_tokens more steps; returns the tokens sampled (rows still running)."""
        sampled = steps = rows = row_context = 0
        if self.done:
            return 0
        self.chunks += 1
        for _ in range(n_tokens):
            if self.done:
                break
            sampled += sum(1 for e in self.ends if e > self.steps)
            self.steps += 1
            steps += 1
            if self.done:
                break  # as the live sampler: no forward pass after the last token
            rows += self.rows
            row_context += self.rows * (self.width + self.steps)
        self.charge(Decode(steps=steps, rows=rows, row_context=row_context))
        return sampled

    def reprefill(self, version: int) -> None:
        self.charge(Prefill(calls=1, tokens=self.rows * (self.width + self.steps)))

    def keep_cache(self, version: int) -> None:
        """Nothing to price: the new weights decode on the cache as it is."""
