"""`async_train`: the threaded asynchronous baseline (paper §4).

The same roles, controller rules, messages and records as the AReaL-style runtime, carried
by threads of one process instead of processes (`runners/asynchronous/vehicles.py::Threads`).
Python's GIL serialises their Python work, which is the point of the comparison.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlcore.clock.virtual import VirtualClock
from rlcore.config import RunConfig
from rlcore.runners.asynchronous.runtime import run_async
from rlcore.runners.asynchronous.vehicles import Threads, Virtual


def async_train(cfg: RunConfig, out_dir: str | Path, force: bool = False) -> dict[str, Any]:
    """Run the threaded asynchronous baseline; returns the summary. Under `runtime.clock:
    virtual` its roles share one interpreter lock, as threads do."""
    if cfg.runtime.clock == "virtual":
        clock = VirtualClock.of(cfg.runtime, seed=cfg.seed, lora=cfg.train.lora,
                                shared_interpreter=True)
        return run_async(cfg, out_dir, force, Virtual(clock))
    return run_async(cfg, out_dir, force, Threads())
