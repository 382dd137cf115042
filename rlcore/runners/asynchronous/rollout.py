"""The rollout worker: generates in chunks and watches the policy clock between them.

Between two chunks it compares its local version with the global one (paper §4.5,
Listing 3); on a newer version it reloads the current weights, and the generation loop
(`rlcore/policy/generation.py`) applies `staleness.interrupt`: the rows still running are
cut and handed back to the controller (resubmit), re-prefilled (continue), or decoded on
the old cache (keep_kv). Every token keeps the version of the weights that computed its
logits. Generations that already ended are emitted as they are. Each batch's message
carries its schedule record: rows, versions, swaps and cuts (`rlcore/record/schedule.py`).

The loop after loading (`generate_until_stopped`) takes the policy as an argument: the
planner runs it on a policy that draws response lengths instead of tokens
(`rlcore/plan/sampler.py::LengthPolicy`).
"""

from __future__ import annotations

import queue
from collections import deque
from collections.abc import Sequence
from typing import Protocol

import torch

from rlcore.clock.work import Handoff
from rlcore.policy.device import peak_gpu_bytes
from rlcore.policy.generation import Chunked, generate
from rlcore.policy.hf_policy import HFPolicy
from rlcore.policy.sampler import Draws, Generation
from rlcore.record.schedule import GenerationRecord
from rlcore.runners.asynchronous.contexts import RolloutContext
from rlcore.runners.asynchronous.interfaces import Queue
from rlcore.runners.asynchronous.messages import (
    Event,
    InterruptedMsg,
    PromptSlot,
    Ready,
    RolloutBatch,
    SampleMsg,
    Stopped,
)
from rlcore.runners.asynchronous.weight_slots import charge_copy, check_arrival


class Sampling(Chunked, Protocol):
    """A batch being generated, with its rows' tokens so far (`ChunkedSampler`)."""

    @property
    def gens(self) -> list[Generation]: ...


class RolloutPolicy(Protocol):
    """What the rollout loop asks of its policy (`HFPolicy`)."""

    @property
    def device(self) -> torch.device: ...

    def encode_prompt(self, prompt: str, system: str | None = None) -> list[int]: ...

    def decode_response(self, response_ids: Sequence[int]) -> str: ...

    def state_tensors(self) -> dict[str, torch.Tensor]: ...

    def state_loaded(self) -> None: ...

    def sampler(self, prompt_ids: Sequence[Sequence[int]], *, max_new_tokens: int,
                temperature: float, draws: Draws | None, version: int = 0) -> Sampling: ...


class PromptFeed:
    """Prompts arrive as lists (one message per group); generation takes up to `limit`."""

    def __init__(self, prompt_q: Queue, limit: int):
        self.prompt_q, self.limit = prompt_q, limit
        self.held: deque[PromptSlot] = deque()

    def take(self) -> list[PromptSlot]:
        """Block briefly for prompts, then take what is queued, up to `limit`."""
        if not self.held:
            try:
                self.held.extend(self.prompt_q.get(timeout=0.05))
            except queue.Empty:
                return []
        while len(self.held) < self.limit:
            try:
                self.held.extend(self.prompt_q.get_nowait())
            except queue.Empty:
                break
        return [self.held.popleft() for _ in range(min(self.limit, len(self.held)))]


class Look:
    """Between two chunks of one batch: the run's stop, and the policy clock (Listing 3).

    On a newer global version it reloads the weights and records the swap; the generation
    loop then applies `staleness.interrupt`.
    """

    def __init__(self, ctx: RolloutContext, policy: RolloutPolicy, params: list[torch.Tensor],
                 out: RolloutBatch, record: GenerationRecord, sampler: Chunked,
                 version: int):
        self.ctx, self.policy, self.params, self.out = ctx, policy, params, out
        self.record = record
        self.sampler, self.version = sampler, version
        self.old_version, self.t_interrupt = version, 0.0

    def cut(self, running: list[int]) -> tuple[str, list[int]] | None:
        return ("stop", running) if self.ctx.stop.is_set() else None

    def swap(self) -> int | None:
        global_version = self.ctx.slots.version()
        if global_version <= self.version:
            return None
        self.t_interrupt = self.ctx.clock.now()
        self.out.events.append(Event("rollout_interrupt", self.t_interrupt, {
            "worker": self.ctx.name, "old_version": self.version,
            "new_version": global_version, "interrupt": self.ctx.cfg.staleness.interrupt}))
        self.old_version, self.version = self.version, reload(self.ctx, self.policy,
                                                              self.params, self.out)
        self.record.swap(self.sampler.chunks, self.version)
        return self.version


def load_current(ctx: RolloutContext, policy: RolloutPolicy, params: list[torch.Tensor]
                 ) -> int:
    """Read the current state into `params` (the policy's `state_tensors`), check it is the
    one published, and bring the sampling weights up to it; returns its version."""
    v = ctx.slots.read_into(params)
    check_arrival(ctx.slots, v, policy.state_tensors(), ctx.name)
    policy.state_loaded()
    return v


def reload(ctx: RolloutContext, policy: RolloutPolicy, params: list[torch.Tensor],
           out: RolloutBatch) -> int:
    """`load_current` as the run goes on, timed and recorded."""
    clock = ctx.clock
    t0 = clock.now()
    v = load_current(ctx, policy, params)
    charge_copy(clock, ctx.slots, "read")
    out.events.append(Event("weight_reload", clock.now(), {
        "worker": ctx.name, "version": v, "reload_s": clock.now() - t0}))
    return v


def rollout_main(ctx: RolloutContext) -> None:
    """Worker entry: load the policy, pass the ready barrier, generate until told to stop."""
    cfg, clock = ctx.cfg, ctx.clock
    t_load = clock.now()
    policy = HFPolicy(cfg.model, cfg.train, role="rollout", device=ctx.device, clock=clock)
    params = ctx.slots.ordered(policy.state_tensors())
    local_version = load_current(ctx, policy, params)
    # a batch takes up to update_batch_size prompts: capture each width's step now
    policy.prepare_decoding(range(1, cfg.train.update_batch_size + 1), ctx.prompts,
                            cfg.rollout.max_new_tokens)
    ctx.inbox.put(Ready(ctx.name, ctx.pid(), str(policy.device), clock.now() - t_load))
    generate_until_stopped(ctx, policy, params, local_version)


def generate_until_stopped(ctx: RolloutContext, policy: RolloutPolicy,
                           params: list[torch.Tensor], local_version: int) -> None:
    """After the ready barrier: take prompts and generate, reloading `params` when the
    policy clock moves, until the run stops; then say what was sampled."""
    cfg, ro, clock = ctx.cfg, ctx.cfg.rollout, ctx.clock
    ctx.start.wait()
    cpu0 = ctx.own_cpu_s()
    sampled = reprefilled = kv_kept = abandoned = 0
    feed = PromptFeed(ctx.prompt_q, cfg.train.update_batch_size)
    handed: Event | None = None  # the last batch's hand-off, recorded with the next batch

    while not ctx.stop.is_set():
        batch = feed.take()
        ctx.counters[2 * ctx.index] += len(batch)  # this worker's own entry: no lock
        if not batch:
            continue
        out = RolloutBatch(ctx.name)
        if handed is not None:
            out.events.append(handed)
        t_start = clock.now()
        clock.take_work()  # what came before the span is no span's
        if ctx.slots.version() > local_version:
            local_version = reload(ctx, policy, params, out)
        sampler = policy.sampler([policy.encode_prompt(s.prompt, s.system) for s in batch],
                                 max_new_tokens=ro.max_new_tokens,
                                 temperature=ro.temperature,
                                 draws=Draws(cfg.seed, [(s.slot_id, s.attempt) for s in batch]),
                                 version=local_version)
        record = out.generation = GenerationRecord(
            ctx.name, [(s.slot_id, s.attempt, s.group_id) for s in batch], local_version)
        look = Look(ctx, policy, params, out, record, sampler, local_version)
        gen = generate(sampler, ro.chunk_tokens, cfg.staleness.interrupt, look)
        local_version = look.version
        sampled += gen.sampled
        reprefilled += gen.reprefilled
        kv_kept += gen.kv_kept
        if gen.cut_reason == "stop":
            abandoned += sum(gen.cut.values())
        elif gen.cut_reason == "interrupt":
            out.interrupted = [InterruptedMsg(batch[i], n, look.old_version, local_version,
                                              ctx.name, look.t_interrupt)
                               for i, n in gen.cut.items()]
        if gen.cut_after is not None and gen.cut_reason is not None:
            record.cut_rows(gen.cut_after, list(gen.cut), gen.cut_reason)
        record.chunks = sampler.chunks
        t_end = clock.now()
        kept = gen.kept(sampler.rows)
        for i in kept:
            g = sampler.gens[i]
            out.samples.append(SampleMsg(
                batch[i], list(g.prompt_ids), g.response_ids, g.logprobs, g.versions,
                g.finished, policy.decode_response(g.response_ids), ctx.name, t_end))
        out.events.append(Event("span", t_end, {"worker": ctx.name, "role": "rollout",
                                                "start": t_start, "end": t_end,
                                                "samples": len(kept),
                                                "work": clock.take_work()}))
        ctx.counters[2 * ctx.index + 1] += 1
        # Building the messages and sending them is time the rollout does not generate in:
        # timed live, priced in virtual time when the profile prices it (`profile.handoff`).
        clock.charge(Handoff(len(kept)))
        ctx.inbox.put(out)
        t_sent = clock.now()
        handed = Event("handoff", t_sent, {"worker": ctx.name, "samples": len(kept),
                                           "handoff_s": t_sent - t_end})
    ctx.inbox.put(Stopped(ctx.name, tokens_sampled=sampled, tokens_reprefilled=reprefilled,
                          tokens_kv_kept=kv_kept, tokens_abandoned=abandoned,
                          cpu_s=ctx.own_cpu_s() - cpu0,
                          gpu_peak_bytes=peak_gpu_bytes(policy.device)))
