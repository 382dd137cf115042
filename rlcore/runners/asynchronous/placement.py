"""CPU placement of the heavy roles (`runtime.pin_cpus`).

Each rollout worker and each trainer owning its own cores keeps the two from sharing one core,
or migrating, while the other idles; the light controller and parameter service float.
"""

from __future__ import annotations

import os

import torch

from rlcore.config import RuntimeConfig
from rlcore.runners.asynchronous.contexts import rank_name


def plan_cpus(allowed: set[int], roles: list[str], threads: int
              ) -> tuple[dict[str, tuple[int, ...]], str]:
    """Disjoint sets of `threads` cores for each role, from the lowest allowed core up; or no
    plan and the reason, when the allowed cores are too few."""
    cores = sorted(allowed)
    if len(cores) < len(roles) * threads:
        return {}, (f"{len(roles)} roles x {threads} threads need {len(roles) * threads} cores, "
                    f"{len(cores)} allowed")
    return {r: tuple(cores[i * threads:(i + 1) * threads]) for i, r in enumerate(roles)}, ""


def placement(rt: RuntimeConfig, devices: dict[str, torch.device]
              ) -> tuple[dict[str, tuple[int, ...]], str]:
    """Cores for each rollout worker, trainer and trainer rank, or none and why."""
    heavy = [*(f"rollout{i}" for i in range(rt.rollout_workers)),
             *(f"trainer{i}" for i in range(rt.trainer_workers)),
             *(rank_name(r) for r in range(1, rt.trainer_ranks))]
    if not rt.pin_cpus:
        return {}, "runtime.pin_cpus is false"
    if {d.type for d in devices.values()} != {"cpu"}:
        return {}, "a role runs on a GPU"
    return plan_cpus(os.sched_getaffinity(0), heavy, rt.threads_per_role)
