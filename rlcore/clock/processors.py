"""Processor sharing for the virtual clock: how fast each of the computations running at
once goes, on shared cores, one accelerator, or one interpreter lock (`virtual.py`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

K = TypeVar("K")  # what computes on a pool: the virtual clock's roles


def shared_speed(n: int, processors: int | None, slowdown: float) -> float:
    """The speed of each of n computations at once on shared processors (None: one each):
    a share of the processors, slowed by what they share (`CpuCost`, `AcceleratorCost`)."""
    running = n if processors is None else min(n, processors)
    return running / n / (1 + slowdown * (running - 1))


def interpreter_speeds(shares: Sequence[float]) -> list[float]:
    """The speed of each computation at once in one interpreter, given each one's
    `gil_share`: each pair of them contends for the lock for the smaller of their shares,
    so two computations of share g take 1 + g times as long as one alone (what
    `rlcore calibrate` measures as g), and share 1 serialises them."""
    return [1 / (1 + sum(min(g, h) for j, h in enumerate(shares) if j != i))
            for i, g in enumerate(shares)]


@dataclass(eq=False)
class Pool(Generic[K]):
    """Processors that the roles computing on them share: the computations at once, each
    with its share of what they contend for, run at speeds(shares) of their full speeds."""

    speeds: Callable[[Sequence[float]], list[float]]
    busy: dict[K, float] = field(default_factory=dict)  # seconds left at full speed
    share: dict[K, float] = field(default_factory=dict)  # each one's share (gil_share)
    at: float = 0.0  # when `busy` was last brought up to date

    def speed(self) -> dict[K, float]:
        """Each computing role's speed now."""
        roles = list(self.busy)
        return dict(zip(roles, self.speeds([self.share[r] for r in roles]), strict=True))


def uniform(speed: Callable[[int], float]) -> Callable[[Sequence[float]], list[float]]:
    """Speeds that depend only on how many compute at once (`shared_speed`), as `Pool` takes
    them."""
    return lambda shares: [speed(len(shares))] * len(shares) if shares else []
