"""Was the machine busy with something else while a run was timed?

Wall-clock metrics (time to threshold, updates/s) move with machine load: a sync run's time to
threshold has been measured more than a third longer on a busy machine. A run therefore
records the CPU time the whole machine spent (from /proc/stat) against the CPU time the run's
own processes received, over the measured window.
What is left was spent by other processes; more than `CONTENDED_CORES` of it on average flags
the run's timing as taken under contention. The 1-minute load average is recorded beside it
for reference only: on runs of seconds it mostly remembers the previous job.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

# Other processes using a quarter of a core on average: enough to move a two-role run's
# timing on a small machine, and well above the noise of an idle one (a few hundredths).
CONTENDED_CORES = 0.25


def machine_cpu_seconds(stat: Path = Path("/proc/stat")) -> float | None:
    """CPU seconds every core of the machine has spent busy since boot; None off Linux."""
    try:
        fields = stat.read_text().splitlines()[0].split()
    except OSError:
        return None
    # cpu user nice system idle iowait irq softirq steal ...: idle and iowait are not busy
    ticks = [int(x) for x in fields[1:]]
    busy = sum(ticks) - ticks[3] - (ticks[4] if len(ticks) > 4 else 0)
    return busy / os.sysconf("SC_CLK_TCK")


# When the job this process runs began, in seconds since the epoch, where that is not this
# process's own start: a job forked from the warm launcher (rlcore/launcher/) began when its
# client started, and what it waited for is the client's start-up plus the fork.
_job_start: float | None = None


def set_job_start(epoch_s: float | None) -> None:
    """Date this process's job from `epoch_s` (time.time() at its start; None: from this
    process's start)."""
    global _job_start
    _job_start = epoch_s


def process_age_s(stat: Path = Path("/proc/self/stat"),
                  uptime: Path = Path("/proc/uptime")) -> float | None:
    """Seconds since this process started (its start tick against the machine's uptime), or
    since its job started (`set_job_start`); None off Linux."""
    if _job_start is not None:
        return max(0.0, time.time() - _job_start)
    try:
        text, up = stat.read_text(), float(uptime.read_text().split()[0])
    except OSError:
        return None
    start_ticks = int(text[text.rindex(")") + 2:].split()[19])  # field 22: starttime
    return max(0.0, up - start_ticks / os.sysconf("SC_CLK_TCK"))


def contention(machine_cpu_s: float, run_cpu_s: float, window_s: float
               ) -> tuple[float, bool]:
    """(cores other processes used on average over the window, whether that is contention)."""
    other = max(0.0, machine_cpu_s - run_cpu_s) / window_s if window_s > 0 else 0.0
    return other, other > CONTENDED_CORES


class LoadMeter:
    """Machine and own-process CPU over a run's measured window."""

    def __init__(self) -> None:
        self.start()

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._own0 = time.process_time()
        self._machine0 = machine_cpu_seconds()
        self._load0 = os.getloadavg()[0]

    def summary(self, worker_cpu_s: float) -> dict[str, Any]:
        """The `load` section of summary.json; `worker_cpu_s` is what worker processes (not
        this one's threads) report they used over the window."""
        window = time.monotonic() - self._t0
        run_cpu = time.process_time() - self._own0 + worker_cpu_s
        machine1 = machine_cpu_seconds()
        machine = None if self._machine0 is None or machine1 is None \
            else machine1 - self._machine0
        other, contended = (None, False) if machine is None else \
            contention(machine, run_cpu, window)
        return {
            "cores": os.cpu_count() or 1,
            "loadavg_1m": [self._load0, os.getloadavg()[0]],
            "window_s": window,
            "run_cpu_s": run_cpu,
            "machine_cpu_s": machine,
            "other_cores": other,
            "contended": contended,
        }
