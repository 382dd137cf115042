"""What work running at once shares, measured for `rlcore calibrate`: the interpreter lock
between threads of one process (the threaded baseline), and the cores between processes
(the AReaL-style runtime's pinned rollout worker and trainer)."""

from __future__ import annotations

import multiprocessing
import os
import random
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from rlcore.config import RunConfig, config_from_dict
from rlcore.kernels import pin
from rlcore.measure.timings import CHUNK, STEPS, random_batch, random_ids
from rlcore.policy.hf_policy import HFPolicy
from rlcore.policy.sampler import Draws


def gil_share(make: Callable[[], Callable[[], None]], n: int) -> float:
    """How much of some work holds the interpreter lock: two threads doing it at once take
    (1 + share) times as long as one thread alone, given a core each."""
    alone, a, b = make(), make(), make()
    for fn in (alone, a, b):  # warm-up: kernels chosen, graphs captured, one at a time
        fn()
    t0 = time.perf_counter()
    for _ in range(n):
        alone()
    one = time.perf_counter() - t0
    failed: list[BaseException] = []

    def loop(fn: Callable[[], None]) -> None:
        try:
            for _ in range(n):
                fn()
        except BaseException as e:  # a thread's error would only be printed
            failed.append(e)

    threads = [threading.Thread(target=loop, args=(f,)) for f in (a, b)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    both = time.perf_counter() - t0
    if failed:
        raise RuntimeError("the interpreter-lock share could not be measured: a thread "
                           f"failed with {failed[0]!r}") from failed[0]
    return min(1.0, max(0.0, both / one - 1.0))


def decode_work(cfg: RunConfig) -> Callable[[], None]:
    """A unit of rollout work: 4 rows sampled for STEPS steps in chunks of CHUNK."""
    policy = HFPolicy(cfg.model, cfg.train, role="rollout")
    policy.stop_ids = set()
    prompts = [random_ids(policy, 16, random.Random(2)) for _ in range(4)]

    def work() -> None:
        s = policy.sampler(prompts, max_new_tokens=STEPS, temperature=1.0,
                           draws=Draws(0, [(i, 0) for i in range(4)]))
        while not s.done:
            s.step(CHUNK)
    return work


def update_work(cfg: RunConfig) -> Callable[[], None]:
    """A unit of trainer work: one update of a small random batch."""
    policy = HFPolicy(cfg.model, cfg.train, role="trainer")
    batch = random_batch(policy, max(cfg.train.minibatches, 8), 8, 8, random.Random(3))

    def work() -> None:
        policy.update(batch, temperature=1.0, current_version=0)
    return work


def _hog(cfg_data: dict[str, Any], kind: str, core: int, stop: Any, ready: Any) -> None:
    """A process on `core` repeating decode or update work until `stop` is set."""
    os.sched_setaffinity(0, {core})
    cfg = config_from_dict(cfg_data)
    pin(cfg)
    work = decode_work(cfg) if kind == "decode" else update_work(cfg)
    work()
    ready.set()
    while not stop.is_set():
        work()


def concurrent_slowdown(cfg: RunConfig, n: int) -> tuple[int, float]:
    """The cores this process may use, and how much decode and update work slow while the
    other runs in another process on another core, as rollout and trainer do (the mean
    of both ways: s in a speed of 1 / (1 + s))."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return len(cores), 0.0  # nothing computes beside a role
    ctx = multiprocessing.get_context("spawn")
    own = os.sched_getaffinity(0)
    slowdowns = []
    try:
        os.sched_setaffinity(0, {cores[0]})
        for timed, other in (("decode", "update"), ("update", "decode")):
            work = decode_work(cfg) if timed == "decode" else update_work(cfg)
            work()

            def median_s(work: Callable[[], None] = work) -> float:
                times = []
                for _ in range(n):
                    t0 = time.perf_counter()
                    work()
                    times.append(time.perf_counter() - t0)
                return statistics.median(times)

            alone = median_s()
            stop, ready = ctx.Event(), ctx.Event()
            hog = ctx.Process(target=_hog, args=(cfg.to_dict(), other, cores[1], stop, ready),
                              daemon=True)
            hog.start()
            try:
                if not ready.wait(300):
                    raise RuntimeError("the concurrent process did not start within 300 s")
                slowdowns.append(max(0.0, median_s() / alone - 1.0))
            finally:
                stop.set()
                hog.join(timeout=60)
    finally:
        os.sched_setaffinity(0, own)
    return len(cores), statistics.mean(slowdowns)
