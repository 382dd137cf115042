"""The replay's thread coordination (rlcore/replay/walk.py): waits that are met, a walk that
is stuck, and a failure that stops the other threads."""

from __future__ import annotations

import queue
import threading

from rlcore.record.schedule import ScheduleError
from rlcore.replay.walk import Walk


def run_within(walk: Walk, walkers: dict, followers: dict, seconds: float = 30.0) -> None:
    """walk.run, failing (not hanging) if the walk never ends."""
    t = threading.Thread(target=walk.run, args=(walkers, followers), daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"the walk did not end within {seconds} s"


def test_walkers_that_feed_each_other_finish():
    walk, made = Walk(), {"a": 0, "b": 0}

    def walker(me: str, other: str) -> None:
        for i in range(1, 50):
            walk.wait_for(me, lambda i=i: made[other] >= i - 1,
                          lambda i=i: f"{me} waits for {other} to reach {i - 1}")
            with walk.cond:
                made[me] = i
            walk.progress()

    run_within(walk, {"a": lambda: walker("a", "b"), "b": lambda: walker("b", "a")}, {})
    assert walk.error is None and made == {"a": 49, "b": 49}


def test_every_walker_waiting_with_nothing_in_flight_is_stuck():
    walk = Walk()
    run_within(walk, {"generation": lambda: walk.wait_for("generation", lambda: False,
                                                  lambda: "generation waits for version 3"),
              "training": lambda: walk.wait_for("training", lambda: False,
                                                lambda: "training waits for batch 2")}, {})
    assert isinstance(walk.error, ScheduleError)
    message = str(walk.error)
    assert "nothing left can run" in message
    assert "generation waits for version 3" in message and "training waits for batch 2" in message


def test_work_in_flight_is_waited_for_not_called_stuck():
    """The only walker waits on what a follower brings back: that is not stuck."""
    walk, inbox, got = Walk(), queue.Queue(), []
    release = threading.Event()

    def walker() -> None:
        with walk.cond:
            walk.in_flight += 1
        inbox.put("work")
        release.set()
        walk.wait_for("walker", lambda: bool(got), lambda: "walker waits for the result")

    def follower() -> None:
        release.wait()
        inbox.get()
        with walk.cond:
            got.append("result")
            walk.in_flight -= 1
        walk.progress()

    run_within(walk, {"walker": walker}, {"results": follower})
    assert walk.error is None and got == ["result"]


def test_a_failure_stops_the_waiting_thread_and_is_kept():
    walk, started = Walk(), threading.Event()

    def waiter() -> None:
        with walk.cond:
            walk.in_flight += 1  # so that its wait alone is not "stuck"
        started.set()
        walk.wait_for("waiter", lambda: False, lambda: "waiter waits forever")

    def failing() -> None:
        started.wait()
        raise ValueError("the trainer process died")

    run_within(walk, {"waiter": waiter, "failing": failing}, {})
    assert isinstance(walk.error, ValueError) and "died" in str(walk.error)
