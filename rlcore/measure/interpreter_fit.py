"""The threaded baseline's interpreter-lock share, fitted to its live runs (`rlcore calibrate
--from-runs`): its roles share one interpreter, so its spans hold the time they waited for
the lock and price nothing (`in_situ.py`). Instead the planner plans each threaded run on
the fitted prices at a grid of shares, and the share whose updates/s come closest to the
runs' own is the profile's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

from rlcore.clock.profile import HardwareProfile


class ThreadedRun(Protocol):
    """What the fit reads of a threaded run (`in_situ.py::RunSpans`): its directory and its
    measured updates/s."""

    @property
    def path(self) -> str: ...

    @property
    def updates_per_s(self) -> float: ...

# The interpreter-lock shares a threaded run's fit tries first; then the two halfway to the
# best one's neighbours (a plan of a 400-update run takes about 1.5 s here).
GIL_SHARES = tuple(i / 10 for i in range(11))
# The work whose share the fit sets: what `rlcore calibrate` measures as the decode's share
# (prefill with it) and the update's; weight copies and scoring keep the base's.
GIL_SECTIONS = ("decode", "prefill", "update")


def with_gil_share(profile: HardwareProfile, share: float) -> HardwareProfile:
    """`profile` with decode, prefill and update holding the interpreter lock for `share`."""
    return dataclasses.replace(profile, **{
        section: dataclasses.replace(getattr(profile, section), gil_share=share)
        for section in GIL_SECTIONS})


@dataclasses.dataclass(frozen=True)
class InterpreterFit:
    """The fitted interpreter-lock share, and each threaded run's planned updates/s at it
    relative to its own (path -> relative error)."""

    share: float
    error: dict[str, float]


def fit_interpreter(profile: HardwareProfile, runs: Sequence[ThreadedRun],
                    shares: Sequence[float] = GIL_SHARES) -> InterpreterFit:
    """The share whose plans of the threaded `runs`, on `profile`'s prices and each run's
    recorded response lengths, give updates/s closest to the runs' own (least squares in
    relative error; the smaller share on a tie): the best of `shares`, or of the two
    halfway to its neighbours."""
    from rlcore.config import load_config
    from rlcore.plan.lengths import empirical
    from rlcore.plan.planner import plan, workload

    loads = [(r, load_config(r.path)) for r in runs]
    works = [(r, cfg, workload(cfg, empirical(r.path, as_recorded=True))) for r, cfg in loads]
    tried: dict[float, dict[str, float]] = {}

    def error(share: float) -> float:
        trial = with_gil_share(profile, share)
        tried[share] = {r.path: plan(cfg, work, trial)["updates_per_s"] / r.updates_per_s - 1
                        for r, cfg, work in works}
        return sum(e * e for e in tried[share].values())

    grid = sorted(shares)
    scores = {g: error(g) for g in grid}
    coarse = min(grid, key=lambda g: (scores[g], g))
    i = grid.index(coarse)
    for j in (i - 1, i + 1):
        if 0 <= j < len(grid):
            half = (grid[j] + coarse) / 2
            scores[half] = error(half)
    best = min(scores, key=lambda g: (scores[g], g))
    return InterpreterFit(best, tried[best])
