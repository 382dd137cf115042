"""Pure functions for run metrics: pass-rate curves, time to threshold, efficiency, staleness.

Shared by the runners (for summary.json) and by the analysis of run directories, so a number
in a summary and the same number in a table are computed by one function.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """Trailing mean over the last `window` values (fewer at the start).

    Each window is summed afresh: a running sum that subtracts what leaves the window keeps
    its rounding, so pass rates such as 3/7 (batches of whole groups) could leave a window of
    zeros a hair below 0, outside the [0, 1] a pass rate lies in.
    """
    return [sum(values[max(0, i + 1 - window):i + 1]) / min(i + 1, window)
            for i in range(len(values))]


def steps_to_threshold(pass_rates: Sequence[float], threshold: float, window: int
                       ) -> int | None:
    """The first update (1-based) at which the trailing-mean pass rate reaches threshold;
    None if never. Unlike the time to threshold, it does not depend on machine load."""
    for step, p in enumerate(moving_average(pass_rates, window), start=1):
        if p >= threshold:
            return step
    return None


def time_to_threshold(times: Sequence[float], pass_rates: Sequence[float], threshold: float,
                      window: int) -> float | None:
    """The time of that update (paper Figure 3); None if never."""
    step = steps_to_threshold(pass_rates, threshold, window)
    return None if step is None else times[step - 1]


def reward_per_1k_tokens(total_reward: float, tokens_generated: int) -> float:
    """The paper's sample efficiency (Figure 4): total reward per 1,000 generated tokens."""
    return 1000.0 * total_reward / tokens_generated if tokens_generated else 0.0


def histogram(values: Iterable[int]) -> dict[str, int]:
    """Counts by value, keys as strings in ascending numeric order (JSON-friendly)."""
    counts = Counter(values)
    return {str(k): counts[k] for k in sorted(counts)}


def overlap_seconds(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]) -> float:
    """Total time during which a span of `a` and a span of `b` are both open.

    Spans within each list must not overlap each other (one worker is busy or not).
    """
    total, j = 0.0, 0
    b = sorted(b)
    for s, e in sorted(a):
        while j < len(b) and b[j][1] <= s:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            total += max(0.0, min(e, b[k][1]) - max(s, b[k][0]))
            k += 1
    return total


def merge_spans(spans: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of possibly overlapping spans, as sorted disjoint spans."""
    out: list[tuple[float, float]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out
