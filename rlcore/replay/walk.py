"""The replay's threads and how they wait for one another.

A replay has no clock: generation waits for the versions it samples with, training waits
for the samples it trains on, and a results thread takes back what the trainer process
computed. Each waits in `wait_for` on one condition; when every walker is waiting and
nothing is in flight in the trainer process, nothing can ever arrive, and the walk stops
with a ScheduleError naming what each one waited for.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from rlcore.record.schedule import ScheduleError


class Stopped(Exception):
    """Another thread failed (or the walk is stuck): leave quietly, the error is kept."""


class Walk:
    """Threads that wait for what the others make, with one shared check for being stuck."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.error: BaseException | None = None
        self.in_flight = 0  # work handed to another process, not yet back
        self._waiting: dict[str, str] = {}  # thread: what it waits for
        self._active = 0

    def run(self, walkers: dict[str, Callable[[], None]],
            followers: dict[str, Callable[[], None]]) -> None:
        """Run every function in a thread of its own until all return. Followers only
        take back what is in flight, so the stuck check counts the walkers alone; the first
        error of any thread is kept in `error`."""
        threads = [threading.Thread(target=self._thread, args=(fn, name in walkers),
                                    name=f"replay-{name}")
                   for name, fn in {**walkers, **followers}.items()]
        self._active = len(walkers)
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _thread(self, fn: Callable[[], None], walker: bool) -> None:
        try:
            fn()
        except Stopped:
            pass
        except BaseException as e:  # noqa: BLE001 - handed to the caller of run()
            with self.cond:
                self.error = self.error or e
        finally:
            with self.cond:
                if walker:
                    self._active -= 1
                self.cond.notify_all()

    def wait_for(self, name: str, ready: Callable[[], bool], what: Callable[[], str]) -> None:
        """Block until ready(); raises Stopped once another thread failed or the walk is
        stuck (every walker waiting, nothing in flight)."""
        with self.cond:
            while not ready():
                if self.error is not None:
                    raise Stopped
                self._waiting[name] = what()
                if len(self._waiting) >= self._active and not self.in_flight:
                    self.error = ScheduleError(
                        "the schedule cannot be replayed, nothing left can run: "
                        + "; ".join(self._waiting.values()))
                    self.cond.notify_all()
                    raise Stopped
                self.cond.wait()
            self._waiting.pop(name, None)

    def progress(self) -> None:
        """Something new exists: every waiting thread looks again."""
        with self.cond:
            self._waiting.clear()
            self.cond.notify_all()
