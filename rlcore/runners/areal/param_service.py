"""The parameter service: the one writer of the global policy and of `policy_version`.

Weights live in `WeightSlots`: n_trainers + 1 copies of the trainable tensors, allocated
once (in shared memory for the process runtime). One slot is *current*; each trainer owns a
staging slot into which it writes its candidate state. A commit is decided here alone: if the
candidate was computed from the current version and is finite, the service publishes the
staging slot as current and bumps the version in one locked step (the paper's Listing 2,
without a copy: the old current slot becomes the trainer's next staging slot). Otherwise the
commit is recorded as skipped and the version does not move.

Readers copy the current slot under a sequence lock: every slot has a counter that is odd
while the slot is being written; a reader that sees it odd, or changed after its copy,
copies again. So a rollout worker never loads a torn state, and never blocks a trainer.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from rlcore.runners.areal.protocol import CommitAck, CommitRequest, Event, Ready, Stopped

ParamSpec = list[tuple[str, tuple[int, ...], torch.dtype]]


def trainable_spec(model_dir: str) -> ParamSpec:
    """Names, shapes and dtypes of the trainable tensors, from the config alone (meta device)."""
    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return [(n, tuple(p.shape), p.dtype) for n, p in model.named_parameters() if p.requires_grad]


class WeightSlots:
    """Copies of the trainable state, one current, with lock-free consistent reads."""

    def __init__(self, spec: ParamSpec, n_slots: int, ctx: Any, shared: bool):
        def alloc(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
            t = torch.empty(shape, dtype=dtype)
            return t.share_memory_() if shared else t

        self.slots = [{n: alloc(s, d) for n, s, d in spec} for _ in range(n_slots)]
        self._seq = ctx.Array("q", n_slots)  # even: stable; odd: being written
        self._head = ctx.Array("q", 2)  # [current slot, policy version], changed together
        self._head[1] = -1  # nothing published yet: readers wait for the service's first write

    def head(self) -> tuple[int, int]:
        """(current slot, policy version), read together."""
        with self._head.get_lock():
            return int(self._head[0]), int(self._head[1])

    def version(self) -> int:
        return self.head()[1]

    def publish(self, slot: int, version: int) -> None:
        """Make `slot` current at `version`. Only the parameter service calls this."""
        with self._head.get_lock():
            self._head[0] = slot
            self._head[1] = version

    def _bump(self, slot: int) -> int:
        with self._seq.get_lock():
            self._seq[slot] += 1
            return int(self._seq[slot])

    def write(self, slot: int, params: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy named tensors into a slot (the writer owns it: a trainer's staging slot)."""
        dst = self.slots[slot]
        names, srcs = zip(*((n, p.detach()) for n, p in params), strict=True)
        self._bump(slot)
        with torch.no_grad():  # one multi-tensor copy, not a Python loop of small ones
            torch._foreach_copy_([dst[n] for n in names], list(srcs))
        self._bump(slot)

    def read_into(self, params: Mapping[str, torch.Tensor]) -> int:
        """Copy the current slot into `params`; returns the version that was copied."""
        with torch.no_grad():
            while True:
                slot, version = self.head()
                if version < 0:
                    time.sleep(0.01)
                    continue
                with self._seq.get_lock():
                    before = int(self._seq[slot])
                if before % 2:
                    time.sleep(0)  # a writer is mid-copy: yield and look again
                    continue
                src = self.slots[slot]
                torch._foreach_copy_([params[n] for n in src], list(src.values()))
                with self._seq.get_lock():
                    if int(self._seq[slot]) == before:
                        return version


class ParamService:
    """Decides commits; the only caller of `WeightSlots.publish`."""

    def __init__(self, slots: WeightSlots):
        self.slots = slots
        self.skipped = 0

    def commit(self, req: CommitRequest) -> CommitAck:
        current_slot, version = self.slots.head()
        if req.base_version != version:
            reason = f"stale base (candidate from v{req.base_version}, current v{version})"
        elif not req.finite:
            reason = "non-finite loss or gradient"
        else:
            self.slots.publish(req.slot, version + 1)
            return CommitAck(applied=True, version=version + 1, next_slot=current_slot,
                             t=time.monotonic())
        self.skipped += 1
        return CommitAck(applied=False, version=version, next_slot=req.slot, t=time.monotonic(),
                         reason=reason)


def param_service_main(ctx: Any) -> None:
    """Process entry: load the initial weights into slot 0, then serve commits until None."""
    from rlcore.backend import check_model_dir, load_model

    t_load = time.monotonic()
    model = load_model(check_model_dir(ctx.cfg.model.path))
    ctx.slots.write(0, ((n, p) for n, p in model.named_parameters() if p.requires_grad))
    ctx.slots.publish(0, 0)
    del model
    ctx.inbox.put(Ready(ctx.name, ctx.pid(), "cpu", time.monotonic() - t_load))
    service = ParamService(ctx.slots)
    while True:
        req = ctx.commit_q.get()
        if req is None:
            break
        t0 = time.monotonic()
        ack = service.commit(req)
        ctx.ack_qs[req.trainer].put(ack)
        t1 = time.monotonic()
        if ack.applied:
            ctx.inbox.put(Event("version_change", t1, {
                "old_version": ack.version - 1, "new_version": ack.version,
                "trainer": req.trainer, "batch_id": req.batch_id, "commit_s": t1 - t0}))
        else:
            ctx.inbox.put(Event("commit_skipped", t1, {
                "version": ack.version, "trainer": req.trainer, "batch_id": req.batch_id,
                "reason": ack.reason}))
    ctx.inbox.put(Stopped(ctx.name))
