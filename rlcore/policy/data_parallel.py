"""A data-parallel trainer's ranks: each holds the whole policy, trains its share of a batch
and sums its gradients with the others' before every optimizer step.

Every rank receives the whole batch and computes the same split of it
(`rlcore/algo/batching.py::shard_groups`), so no rank waits on another to learn what it
trains. A rank's loss is the token mean over its share, weighted by its share of the batch's
response tokens; the gradients summed over the ranks are then the token mean over the whole
batch's, as one rank computes it, up to the order of the sums. Every rank applies the same
summed gradients with the same optimizer state, so the ranks stay equal bit for bit, and an
fp16 loss scaler that skips a step skips it on every rank. Only the trainable tensors are
summed: under `train.lora` the adapters.

The ranks meet in a `torch.distributed` group of their own, gloo on CPU and NCCL on GPUs
(one rank per GPU, bound to it when the group forms), formed through a rendezvous file
private to the run, and every collective waits at most `timeout_s`: a rank that died ends
the others' wait with an error, never a hang. Under NCCL a wait with a timeout blocks the
host until the collective ends or the timeout passes, which raises; the group's own timeout
lets NCCL's watchdog abort a collective that never ends.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from pathlib import Path

import torch
import torch.distributed as dist

from rlcore.errors import ConfigError

CPU = torch.device("cpu")


def backend_for(device: torch.device) -> str:
    """The collectives' backend of ranks on `device`: NCCL on a GPU, gloo on a CPU."""
    return "nccl" if device.type == "cuda" else "gloo"


class RankGroup:
    """This process's place among a data-parallel trainer's ranks, and their collectives."""

    def __init__(self, rendezvous: Path, rank: int, world: int, *,
                 device: torch.device = CPU, timeout_s: float = 60.0):
        if not 0 <= rank < world:
            raise ConfigError(f"rank {rank} is not one of a group of {world}")
        self.rank, self.world, self.timeout_s = rank, world, timeout_s
        self.device = device
        self.timeout = datetime.timedelta(seconds=timeout_s)
        backend = backend_for(device)
        # NCCL: the rank's GPU is its current device before the group forms, and the group is
        # bound to it (its communicator made now, not at the first collective)
        if backend == "nccl":
            torch.cuda.set_device(device)
        try:
            dist.init_process_group(backend, init_method=f"file://{rendezvous}", rank=rank,
                                    world_size=world, timeout=self.timeout,
                                    device_id=device if backend == "nccl" else None)
        except (RuntimeError, ValueError) as e:
            raise RuntimeError(
                f"trainer rank {rank} of {world} could not join its group through "
                f"{rendezvous} within {timeout_s:g} s ({backend}): {e}") from e

    def sum_(self, tensors: Iterable[torch.Tensor]) -> None:
        """Sum each tensor over the ranks, in place: one flat buffer per dtype and device,
        one collective each."""
        by_kind: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
        for t in tensors:
            by_kind.setdefault((t.dtype, t.device), []).append(t)
        for parts in by_kind.values():
            flat = torch.cat([t.reshape(-1) for t in parts])
            work = dist.all_reduce(flat, op=dist.ReduceOp.SUM, async_op=True)
            if work is None or not work.wait(timeout=self.timeout):
                raise RuntimeError(f"trainer rank {self.rank}: the gradient sum did not "
                                   f"finish within {self.timeout_s:g} s")
            offset = 0
            for t in parts:
                t.copy_(flat[offset:offset + t.numel()].view_as(t))
                offset += t.numel()

    def agree(self, digest: str) -> None:
        """Raise unless every rank's state has rank 0's digest ('sha256:<hex>'): the ranks
        were to stay equal bit for bit."""
        mine = torch.tensor(list(bytes.fromhex(digest.split(":")[-1])), dtype=torch.uint8)
        first = mine.to(self.device)  # NCCL moves only what is on the rank's GPU
        work = dist.broadcast(first, src=0, async_op=True)
        if work is None or not work.wait(timeout=self.timeout):
            raise RuntimeError(f"trainer rank {self.rank}: rank 0's digest did not come "
                               f"within {self.timeout_s:g} s")
        first = first.cpu()
        if not torch.equal(mine, first):
            raise RuntimeError(f"trainer rank {self.rank} holds state {digest}, rank 0 "
                               f"sha256:{bytes(first.tolist()).hex()}: the ranks diverged")

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
