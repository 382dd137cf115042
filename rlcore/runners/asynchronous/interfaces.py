"""The interfaces between the asynchronous roles and the vehicle that carries them.

A role (rollout worker, trainer, parameter service, controller) sees queues, flags, counters
and the clock only through these Protocols, so the same role code runs as a thread
(`vehicles.Threads`: `queue.Queue`, `threading.Event`), as a worker process
(`vehicles.Processes`: pipes, `multiprocessing.Event`, shared memory), or as one of the roles a
virtual clock runs one at a time (`vehicles.Virtual`: `rlcore/clock/virtual.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

import torch

from rlcore.clock import Clock
from rlcore.config import RunConfig


class Queue(Protocol):
    """A FIFO between roles; every message is a picklable dataclass of `messages.py`."""

    def put(self, obj: Any) -> None: ...

    def get(self, *, timeout: float | None = None) -> Any:
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


class WeightStore(Protocol):
    """The policy's weights as the roles see them: `weight_slots.WeightSlots`, or the
    planner's store that keeps the version and no weights (`rlcore/plan/roles.py`)."""

    @property
    def nbytes(self) -> int:
        """Bytes of one copy of the weights: what a write or a read moves."""
        ...

    def ordered(self, named: Mapping[str, torch.Tensor]) -> list[torch.Tensor]: ...

    def head(self) -> tuple[int, int]:
        """(current slot, policy version), read together."""
        ...

    def version(self) -> int: ...

    @property
    def digests(self) -> bool:
        """Whether a publication carries its state's digest (`publish`, `last_digest`)."""
        ...

    last_digest: str | None  # the digest published with the state read_into last read

    def publish(self, slot: int, version: int, digest: str | None = None) -> None: ...

    def write(self, slot: int, tensors: list[torch.Tensor]) -> None: ...

    def read_into(self, tensors: list[torch.Tensor]) -> int:
        """Copy the current weights into `tensors`; returns their version."""
        ...


class Channels(Protocol):
    """What the controller uses to reach the workers."""

    inbox: Queue
    prompt_q: Queue
    trainer_qs: list[Queue]
    counters: Counters


class Launch(Protocol):
    """What a vehicle reads of a role's context to start it (`contexts.WorkerContext`)."""

    name: str
    inbox: Queue  # where a failing role's traceback goes
    cpus: tuple[int, ...] | None  # cores to pin the role to (None: not pinned)

    @property
    def cfg(self) -> RunConfig:
        """The run's config: the role's process pins its kernels and threads from it."""
        ...


L = TypeVar("L", bound=Launch)


class Vehicle(Protocol):
    """Carries the roles: threads of this process, worker processes, or virtual roles."""

    # Separate processes: weights in shared memory, and a worker can die alone.
    processes: bool
    clock: Clock  # the one clock of every role and of the run's ledger

    def queue(self) -> Queue: ...

    def flag(self) -> Flag: ...

    def counters(self, n: int) -> Counters: ...

    def locked_array(self, n: int) -> LockedArray: ...

    def start(self, name: str, fn: Callable[[L], None], ctx: L) -> None: ...

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
