"""Where a role runs: the same rules in every mode (its kernels and threads: rlcore.kernels),
and the rules every CUDA call of rlcore keeps.

CUDA keeps a current device per host thread, and a call that names no device or stream acts
on it; a role on cuda:1 whose thread still has cuda:0 current would capture, record events
and wait on cuda:0. So a role binds its device when it starts (`bind`), and every stream,
event and graph is made on a named device. A process may have one CUDA graph capture under
way at a time, and no thread may wait on a whole device while any stream captures (CUDA
Programming Guide, "Prohibited and Unhandled Operations"): captures take `CAPTURE_LOCK`, and
the waits rlcore makes (`wait_for`) take it too and wait on streams, never on a device.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable

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
        check_kernels(device, f"model.{role}_device is '{spec}'")
        return device
    if n == 0:
        return torch.device("cpu")
    device = torch.device(f"cuda:{min(1 if role == 'trainer' else 0, n - 1)}")
    check_kernels(device, f"model.{role}_device is 'auto'")
    return device


# Where the weight slots of the asynchronous runners live (`runtime.weight_transport`;
# rlcore/runners/asynchronous/weight_slots.py).
TRANSPORTS = ("host", "pinned", "device")


def resolve_transport(setting: str, rollout: torch.device, rollout_gpus: int = 1) -> str:
    """`runtime.weight_transport` for a rollout on `rollout`: `auto` is `device` on CUDA (or
    `pinned` where the rollout workers are on `rollout_gpus` > 1 GPUs: slots on one GPU
    would make every other one read across GPUs) and `host` elsewhere; `pinned` and
    `device` need the rollout on CUDA."""
    if setting == "auto":
        if rollout.type != "cuda":
            return "host"
        return "device" if rollout_gpus == 1 else "pinned"
    if setting not in TRANSPORTS:
        raise ConfigError(f"runtime.weight_transport is {setting!r}; allowed: auto, "
                          f"{', '.join(TRANSPORTS)}")
    if setting != "host" and rollout.type != "cuda":
        raise ConfigError(
            f"runtime.weight_transport is '{setting}', which moves weights to and from a GPU, "
            f"but the rollout runs on {rollout}: set runtime.weight_transport: host (or auto)")
    return setting


def peak_gpu_bytes(device: torch.device) -> int | None:
    """Peak bytes torch's CUDA allocator has held on `device` in this process; None off CUDA
    (threads of one process share the figure)."""
    return int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None


# Held by a CUDA graph capture and by every wait of `wait_for`: one capture at a time in the
# process (PyTorch shares one capture stream), and no wait while one is under way.
CAPTURE_LOCK = threading.RLock()


def bind(device: torch.device) -> None:
    """Make `device` this thread's current CUDA device (nothing off CUDA): a role calls it
    when it starts, in the thread that computes."""
    if device.type == "cuda":
        torch.cuda.set_device(device)


def own_stream(device: torch.device) -> None:
    """Bind `device` and give this thread a stream of its own on it (nothing off CUDA): roles
    that are threads of one process then neither serialise nor wait on each other's work."""
    if device.type == "cuda":
        bind(device)
        torch.cuda.set_stream(torch.cuda.Stream(device))


def wait_for(devices: Iterable[torch.device]) -> None:
    """Wait until the work this thread queued on each CUDA device among `devices` has run:
    its current stream on each, never the whole device (nothing off CUDA)."""
    for dev in {d for d in devices if d.type == "cuda"}:
        with CAPTURE_LOCK:
            torch.cuda.current_stream(dev).synchronize()


# --- whether the installed torch has kernels for a GPU ------------------------------------

# An entry of torch.cuda.get_arch_list(): sm_XY is machine code (a cubin) for compute
# capability X.Y, compute_XY is PTX the driver compiles at load; a suffix `a` marks code for
# that exact capability only, `f` code for its family (the same major, a minor at or above).
_ARCH = re.compile(r"(sm|compute)_(\d+)(\d)([af]?)")


def kernel_image_runs(capability: tuple[int, int], arch: str) -> bool:
    """Whether code built for `arch` (an entry of torch.cuda.get_arch_list()) runs on a GPU of
    compute `capability`: a cubin on the same major at a minor at or above its own, PTX on
    any capability at or above its own, arch-specific code (`a`) on its capability only."""
    m = _ARCH.fullmatch(arch)
    if m is None:
        return False
    kind, built, suffix = m[1], (int(m[2]), int(m[3])), m[4]
    if suffix == "a":
        return capability == built
    if kind == "sm" or suffix == "f":
        return capability[0] == built[0] and capability[1] >= built[1]
    return capability >= built


def build_with(capability: tuple[int, int]) -> str:
    """Where to get a torch that has kernels for `capability`: what a refusal says."""
    sm = f"sm_{capability[0]}{capability[1]}"
    if capability < (5, 0):
        return (f"No torch wheel of the CUDA 12 builds carries {sm} (compute capability 5.0 "
                "is the oldest they know): this GPU cannot run rlcore's torch")
    if capability < (7, 5):
        return (f"Since torch 2.11 only its CUDA 12.6 wheels carry {sm}: on a fresh clone, "
                "`make setup TORCH_INDEX=https://download.pytorch.org/whl/cu126` (or `pip "
                "install torch --index-url https://download.pytorch.org/whl/cu126`; "
                "docs/setup.md, 'GPU setup')")
    return ("Install the CUDA build of torch that pytorch.org lists for this GPU and its "
            "driver (`make setup TORCH_INDEX=https://download.pytorch.org/whl/cuXYZ` on a "
            "fresh clone; docs/setup.md, 'GPU setup'), one whose torch.cuda.get_arch_list() "
            f"holds code for {sm}")


def check_kernels(device: torch.device, setting: str) -> None:
    """Refuse a GPU the installed torch has no kernels for, before anything runs on it (its
    first kernel would fail with "no kernel image is available"); `setting` names the config
    key and its value. Nothing off CUDA, nor where torch names no architectures."""
    if device.type != "cuda":
        return
    arches = torch.cuda.get_arch_list()
    if not arches:  # a build without CUDA: refused elsewhere if CUDA is asked for
        return
    cap = torch.cuda.get_device_capability(device)
    if any(kernel_image_runs(cap, a) for a in arches):
        return
    raise ConfigError(
        f"{setting}, {device}: a {torch.cuda.get_device_name(device)} of compute capability "
        f"{cap[0]}.{cap[1]} (sm_{cap[0]}{cap[1]}), but the installed torch {torch.__version__} "
        f"was built for {', '.join(arches)} only, so its kernels cannot run there. "
        + build_with(cap))
