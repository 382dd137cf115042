"""The vehicles that carry the asynchronous roles: processes, threads, or a virtual clock.

`Processes` is the AReaL-style runtime (paper §3): every role in its own process, weights in
shared memory. Each is forked from a clean server process (`forkserver.py`) that has imported
torch but run nothing, so each builds its own threads and CUDA context, as spawned ones would.
`Threads` is the threaded baseline: the same roles as threads of one process, where Python's
GIL serialises their Python work, which is the point of the comparison.
`Virtual` carries either runner under `runtime.clock: virtual`: the same roles, one at a time,
in the order and at the times a discrete-event scheduler decides (`rlcore/clock/virtual.py`);
for the threaded baseline its roles also share one interpreter lock.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch
import torch.multiprocessing  # noqa: F401 - registers the reductions that share tensors

from rlcore.clock import WALL, Clock
from rlcore.clock.virtual import MAIN, Cancelled, VirtualClock, VirtualFlag, VirtualQueue
from rlcore.kernels import pin
from rlcore.policy.device import own_stream
from rlcore.runners.asynchronous import forkserver
from rlcore.runners.asynchronous.health import die_with_parent
from rlcore.runners.asynchronous.interfaces import (
    Counters,
    Ends,
    Flag,
    L,
    LockedArray,
    Queue,
)
from rlcore.runners.asynchronous.messages import WorkerError


def _parent_pid() -> int:
    """The pid of the process that started this one (multiprocessing's parent)."""
    parent = multiprocessing.parent_process()
    assert parent is not None and parent.pid is not None, "not a multiprocessing child"
    return parent.pid


def _run_role(fn: Callable[[L], None], ctx: L) -> bool:
    try:
        fn(ctx)
        return True
    except Cancelled:  # the virtual schedule was closed: the run has ended already
        raise
    except BaseException:  # noqa: BLE001 - any failure must reach the main process
        ctx.inbox.put(WorkerError(ctx.name, traceback.format_exc()))
        return False


def _process_entry(fn: Callable[[L], None], ctx: L) -> None:
    # The OS parent is the fork server, which dies with the main process (forkserver_init).
    die_with_parent(os.getppid(), main_pid=_parent_pid())
    if ctx.cpus is not None:  # before torch starts any thread, so that they inherit it
        os.sched_setaffinity(0, ctx.cpus)
    pin(ctx.cfg)
    ok = _run_role(fn, ctx)
    release = getattr(getattr(ctx, "slots", None), "release_buffers", None)
    if release is not None:  # os._exit runs no deleter: its sender would keep what it sent
        release()
    if not ok:
        sys.exit(1)


def _thread_entry(fn: Callable[[L], None], ctx: L) -> None:
    if ctx.cpus is not None:  # on Linux the affinity of pid 0 is the calling thread's
        os.sched_setaffinity(0, ctx.cpus)
    _run_role(_on_own_stream(fn), ctx)


def _on_own_stream(fn: Callable[[L], None]) -> Callable[[L], None]:
    """`fn` with its device's stream its own from the start, before it queues any work: on
    the legacy default stream two role threads would serialise, and each wait of one would
    wait for the other's kernels too."""
    def role(ctx: L) -> None:
        device = getattr(ctx, "device", None)
        if isinstance(device, torch.device):
            own_stream(device)
        fn(ctx)
    return role


class PipeQueue:
    """A queue over one pipe with no feeder thread (a `SimpleQueue` with timeouts).

    `multiprocessing.Queue` pickles in a background thread of the sender; on a two-core
    machine that thread fights its own process for the GIL on every message. Here `put`
    pickles and writes in the caller. Each queue has one consumer, except the prompt queue,
    which every rollout worker reads and whose workers are woken with empty messages at
    shutdown.
    """

    def __init__(self, mp: Any):
        self._q = mp.SimpleQueue()

    def put(self, obj: Any) -> None:
        self._q.put(obj)

    def get(self, timeout: float | None = None) -> Any:
        if timeout is None:
            return self._q.get()
        # Poll under the readers' lock: a poll outside it can see the message a second
        # reader then takes, and the blocking read after it waits for the next one forever.
        deadline = time.monotonic() + timeout
        if not self._q._rlock.acquire(timeout=timeout):
            raise queue.Empty
        try:
            if not self._q._reader.poll(max(0.0, deadline - time.monotonic())):
                raise queue.Empty
            data = self._q._reader.recv_bytes()
        finally:
            self._q._rlock.release()
        return ForkingPickler.loads(data)

    def get_nowait(self) -> Any:
        return self.get(timeout=0)

    def empty(self) -> bool:
        return self._q.empty()


class Processes:
    """The process vehicle: one process per role, weights in shared memory."""

    processes = True
    clock: Clock = WALL

    def __init__(self) -> None:
        self.mp = forkserver.context()
        self.handles: dict[str, Any] = {}

    def queue(self) -> Queue:
        return PipeQueue(self.mp)

    def flag(self) -> Flag:
        return self.mp.Event()

    def counters(self, n: int) -> Counters:
        return self.mp.Array("q", n, lock=False)

    def locked_array(self, n: int) -> LockedArray:
        return self.mp.Array("q", n)

    def start(self, name: str, fn: Callable[[L], None], ctx: L) -> None:
        p = self.mp.Process(target=_process_entry, args=(fn, ctx), name=name, daemon=True)
        p.start()
        self.handles[name] = p

    def dead(self) -> dict[str, str]:
        """Workers that have exited, with how."""
        out = {}
        for name, p in self.handles.items():
            code = p.exitcode
            if code is not None:
                how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
                out[name] = f"pid {p.pid}, {how}"
        return out

    def end_all(self, ends: Ends) -> None:
        """SIGKILL whatever is still running. Nothing is sent first: a worker killed while
        holding a queue's or an event's lock would leave that put or set() blocked forever."""
        for p in self.handles.values():
            if p.is_alive():
                p.kill()
        for p in self.handles.values():
            p.join(timeout=5)


class Threads:
    """The threaded vehicle: one thread per role in this process."""

    processes = False
    clock: Clock = WALL

    def __init__(self) -> None:
        self.handles: dict[str, threading.Thread] = {}

    def queue(self) -> Queue:
        q: queue.Queue[Any] = queue.Queue()
        return q

    def flag(self) -> Flag:
        return threading.Event()

    def counters(self, n: int) -> Counters:
        return [0] * n

    def locked_array(self, n: int) -> LockedArray:
        return multiprocessing.Array("q", n)  # works in-process too, and brings its lock

    def start(self, name: str, fn: Callable[[L], None], ctx: L) -> None:
        t = threading.Thread(target=_thread_entry, args=(fn, ctx), name=name, daemon=True)
        t.start()
        self.handles[name] = t

    def dead(self) -> dict[str, str]:
        return {n: "thread ended" for n, t in self.handles.items() if not t.is_alive()}

    def end_all(self, ends: Ends) -> None:
        """Threads cannot be killed: set the events and send the sentinels that end them."""
        ends.stop_evt.set()
        ends.start_evt.set()  # release anyone still at the barrier
        for q in [*ends.trainer_qs, ends.commit_q]:
            q.put(None)


class Virtual:
    """The virtual vehicle: every role a thread of this process, one running at a time."""

    processes = False

    def __init__(self, clock: VirtualClock):
        self.clock: Clock = clock
        self._clock = clock

    def queue(self) -> Queue:
        return VirtualQueue(self._clock)

    def flag(self) -> Flag:
        return VirtualFlag(self._clock)

    def counters(self, n: int) -> Counters:
        return [0] * n

    def locked_array(self, n: int) -> LockedArray:
        return multiprocessing.Array("q", n)

    def start(self, name: str, fn: Callable[[L], None], ctx: L) -> None:
        """A new role, runnable once the caller gives up the baton (no pinning: only one
        role runs at a time)."""
        def role() -> None:
            _run_role(fn, ctx)

        self._clock.start(name, role)

    def dead(self) -> dict[str, str]:
        return {n: "role ended" for n in self._clock.ended() if n != MAIN}

    def end_all(self, ends: Ends) -> None:
        """Close the schedule: roles still waiting for their turn end at once."""
        self._clock.close()
