"""Peak memory of a process tree, watched from outside it: each process's peak resident set
(the kernel's VmHWM), the peak use of shared memory (/dev/shm), and the peak of the machine's
memory in use (MemTotal - MemAvailable), the last two above what they were at the start.

VmHWM only grows, so polling loses at most what a process added in its last interval. A page
shared by several processes (the forkserver's imports, a mapped weight slot) counts in the
resident set of each, so the per-process peaks must not be summed: the machine figure is the
total, counting each page once (and anything else the machine did meanwhile).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from rlcore.runners.asynchronous.weight_slots import SHM_DIR


def status_bytes(status: str, key: str) -> int | None:
    """A `kB` field of /proc/<pid>/status (e.g. VmHWM) in bytes; None if absent."""
    for line in status.splitlines():
        name, _, value = line.partition(":")
        if name == key:
            number, _, unit = value.strip().partition(" ")
            return int(number) * (1024 if unit == "kB" else 1)
    return None


def children(pid: int) -> list[int]:
    """Direct children of pid (empty once it has exited)."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(c) for c in text.split()]


def descendants(pid: int) -> list[int]:
    """pid and every process below it."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children(p))
    return out


def shm_used(path: str = SHM_DIR) -> int | None:
    """Bytes in use on the shared-memory file system; None where there is none."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def memory_in_use(meminfo: str) -> int:
    """MemTotal - MemAvailable of a /proc/meminfo text, in bytes."""
    total, available = (status_bytes(meminfo, k) for k in ("MemTotal", "MemAvailable"))
    if total is None or available is None:
        raise ValueError("/proc/meminfo lacks MemTotal or MemAvailable")
    return total - available


def _machine_in_use() -> int | None:
    try:
        return memory_in_use(Path("/proc/meminfo").read_text())
    except (OSError, ValueError):
        return None


def _cmdline(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return None


def _parent(pid: int) -> int | None:
    try:
        # The command name (field 2) may hold spaces and parentheses: split after its end.
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return None


FORK = "fork"  # a child not yet exec'd: it is its parent's image, and may become anything


def _label(pid: int) -> str:
    """What a process is, from its command line: forkserver or resource tracker helpers of
    multiprocessing are named as such, a child with its parent's command line (forked, not
    yet exec'd: a helper caught on its way to `git`) as FORK; anything else by its command
    name."""
    cmdline = _cmdline(pid)
    if cmdline is None:
        return f"pid{pid}"
    for helper in ("forkserver", "resource_tracker"):
        if helper in cmdline:
            return helper
    parent = _parent(pid)
    if parent is not None and _cmdline(parent) == cmdline:
        return FORK
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return f"pid{pid}"


@dataclass
class ProcessPeak:
    """One process's last seen peak resident set."""

    pid: int
    label: str
    peak_rss_bytes: int


@dataclass
class TreeWatch:
    """Polls a process tree every `interval_s` in a thread until `stop()`."""

    root: int
    interval_s: float = 0.2
    processes: dict[int, ProcessPeak] = field(default_factory=dict)
    shm_baseline_bytes: int | None = None
    shm_peak_bytes: int = 0
    machine_baseline_bytes: int | None = None
    machine_peak_bytes: int = 0

    def __post_init__(self) -> None:
        self.shm_baseline_bytes = shm_used()
        self.machine_baseline_bytes = _machine_in_use()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tree-watch", daemon=True)

    def start(self) -> TreeWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def poll(self) -> None:
        """One look at every process of the tree, at /dev/shm and at the machine's memory."""
        for pid in descendants(self.root):
            try:
                peak = status_bytes(Path(f"/proc/{pid}/status").read_text(), "VmHWM")
            except OSError:
                continue  # it exited between the listing and the read
            if peak is None:  # a zombie: its memory is gone, its last peak is kept
                continue
            seen = self.processes.setdefault(pid, ProcessPeak(pid, "", peak))
            seen.peak_rss_bytes = max(seen.peak_rss_bytes, peak)
            # Read again each time: between fork and exec a child still shows its parent's.
            seen.label = _label(pid)
        used = shm_used()
        if used is not None and self.shm_baseline_bytes is not None:
            self.shm_peak_bytes = max(self.shm_peak_bytes, used - self.shm_baseline_bytes)
        in_use = _machine_in_use()
        if in_use is not None and self.machine_baseline_bytes is not None:
            self.machine_peak_bytes = max(self.machine_peak_bytes,
                                          in_use - self.machine_baseline_bytes)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self.interval_s)
