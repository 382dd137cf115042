"""`async_train`: the threaded asynchronous baseline (paper §4).

Rollout, trainer and parameter service run as threads of one process, with the same role
functions, controller rules, queues and records as the AReaL-style runtime; only the vehicle
differs (`runners/areal/runtime.py::Threads`). Python's GIL serialises their Python work, which
is the point of the comparison.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlcore.config import RunConfig
from rlcore.runners.areal.runtime import run_async


def async_train(cfg: RunConfig, out_dir: str | Path, force: bool = False) -> dict[str, Any]:
    """Run the threaded asynchronous baseline; returns the summary."""
    return run_async(cfg, out_dir, force, threaded=True)
