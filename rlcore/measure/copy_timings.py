"""The weight copies a version hands over, and their digests, timed and fit (`timings.py`).

The slots' write and read are timed through `WeightSlots` by the transport the config
resolves to, at three sizes of its trainable state; under train.lora the sha256 each side of
a version computes (`weight_slots.py::copy_work`) is timed through `state_digest` on the
rollout's device, as a reader checks what arrived.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from rlcore.config import ConfigError, RunConfig
from rlcore.measure.timings import Fit, lora_of, nonneg_lstsq
from rlcore.policy.device import resolve_device, resolve_transport, wait_for
from rlcore.policy.digest import state_digest
from rlcore.runners.asynchronous.vehicles import Threads
from rlcore.runners.asynchronous.weight_slots import (
    ParamSpec,
    WeightSlots,
    check_shared_memory,
    shared_memory_free,
    spec_bytes,
    trainable_spec,
)


def weight_scales(spec: ParamSpec, budget_bytes: float = 2.5e8) -> list[ParamSpec]:
    """A state at three sizes for the (call, GB) fit of a copy: 1, 4 and 16 times a model
    whose state is under `budget_bytes`; else a quarter, half and all of its tensors, since
    16 copies of a 0.5B model's fp32 state in two slots would fill 64 GB of shared memory."""
    if spec_bytes(spec) <= budget_bytes:
        return [[(f"{n}.{i}", shape, dtype) for i in range(scale) for n, shape, dtype in spec]
                for scale in (1, 4, 16)]
    whole, out = spec_bytes(spec), []
    for share in (0.25, 0.5, 1.0):
        part, total = [], 0
        for entry in spec:
            if total >= share * whole:
                break
            part.append(entry)
            total += spec_bytes([entry])
        out.append(part)
    return out


@dataclasses.dataclass(frozen=True)
class WeightCopies:
    """What `time_weights` copies: between which devices, by which transport, which states."""

    trainer: torch.device
    rollout: torch.device
    transport: str  # `runtime.weight_transport` resolved for the rollout's device
    scales: list[ParamSpec]  # `weight_scales`


def weight_copies(cfg: RunConfig) -> WeightCopies:
    """The weight copies `time_weights` times for `cfg`; refuses, before any slot exists,
    slots that shared memory cannot hold (past its limit the process dies of SIGBUS)."""
    trainer = resolve_device(cfg.model.trainer_device, "trainer")
    rollout = resolve_device(cfg.model.rollout_device, "rollout")
    transport = resolve_transport(cfg.runtime.weight_transport, rollout)
    scales = weight_scales(trainable_spec(cfg.model.path))
    if transport != "device":  # host and pinned slots live in shared memory, two at a time
        try:
            check_shared_memory(scales[-1], 2, shared_memory_free())
        except ConfigError as e:
            raise ConfigError(
                f"rlcore calibrate times {transport} weight copies through two slots of up to "
                f"the whole trainable state in shared memory: {e}. Here: give /dev/shm more, "
                "or calibrate a rollout on a GPU with runtime.weight_transport: device") from e
    return WeightCopies(trainer, rollout, transport, scales)


def time_weights(cfg: RunConfig, reps: int) -> tuple[Fit, Fit, str]:
    """Writing a weight slot from the trainer's device and reading it onto the rollout's,
    at three sizes (`weight_scales`), by the transport the config resolves to (returned)."""
    copies = weight_copies(cfg)
    trainer, rollout, transport = copies.trainer, copies.rollout, copies.transport

    def synced() -> float:  # a copy to or from a GPU may return before its last bytes land
        wait_for([trainer, rollout])
        return time.perf_counter()

    writes: list[tuple[float, float]] = []
    reads: list[tuple[float, float]] = []
    for spec in copies.scales:
        slots = WeightSlots(spec, 2, Threads().locked_array(4), shared=transport != "device",
                            transport=transport, device=rollout)
        src = [torch.randn(shape).to(dtype).to(trainer) for _, shape, dtype in spec]
        dst = [torch.empty(shape, dtype=dtype, device=rollout) for _, shape, dtype in spec]
        gb = slots.nbytes / 1e9
        try:
            slots.write(0, src)
            slots.publish(0, 0)
            for rep in range(reps + 1):
                t0 = synced()
                slots.write(1, src)
                t1 = synced()
                slots.read_into(dst)
                t2 = synced()
                if rep:
                    writes.append((gb, t1 - t0))
                    reads.append((gb, t2 - t1))
        finally:
            slots.close()  # pinned: unregistered while its memory is still alive
        del slots, src, dst
    return (nonneg_lstsq([[1.0, g] for g, _ in writes], [s for _, s in writes]),
            nonneg_lstsq([[1.0, g] for g, _ in reads], [s for _, s in reads]), transport)


def time_digests(cfg: RunConfig, reps: int) -> Fit:
    """`state_digest` (calls, GB) of the adapters cfg's train.lora (or the default one) gives
    its model, at three sizes (`weight_scales`), from the rollout's device."""
    lora = lora_of(cfg).train.lora
    device = resolve_device(cfg.model.rollout_device, "rollout")
    points: list[tuple[float, float]] = []
    for spec in weight_scales(trainable_spec(cfg.model.path, lora)):
        state = {n: torch.randn(shape).to(dtype).to(device) for n, shape, dtype in spec}
        gb = spec_bytes(spec) / 1e9
        for rep in range(3 * reps + 1):
            wait_for([device])
            t0 = time.perf_counter()
            state_digest(state)
            if rep:
                points.append((gb, time.perf_counter() - t0))
    return nonneg_lstsq([[1.0, g] for g, _ in points], [s for _, s in points])


def _allreduce_rank(rendezvous: str, rank: int, world: int, sizes: list[int], reps: int,
                    out: str) -> None:
    """A rank of `time_allreduce`: each size summed `reps` + 1 times (the first warms the
    connection); rank 0 writes the seconds of each."""
    from rlcore.kernels import take_intel_mkl_paths

    take_intel_mkl_paths()
    from pathlib import Path

    from rlcore.policy.data_parallel import RankGroup

    torch.set_num_threads(1)
    group = RankGroup(Path(rendezvous), rank, world, timeout_s=120)
    times = []
    try:
        for n in sizes:
            buf = torch.ones(n, dtype=torch.float32)
            for rep in range(reps + 1):
                group.sum_([torch.zeros(1)])  # the ranks start together
                t0 = time.perf_counter()
                group.sum_([buf])
                if rep:
                    times.append((n, time.perf_counter() - t0))
    finally:
        group.close()
    if rank == 0:
        Path(out).write_text("\n".join(f"{n} {s}" for n, s in times))


def time_allreduce(cfg: RunConfig, reps: int, ranks: int = 2) -> Fit | None:
    """(calls, ring GB) of `ranks` trainer ranks summing float32 gradients of cfg's trainable
    state at three sizes, over gloo between processes on this host; None when the trainer
    is on a GPU (its ranks would sum over NCCL, which this does not time)."""
    import multiprocessing as mp
    import tempfile
    from pathlib import Path

    if resolve_device(cfg.model.trainer_device, "trainer").type != "cpu":
        return None
    sizes = [spec_bytes(s) // 4 for s in weight_scales(trainable_spec(cfg.model.path,
                                                                      cfg.train.lora))]
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="rlcore-allreduce-") as tmp:
        out = str(Path(tmp) / "times")
        procs = [ctx.Process(target=_allreduce_rank,
                             args=(str(Path(tmp) / "rendezvous"), r, ranks, sizes, 3 * reps,
                                   out)) for r in range(ranks)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(300)
            if p.is_alive():
                p.kill()
        if any(p.exitcode != 0 for p in procs):
            raise RuntimeError(f"timing the all-reduce: ranks exited {[p.exitcode for p in procs]}")
        rows = [line.split() for line in Path(out).read_text().splitlines()]
    ring = 2 * (ranks - 1) / ranks
    return nonneg_lstsq([[1.0, ring * 4 * int(n) / 1e9] for n, _ in rows],
                        [float(s) for _, s in rows])
