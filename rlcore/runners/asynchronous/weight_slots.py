"""Weight slots: copies of the trainable state, one current, read without a lock.

There are n_trainers + 1 slots, allocated once (in shared memory for the process runtime).
One slot is *current*; each trainer owns a staging slot into which it writes its candidate
state, and the parameter service (`param_service.py`) publishes a staging slot as current.

Readers copy the current slot under a sequence lock: every slot has a counter that is odd
while the slot is being written; a reader that sees it odd looks again, and one that sees it
changed after its copy copies again (`WeightSlots.retries` counts these). So a rollout worker
never loads a torn state, and never blocks a trainer.

Where the slots live is `runtime.weight_transport` (`rlcore/policy/device.py::resolve_transport`):
  host    host memory (shared between processes): the only path on CPU;
  pinned  the same memory, page-locked for CUDA in each process that copies to or from a GPU,
          so a copy is one fast DMA each way;
  device  the rollout's GPU: allocated by the runtime before the workers start and passed to
          them as CUDA IPC handles, so a write or a read is a device-to-device copy.
A copy that touches a GPU is synchronized before the sequence counter moves (a writer) or is
compared (a reader), so the counter still says when a copy is whole.
"""

from __future__ import annotations

import ctypes
import math
import os
import threading
import time
import warnings
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from rlcore.clock import Clock
from rlcore.clock.work import Digest, Weights, Work
from rlcore.config import ConfigError, LoraConfig, RunConfig
from rlcore.errors import DeliveryFailed
from rlcore.policy.device import wait_for
from rlcore.policy.digest import state_digest
from rlcore.policy.lora import adapter_spec, model_targets
from rlcore.runners.asynchronous.interfaces import LockedArray, WeightStore

SHM_DIR = "/dev/shm"  # where torch's share_memory_() keeps shared tensors on Linux


def shared_memory_free(path: str = SHM_DIR) -> int | None:
    """Bytes free for shared memory; None where there is no such file system to ask."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


ParamSpec = list[tuple[str, tuple[int, ...], torch.dtype]]
DIGEST_PREFIX, DIGEST_BYTES = "sha256:", 32  # `state_digest`'s form
GIB = 2**30


def spec_bytes(spec: ParamSpec) -> int:
    """Bytes of one copy of a state with these names, shapes and dtypes."""
    return sum(math.prod(shape) * dtype.itemsize for _, shape, dtype in spec)


def check_shared_memory(spec: ParamSpec, n_slots: int, free: int | None) -> None:
    """Refuse, before any slot exists, weight slots that shared memory cannot hold: past
    the limit a worker dies of SIGBUS half way through writing one."""
    per_slot = spec_bytes(spec)
    need = per_slot * n_slots
    if free is None or need <= free:
        return
    raise ConfigError(
        f"the AReaL-style runner keeps {n_slots} copies of the trainable weights in shared "
        f"memory, {per_slot / GIB:.2f} GiB each, {need / GIB:.2f} GiB in all, but {SHM_DIR} "
        f"has {free / GIB:.2f} GiB free. Give it more (in Docker: `docker run "
        f"--shm-size={math.ceil(1.25 * need / GIB)}g`), or run mode sync or async, which keep "
        "no shared copies")


def trainable_spec(model_dir: str, lora: LoraConfig | None = None) -> ParamSpec:
    """Names, shapes and dtypes of the trainable tensors (every weight, or under `lora` the
    adapters), from the config alone (meta device)."""
    if lora is not None:
        return adapter_spec(model_targets(model_dir, lora), lora.rank)
    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return [(n, tuple(p.shape), p.dtype) for n, p in model.named_parameters() if p.requires_grad]


def copy_work(slots: WeightStore, direction: Literal["write", "read"]) -> list[Work]:
    """What a copy of the state through `slots` computes, as a clock prices it: the copy,
    and where slots carry digests the sha256 the writer publishes or the reader checks."""
    work: list[Work] = [Weights(direction, slots.nbytes)]
    if slots.digests:
        work.append(Digest(slots.nbytes))
    return work


def charge_copy(clock: Clock, slots: WeightStore, direction: Literal["write", "read"]
                ) -> None:
    """Charge `clock` for one copy of the state through `slots` (`copy_work`)."""
    for work in copy_work(slots, direction):
        clock.charge(work)


def carries_digests(cfg: RunConfig) -> bool:
    """Whether a run's slots publish each version's digest and readers check it: under
    train.lora, whose adapters can silently fail to arrive (full weights are not hashed:
    2 GB a version at 0.5B)."""
    return cfg.train.lora is not None


def check_arrival(slots: WeightStore, version: int, state: Mapping[str, torch.Tensor],
                  reader: str) -> None:
    """Refuse a state `reader` read at `version` that is not the one published with it (where
    slots carry digests): it would go on computing with another policy than it reports."""
    if slots.last_digest is None:
        return
    loaded = state_digest(dict(state))
    if loaded != slots.last_digest:
        raise DeliveryFailed(
            f"{reader} loaded policy version {version} as {loaded}, but the parameter service "
            f"published {slots.last_digest}: the adapter did not arrive, and sampling would "
            "go on from another policy than the one it reports")


# cudaHostRegister of a range the driver already holds page-locked
HOST_MEMORY_ALREADY_REGISTERED = 712


MAPS = Path("/proc/self/maps")  # the files this process has mapped, the libraries with them
DELETED = " (deleted)"  # how the kernel marks a mapped file since removed or replaced


def cudart_libraries() -> list[ctypes.CDLL]:
    """Every CUDA runtime this process loaded (torch's, and any other: a wheel may bundle its
    own as libcudart-<hash>.so.N), for what torch's binding lacks."""
    try:
        maps = MAPS.read_text()
    except OSError:
        return []
    paths = set()
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)  # address perms offset dev inode path (with spaces)
        path = fields[5].strip() if len(fields) == 6 else ""
        path = path.removesuffix(DELETED)  # dlopen finds a loaded library by its name
        name = path.rsplit("/", 1)[-1]
        if path.startswith("/") and name.startswith("libcudart") and ".so" in name:
            paths.add(path)
    return [ctypes.CDLL(p) for p in sorted(paths)]


def clear_cuda_error() -> int:
    """Read and reset this thread's last CUDA runtime error in every loaded runtime (0: none
    was set). torch's binding of cudaHostRegister leaves a failure's code set, and the next
    kernel launch in the thread, whatever it is, would then raise it."""
    errors = [int(lib.cudaGetLastError()) for lib in cudart_libraries()]
    return next((e for e in errors if e), 0)


class HostPins:
    """Host buffers page-locked for CUDA in this process: registered once, under a lock
    (two threads' first copies may ask together), and unregistered by `release`, or when
    the owner is collected, while the buffers are still alive (a range freed while
    registered leaves the driver a stale registration, which a later registration at the
    reused address meets as error 712)."""

    # One registration or release at a time in the process; reentrant, as a collection
    # inside `register` may run another slots' finalizer (`_release`) in the same thread
    _lock = threading.RLock()

    def __init__(self) -> None:
        self.buffers: list[torch.Tensor] = []  # registered here, by this object
        self.done = False
        self._finalizer: weakref.finalize | None = None

    def register(self, owner: object, buffers: list[torch.Tensor]) -> None:
        """Page-lock `buffers` unless done already; undo and raise on a refusal."""
        with self._lock:
            if self.done:
                return
            cudart = torch.cuda.cudart()
            for b in buffers:
                err = int(cudart.cudaHostRegister(b.data_ptr(), b.numel() * b.element_size(), 0))
                if err == 0:
                    self.buffers.append(b)
                    continue
                clear_cuda_error()
                if err == HOST_MEMORY_ALREADY_REGISTERED:
                    # pinned already, by a registration this process did not make here: the
                    # copy is as fast; it is not ours to undo
                    warnings.warn(f"a weight slot of {b.numel() * b.element_size()} bytes was "
                                  "already page-locked (CUDA error 712); using it as it is",
                                  RuntimeWarning, stacklevel=2)
                    continue
                self._unregister(self.buffers)
                raise RuntimeError(
                    f"cudaHostRegister refused the weight slots' shared memory (error {err}): "
                    "set runtime.weight_transport: host or device")
            self.done = True
            self._finalizer = weakref.finalize(owner, HostPins._release, self.buffers)

    def release(self) -> None:
        """Unregister what `register` page-locked (nothing if nothing was)."""
        if self._finalizer is not None:
            self._finalizer()  # runs once: the collector will not run it again

    @classmethod
    def _release(cls, buffers: list[torch.Tensor]) -> None:
        with cls._lock:
            cls._unregister(buffers)

    @staticmethod
    def _unregister(buffers: list[torch.Tensor]) -> None:
        cudart = torch.cuda.cudart()
        for b in buffers:
            if int(cudart.cudaHostUnregister(b.data_ptr())) != 0:
                clear_cuda_error()
        buffers.clear()


class WeightSlots:
    """Copies of the trainable state, one current, with lock-free consistent reads.

    Callers pass tensors as a list in `names` order (resolve it once with `ordered`), so a
    write or a read is one multi-tensor copy and a few counter updates.

    A slot is one flat buffer per dtype, and its tensors are views into it: a process
    receives a slot as one file descriptor per buffer, not one per tensor. (Python's fork
    server passes at most 256 descriptors to a new process; Qwen2.5-0.5B has 290 tensors.)
    """

    def __init__(self, spec: ParamSpec, n_slots: int, state: LockedArray, shared: bool,
                 transport: str = "host", device: torch.device | None = None,
                 digests: bool = False):
        """`shared`: between processes; `transport` (`resolve_transport`) with `device`, the
        rollout's GPU, for `device`; `digests`: each published slot carries the digest of
        its state (`state_digest`), which a reader checks what it loaded against."""
        if transport == "device" and (device is None or device.type != "cuda"):
            raise ValueError(f"device weight slots need a CUDA device, not {device}")

        def alloc(numel: int, dtype: torch.dtype) -> torch.Tensor:
            if transport == "device":
                return torch.empty(numel, dtype=dtype, device=device)
            t = torch.empty(numel, dtype=dtype)
            return t.share_memory_() if shared else t

        self.transport = transport
        self._pins = HostPins()  # pinned: what this process page-locked for CUDA
        self.spec = spec
        self.names = [n for n, _, _ in spec]
        sizes: dict[torch.dtype, int] = {}
        for _, shape, dtype in spec:
            sizes[dtype] = sizes.get(dtype, 0) + math.prod(shape)
        self._buffers = [{d: alloc(n, d) for d, n in sizes.items()} for _ in range(n_slots)]
        self.slots = [self._views(b) for b in self._buffers]
        # One shared array: [current slot, policy version, seq of slot 0, seq of slot 1, ...].
        # A slot's seq is odd while it is being written.
        if len(state) != 2 + n_slots:
            raise ValueError(f"{n_slots} slots need a state array of {2 + n_slots}")
        self._state = state
        self._state[1] = -1  # nothing published yet: readers wait for the service's first write
        self._lock = self._state.get_lock()  # also the memory barrier around every copy
        # Each slot's published digest (sha256 bytes), in host memory whatever the transport
        self._digests: torch.Tensor | None = None
        if digests:
            self._digests = torch.zeros(n_slots, DIGEST_BYTES, dtype=torch.uint8)
            if shared:
                self._digests.share_memory_()
        # The digest published with the copy read_into last returned (None: no digests)
        self.last_digest: str | None = None
        # Copies read_into discarded because a write overlapped them (in this process's
        # copy of the object): what the sequence lock caught.
        self.retries = 0

    @property
    def nbytes(self) -> int:
        """Bytes of one slot: what a write or a read copies."""
        return spec_bytes(self.spec)

    def _views(self, buffers: dict[torch.dtype, torch.Tensor]) -> list[torch.Tensor]:
        """The slot's tensors, in `names` order, as views into its flat buffers."""
        offsets = dict.fromkeys(buffers, 0)
        views = []
        for _, shape, dtype in self.spec:
            n = math.prod(shape)
            views.append(buffers[dtype][offsets[dtype]:offsets[dtype] + n].view(shape))
            offsets[dtype] += n
        return views

    def __getstate__(self) -> dict[str, object]:
        state = self.__dict__.copy()
        del state["slots"]  # rebuilt from the buffers, so only those cross to a process
        state["_pins"] = HostPins()  # page-locking is per process
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self.slots = [self._views(b) for b in self._buffers]

    def _pin_for(self, tensors: list[torch.Tensor]) -> None:
        """pinned: page-lock the buffers in this process before its first copy to or from a
        GPU (registration is per process, and a process that never copies to a GPU, as the
        parameter service, never initialises CUDA)."""
        if self.transport == "pinned" and not self._pins.done and any(t.is_cuda for t in tensors):
            self._pins.register(self, [b for buffers in self._buffers for b in buffers.values()])

    def close(self) -> None:
        """Undo this process's page-locking of the slots (the slots stay usable as host
        memory); the runtime calls it when the run ends."""
        self._pins.release()

    def release_buffers(self) -> None:
        """Drop this object's buffers, after its last copy. A GPU buffer received from
        another process returns to it only when its last reference here dies, which the
        `os._exit` that ends a worker skips: the sender would hold it until it exits."""
        self._buffers, self.slots = [], []

    def _copy(self, dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
        """One multi-tensor copy, finished before it returns even where it runs on a GPU."""
        self._pin_for(src + dst)
        # non_blocking only from page-locked or device memory; then wait for it below: on the
        # streams that copied, never the whole device (a capture may be under way)
        torch._foreach_copy_(dst, src, non_blocking=self.transport != "host")
        wait_for(t.device for t in dst + src)

    def ordered(self, named: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
        """Detached views of `named` in slot order (KeyError names a missing tensor).

        Views share storage with the parameters, so copying into them updates the model,
        and neither direction needs autograd switched off.
        """
        return [named[n].detach() for n in self.names]

    def head(self) -> tuple[int, int]:
        """(current slot, policy version), read together."""
        with self._lock:
            return int(self._state[0]), int(self._state[1])

    def version(self) -> int:
        return self.head()[1]

    @property
    def digests(self) -> bool:
        """Whether a publication carries its state's digest."""
        return self._digests is not None

    def publish(self, slot: int, version: int, digest: str | None = None) -> None:
        """Make `slot` current at `version`, with its state's digest where slots carry
        them. Only the parameter service calls this."""
        if self._digests is not None and digest is None:
            raise ValueError(f"version {version} was published without its digest")
        with self._lock:
            if self._digests is not None and digest is not None:
                self._digests[slot] = torch.tensor(list(bytes.fromhex(
                    digest.removeprefix(DIGEST_PREFIX))), dtype=torch.uint8)
            self._state[0] = slot
            self._state[1] = version

    def _bump(self, slot: int) -> None:
        with self._lock:
            self._state[2 + slot] += 1

    def write(self, slot: int, tensors: list[torch.Tensor]) -> None:
        """Copy tensors (in `names` order) into a slot the writer owns (its staging slot)."""
        self._bump(slot)
        self._copy(self.slots[slot], tensors)  # one call, not a loop of small copies
        self._bump(slot)

    def read_into(self, tensors: list[torch.Tensor]) -> int:
        """Copy the current slot into tensors (in `names` order); returns its version."""
        while True:
            with self._lock:
                slot, version = int(self._state[0]), int(self._state[1])
                before = int(self._state[2 + slot]) if version >= 0 else 1
                digest = (DIGEST_PREFIX + bytes(self._digests[slot].tolist()).hex()
                          if self._digests is not None else None)
            if before % 2:  # unpublished, or a writer is mid-copy: look again
                time.sleep(0.001)
                continue
            self._copy(tensors, self.slots[slot])
            with self._lock:
                if int(self._state[2 + slot]) == before:
                    self.last_digest = digest
                    return version
            self.retries += 1  # a writer began during the copy: it may be torn, copy again
