"""The interfaces between the asynchronous roles and the vehicle that carries them.

A role (rollout worker, trainer, parameter service, controller) sees queues, flags and
counters only through these Protocols, so the same role code runs as a thread
(`vehicles.Threads`: `queue.Queue`, `threading.Event`) or as a worker process
(`vehicles.Processes`: pipes, `multiprocessing.Event`, shared memory).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from rlcore.config import RunConfig
    from rlcore.runners.asynchronous.param_service import WeightSlots


class Queue(Protocol):
    """A FIFO between roles; every message is a picklable dataclass of `messages.py`."""

    def put(self, obj: Any) -> None: ...

    def get(self, timeout: float | None = None) -> Any:
        """The next message; raises queue.Empty after `timeout` seconds (None: wait)."""
        ...

    def get_nowait(self) -> Any: ...

    def empty(self) -> bool: ...


class Flag(Protocol):
    """A one-way switch every role can read: the start barrier's release, the stop order."""

    def set(self) -> None: ...

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


class Counters(Protocol):
    """Shared integers, each entry with a single writer (so no lock: see `Runtime`)."""

    def __getitem__(self, i: int) -> int: ...

    def __setitem__(self, i: int, value: int) -> None: ...

    def __len__(self) -> int: ...


class LockedArray(Counters, Protocol):
    """Shared integers behind one lock (the weight slots' head and sequence counters)."""

    def get_lock(self) -> Any: ...


class Channels(Protocol):
    """What the controller uses to reach the workers."""

    inbox: Queue
    prompt_q: Queue
    trainer_qs: list[Queue]
    counters: Counters


@dataclass
class WorkerContext:
    """Everything one role needs: its config, name, device and the shared channels."""

    cfg: RunConfig
    name: str
    index: int
    device: torch.device | None
    slots: WeightSlots
    inbox: Queue
    prompt_q: Queue
    start: Flag
    stop: Flag
    counters: Counters
    trainer_q: Queue | None = None
    commit_q: Queue | None = None
    ack_q: Queue | None = None
    ack_qs: list[Queue] | None = None
    cpus: tuple[int, ...] | None = None  # cores this role is pinned to (None: not pinned)
    own_process: bool = False  # a process of its own, whose CPU time the main one does not see

    def pid(self) -> int:
        return os.getpid()

    def own_cpu_s(self) -> float:
        """CPU seconds of this worker's process so far; 0 for a thread, whose CPU time the
        main process counts itself (`rlcore/load.py`)."""
        return time.process_time() if self.own_process else 0.0


Role = Callable[[WorkerContext], None]


class Vehicle(Protocol):
    """Carries the roles: threads of this process, or worker processes."""

    # Separate processes: weights in shared memory, and a worker can die alone.
    processes: bool

    def queue(self) -> Queue: ...

    def flag(self) -> Flag: ...

    def counters(self, n: int) -> Counters: ...

    def locked_array(self, n: int) -> LockedArray: ...

    def start(self, name: str, fn: Role, ctx: WorkerContext) -> None: ...

    def dead(self) -> dict[str, str]:
        """Workers that have ended, with how."""
        ...

    def end_all(self, ends: Ends) -> None:
        """End every worker, whether the run finished or failed."""
        ...


class Ends(Protocol):
    """What ending the workers may need to touch (threads cannot be killed, only told)."""

    start_evt: Flag
    stop_evt: Flag
    trainer_qs: list[Queue]
    commit_q: Queue
