"""The clock a run's roles read and report their work to.

Every role and the run ledger read time only through a `Clock`, and report each computation
(`work.py`) to it as they finish it. `WallClock` is this machine's monotonic clock and lets
the work take the time it took. `VirtualClock` (`virtual.py`) runs the roles one at a time
and charges each computation's price from a hardware profile, so that a run's timing, and
with it every asynchronous decision, is a function of its config.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from rlcore.clock.profile import HardwareProfile
from rlcore.clock.virtual import VirtualClock
from rlcore.clock.work import Work, WorkTally
from rlcore.config import LoraConfig, RuntimeConfig

R = TypeVar("R")


class Clock(Protocol):
    """What the roles, the controller and the ledger see of time."""

    # True when time is charged from a cost model rather than measured.
    virtual: bool
    profile: HardwareProfile | None  # the cost model (virtual only)

    def now(self) -> float:
        """Seconds on this clock (an arbitrary origin; differences are durations)."""
        ...

    def charge(self, work: Work) -> None:
        """Report a computation the caller has just done (virtual: its price passes)."""
        ...

    def compute(self, work: Work, fn: Callable[[], R]) -> R:
        """Run `fn`, a computation of `work` that reads and writes only the caller's own
        state, and report it (virtual: other roles run meanwhile); returns what fn returns."""
        ...

    def take_work(self) -> dict[str, float]:
        """What the calling role reported since it last took this, term by term
        (`work.py::terms`): the work of the busy span it is ending."""
        ...

    def describe(self) -> dict[str, Any]:
        """summary.json's `clock`: which clock timed the run, and on what hardware profile."""
        ...


class WallClock:
    """This machine's CLOCK_MONOTONIC: one clock for every process of the run."""

    virtual: bool = False
    profile: HardwareProfile | None = None

    def __init__(self) -> None:
        self._local = threading.local()  # a tally per role: the threaded baseline's threads

    def now(self) -> float:
        return time.monotonic()

    def _tally(self) -> WorkTally:
        tally = getattr(self._local, "tally", None)
        if tally is None:
            tally = self._local.tally = WorkTally()
        return tally

    def charge(self, work: Work) -> None:
        """The work took its real time already: it is only tallied, for the span it is in."""
        self._tally().add(work)

    def compute(self, work: Work, fn: Callable[[], R]) -> R:
        result = fn()
        self.charge(work)
        return result

    def take_work(self) -> dict[str, float]:
        return self._tally().take()

    def __reduce__(self) -> tuple[Any, ...]:
        # Sent to a worker process, the wall clock is that process's own WALL: one tally per
        # role there, whichever reference a role charges through.
        return (_wall, ())

    def describe(self) -> dict[str, Any]:
        return {"kind": "wall", "hardware": None, "profile_digest": None, "charged_s": None}


WALL = WallClock()


def _wall() -> WallClock:
    return WALL


def clock_for(runtime: RuntimeConfig, *, seed: int, lora: LoraConfig | None,
              shared_interpreter: bool = False) -> Clock:
    """The clock `runtime.clock` names for a run of `seed` training `lora` (null: every
    weight), created in (and run from) the calling thread; `shared_interpreter`: the roles
    are threads of one interpreter (the threaded baseline)."""
    if runtime.clock == "wall":
        return WALL
    return VirtualClock.of(runtime, seed=seed, lora=lora,
                           shared_interpreter=shared_interpreter)
