"""What each asynchronous role is handed: its config, its name, and only its channels.

A context is built by `runtime.Runtime` (or by the planner, `rlcore/plan/roles.py`) and
crosses to a worker process by pickling, so every field is a config, a plain value, a
vehicle's channel or the shared weight slots.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import torch

from rlcore.clock import Clock
from rlcore.config import RunConfig
from rlcore.runners.asynchronous.interfaces import Counters, Flag, Queue, WeightStore


@dataclass(kw_only=True)
class WorkerContext:
    """What every worker role has: the run's config, its name, the controller's inbox, the
    start barrier and the weight slots."""

    cfg: RunConfig
    name: str
    index: int  # among the workers of its role
    inbox: Queue  # to the controller
    start: Flag  # set when every worker is ready: the measured clock starts
    slots: WeightStore  # `WeightSlots`; the planner's has no weights
    clock: Clock  # what the role reads time from and reports its work to
    cpus: tuple[int, ...] | None = None  # cores this role is pinned to (None: not pinned)
    own_process: bool = False  # a process of its own, whose CPU time the main one does not see

    def pid(self) -> int:
        return os.getpid()

    def own_cpu_s(self) -> float:
        """CPU seconds of this worker's process so far; 0 for a thread, whose CPU time the
        main process counts itself (`rlcore/record/machine_load.py`)."""
        return time.process_time() if self.own_process else 0.0


@dataclass(kw_only=True)
class RolloutContext(WorkerContext):
    """A rollout worker: prompts in, samples out to the inbox."""

    device: torch.device
    # The run's training prompts as (prompt, system), on CUDA only: a captured decoder
    # captures, before the barrier, the steps of batches as wide as the widest
    prompts: tuple[tuple[str, str | None], ...]
    prompt_q: Queue  # lists of prompt slots from the controller
    counters: Counters  # per worker: [prompt slots taken, rollout messages sent]
    stop: Flag


@dataclass(frozen=True)
class Ranks:
    """A data-parallel trainer's group (runtime.trainer_ranks): where its ranks meet, how
    many they are, and how long one waits for the others."""

    rendezvous: str  # a file in a directory private to the run, absent until they meet
    world: int
    timeout_s: float


@dataclass(kw_only=True)
class TrainerContext(WorkerContext):
    """A trainer: batches in, candidate states to its staging slot, commits to the service.
    With ranks, it is rank 0 and tells the others each step it takes."""

    device: torch.device
    trainer_q: Queue  # this trainer's batches (None: stop)
    commit_q: Queue  # to the parameter service
    ack_q: Queue  # the service's verdicts on this trainer's commits
    stop: Flag
    ranks: Ranks | None = None
    rank_qs: list[Queue] = field(default_factory=list)  # to ranks 1, 2, ...


def rank_name(rank: int) -> str:
    """A data-parallel trainer's rank above 0, as its worker is named."""
    return f"trainer0_rank{rank}"


@dataclass(kw_only=True)
class RankContext(WorkerContext):
    """A trainer's rank above 0: rank 0's steps in, each taken on its own share."""

    device: torch.device
    rank: int
    ranks: Ranks
    # rank 0's steps: ("load", version), ("update", batch, version), ("agree",); None: stop
    rank_q: Queue


@dataclass(kw_only=True)
class ParamServiceContext(WorkerContext):
    """The parameter service: commits in, a verdict to each trainer and to the controller."""

    commit_q: Queue  # commit requests from every trainer (None: stop)
    ack_qs: list[Queue]  # one per trainer
