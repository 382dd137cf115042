"""Where a role runs: the same rules in every mode (its kernels and threads: rlcore.kernels)."""

from __future__ import annotations

import torch

from rlcore.config import ConfigError


def resolve_device(spec: str, role: str) -> torch.device:
    """`auto` = the paper's placement (rollout cuda:0, trainer cuda:1) where GPUs exist."""
    n = torch.cuda.device_count()
    if spec != "auto":
        device = torch.device(spec)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(
                f"model.{role}_device is '{spec}' but CUDA is not available here (torch "
                f"{torch.__version__}): set it to auto or cpu, or install torch's CUDA build "
                "for this machine's GPUs (docs/setup.md, 'GPU setup')")
        if device.type == "cuda" and (device.index or 0) >= n:
            raise ConfigError(
                f"model.{role}_device is '{spec}' but this machine has {n} GPU"
                f"{'s' if n != 1 else ''} (cuda:0 to cuda:{n - 1}): name one of those, or auto")
        return device
    if n == 0:
        return torch.device("cpu")
    return torch.device(f"cuda:{min(1 if role == 'trainer' else 0, n - 1)}")


def peak_gpu_bytes(device: torch.device) -> int | None:
    """Peak bytes torch's CUDA allocator has held on `device` in this process; None off CUDA
    (threads of one process share the figure)."""
    return int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None
