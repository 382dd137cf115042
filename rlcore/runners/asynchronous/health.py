"""Failure handling: a failed worker stops the run, and no process outlives the run.

A worker that raises sends its traceback; a worker that dies (even by SIGKILL) is seen by
its exit code within one poll (`Runtime.check`). Either way the run stops at once, every
other worker is killed, and no summary.json is written. Child processes also ask the kernel
to kill them if the main process dies (`die_with_parent`), and a `Watchdog` covers the one
read the controller cannot leave. Nothing here imports torch: the CLI uses it too.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

from rlcore.errors import WorkerFailed


def worker_failed(worker: str, detail: str) -> WorkerFailed:
    """The error that ends a run because `worker` failed."""
    return WorkerFailed(f"worker '{worker}' failed ({detail}); the run was stopped and no "
                        "summary.json was written")


def running(pid: int) -> bool:
    """Whether process `pid` is running (a zombie has died)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:].split()[0] not in "ZX"


def die_with_parent(parent_pid: int, main_pid: int | None = None) -> None:
    """Ask Linux to SIGKILL this process when its parent dies (no orphans); exit at once if
    `parent_pid` is already gone, or the main process `main_pid` (the parent's parent)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        return
    if os.getppid() != parent_pid:  # it died before the call
        os._exit(1)
    # The parent dies with the main process; with the main process running now, the parent
    # was still there when this process read its pid, so the kernel watches the right one.
    if main_pid is not None and not running(main_pid):
        os._exit(1)


class Watched(Protocol):
    """What the watchdog looks at: the workers' deaths and who said it stopped."""

    @property
    def stopped(self) -> Mapping[str, object]: ...

    def dead(self) -> dict[str, str]: ...

    def end_all(self) -> None: ...


class Watchdog:
    """Ends this process when a worker has been dead for `grace_s` and the run has not failed.

    The controller fails a run within a poll of a worker's death, unless it is blocked in a
    read: a worker SIGKILLed between the two writes of a message over 16 KB leaves a header
    whose payload never comes. Nothing can unblock that read, so the watchdog says what
    failed, kills the workers and exits, as the controller would have.
    """

    def __init__(self, watched: Watched, grace_s: float = 10.0,
                 exit: Callable[[int], None] = os._exit):
        self.watched, self.grace_s, self.exit = watched, grace_s, exit
        self.done = threading.Event()  # the run ended, by success or by a failure handled
        self._thread = threading.Thread(target=self._watch, name="watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _watch(self) -> None:
        first_seen: dict[str, float] = {}
        while not self.done.wait(min(1.0, self.grace_s / 4)):
            now = time.monotonic()
            for name, how in self.watched.dead().items():
                if name in self.watched.stopped:
                    continue
                if now - first_seen.setdefault(name, now) >= self.grace_s:
                    print(f"rlcore: error: {worker_failed(name, how)} (the controller was "
                          "blocked, so the watchdog ended the run)", file=sys.stderr, flush=True)
                    self.watched.end_all()
                    self.exit(1)
                    return
