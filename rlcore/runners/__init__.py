"""The three matched runners; they differ only in how rollout and training are scheduled.

  sync.py        `sync_train`: generate, reward, update, in turn
  threaded.py    `async_train`: the asynchronous roles as threads of one process
  areal.py       `async_areal_style`: the asynchronous roles as separate processes
  common.py      what every runner shares besides the ledger: checks, the prompt stream,
                 training batches
  asynchronous/  what the two asynchronous runners share

Importing this package loads no torch: a runner's module is imported once `run_mode` knows
which one the config names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlcore.config import RunConfig

__all__ = ["run_mode"]


def run_mode(cfg: RunConfig, out_dir: str | Path, force: bool = False) -> dict[str, Any]:
    """Dispatch to the runner named by cfg.mode; returns the run's summary."""
    if cfg.mode == "sync":
        from rlcore.runners.sync import sync_train

        return sync_train(cfg, out_dir, force=force)
    if cfg.mode == "async":
        from rlcore.runners.threaded import async_train

        return async_train(cfg, out_dir, force=force)
    from rlcore.runners.areal import async_areal_style

    return async_areal_style(cfg, out_dir, force=force)
