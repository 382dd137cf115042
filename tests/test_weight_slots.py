"""The parameter service's weight slots (rlcore/runners/asynchronous/param_service.py): a
real model's many tensors in shared memory, written in one process and read in another, and
the sequence lock that keeps a read overlapping a write from returning a torn state."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from rlcore.config import ConfigError
from rlcore.policy.device import resolve_transport
from rlcore.runners.asynchronous.vehicles import Processes
from rlcore.runners.asynchronous.weight_slots import WeightSlots

# 300 tensors (Qwen2.5-0.5B has 290), two dtypes: more than the 256 file descriptors that
# Python's fork server passes to a new process, had each tensor its own.
SPEC = [(f"t{i}", (3, i % 5 + 1), torch.float32 if i % 3 else torch.float16)
        for i in range(300)]
MAX_READS = 20_000  # the stress test's bound; here 3 retries come within a few hundred reads


def values(version: int) -> list[torch.Tensor]:
    return [torch.full(shape, float(version + i % 7), dtype=dtype)
            for i, (_, shape, dtype) in enumerate(SPEC)]


def write_next(slots: WeightSlots) -> None:
    """In a worker: read the current state, publish it plus one in slot 1 as version 1."""
    got = [torch.empty(shape, dtype=dtype) for _, shape, dtype in SPEC]
    assert slots.read_into(got) == 0
    slots.write(1, [t + 1 for t in got])
    slots.publish(1, 1)


def test_slots_cross_to_a_forked_process_and_back():
    vehicle = Processes()
    slots = WeightSlots(SPEC, 2, vehicle.locked_array(4), shared=True)
    slots.write(0, values(0))
    slots.publish(0, 0)
    worker = vehicle.mp.Process(target=write_next, args=(slots,))
    worker.start()
    worker.join(60)
    assert worker.exitcode == 0
    got = [torch.empty(shape, dtype=dtype) for _, shape, dtype in SPEC]
    assert slots.read_into(got) == 1
    assert all(torch.equal(g, v) for g, v in zip(got, values(1), strict=True))


def test_a_slot_is_one_buffer_per_dtype_and_its_tensors_do_not_overlap():
    slots = WeightSlots(SPEC, 2, Processes().locked_array(4), shared=False)
    slots.write(0, values(0))
    slots.write(1, values(5))
    slots.publish(0, 0)
    got = [torch.empty(shape, dtype=dtype) for _, shape, dtype in SPEC]
    slots.read_into(got)
    assert all(torch.equal(g, v) for g, v in zip(got, values(0), strict=True))
    storages = {t.untyped_storage().data_ptr() for t in slots.slots[0]}
    assert len(storages) == 2


@pytest.mark.slow
def test_a_read_overlapping_a_write_is_copied_again_never_torn():
    """A writer rewrites the slot a reader is copying (as a trainer rewrites its staging slot,
    the old current one, while a slow reader still copies it): the reader must discard the
    copies a write overlapped (`retries`) and return only whole states.

    Reads go on until some have been retried, bounded in count and time; every state read,
    retried or not, must be one that was written."""
    slots = WeightSlots(SPEC, 1, Processes().locked_array(3), shared=False)
    states = [values(v) for v in range(4)]
    slots.write(0, states[0])
    slots.publish(0, 0)
    stop = threading.Event()

    def rewrite() -> None:  # the copies release the GIL: reader and writer overlap
        i = 0
        while not stop.is_set():
            i += 1
            slots.write(0, states[i % len(states)])
            time.sleep(0)

    writer = threading.Thread(target=rewrite, daemon=True)
    got = [torch.empty(shape, dtype=dtype) for _, shape, dtype in SPEC]
    reads, torn, deadline = 0, 0, time.monotonic() + 60
    writer.start()
    try:
        while reads < MAX_READS and time.monotonic() < deadline and \
                (slots.retries < 3 or reads < 200):
            assert slots.read_into(got) == 0
            reads += 1
            written = int(got[0][0, 0])  # tensor 0 holds its state's number itself
            torn += not all(torch.equal(g, s) for g, s in
                            zip(got, states[written], strict=True))
    finally:
        stop.set()
        writer.join()
    assert torn == 0, f"{torn} of {reads} reads returned a state mixed from two writes"
    assert slots.retries >= 3, (f"only {slots.retries} of {reads} reads overlapped a write: the "
                                "test did not exercise the sequence lock's retry")


class TestTransport:
    def test_auto_moves_weights_on_the_device_where_the_rollout_is_on_cuda(self):
        assert resolve_transport("auto", torch.device("cpu")) == "host"
        assert resolve_transport("auto", torch.device("cuda:0")) == "device"
        assert resolve_transport("pinned", torch.device("cuda:1")) == "pinned"
        assert resolve_transport("host", torch.device("cuda:0")) == "host"

    @pytest.mark.parametrize("transport", ["pinned", "device"])
    def test_a_gpu_transport_for_a_cpu_rollout_says_what_to_set(self, transport: str):
        with pytest.raises(ConfigError, match="runtime.weight_transport: host"):
            resolve_transport(transport, torch.device("cpu"))

    def test_device_slots_need_a_cuda_device(self):
        with pytest.raises(ValueError, match="CUDA device"):
            WeightSlots(SPEC, 2, Processes().locked_array(4), shared=True, transport="device",
                        device=torch.device("cpu"))
