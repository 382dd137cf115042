"""The three matched runners; they differ only in how rollout and training are scheduled."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlcore.config import ConfigError, RunConfig


def run_mode(cfg: RunConfig, out_dir: str | Path, force: bool = False) -> dict[str, Any]:
    """Dispatch to the runner named by cfg.mode; returns the run's summary."""
    if cfg.mode == "sync":
        from rlcore.runners.sync import sync_train

        return sync_train(cfg, out_dir, force=force)
    raise ConfigError(f"mode '{cfg.mode}' is not built yet (the asynchronous runtime is the "
                      "next stage); use mode: sync")
