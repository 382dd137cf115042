"""`async_areal_style`: the AReaL-style runtime (paper §3-4).

Every role (rollout worker, trainer, parameter service) in its own process, forked from a
fork server; weights in shared memory, the controller in this one; see
`runners/asynchronous/`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlcore.clock.virtual import VirtualClock
from rlcore.config import RunConfig
from rlcore.runners.asynchronous.runtime import run_async
from rlcore.runners.asynchronous.vehicles import Processes, Virtual


def async_areal_style(cfg: RunConfig, out_dir: str | Path, force: bool = False
                      ) -> dict[str, Any]:
    """The paper's `async_areal_style`; returns the summary. Under `runtime.clock: virtual`
    its roles keep an interpreter each, as processes do."""
    if cfg.runtime.clock == "virtual":
        clock = VirtualClock.of(cfg.runtime, seed=cfg.seed, lora=cfg.train.lora)
        return run_async(cfg, out_dir, force, Virtual(clock))
    return run_async(cfg, out_dir, force, Processes())
