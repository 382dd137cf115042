"""The rollout worker: generates in chunks and watches the policy clock between them.

Between two chunks it compares its local version with the global one (paper §4.5,
Listing 3). On a newer version it reloads the current weights and then, per
`staleness.interrupt`:
  resubmit (the paper)  unfinished generations are abandoned and handed back to the
                        controller, which resubmits them or drops them as interrupted;
  continue (AReaL)      the partial responses are re-prefilled under the new weights and
                        generation goes on; every token keeps the version that sampled it;
  keep_kv               the new weights decode on the KV cache the old ones computed, with
                        no re-prefill (SkyRL, PipelineRL); each token keeps the version of
                        the weights that computed its logits.
Generations that already ended are complete and are emitted as they are. Each batch's
message carries its schedule record: rows, versions, swaps and cuts (`rlcore/record/schedule.py`).
"""

from __future__ import annotations

import queue
from collections import deque

from rlcore.clock.work import Weights
from rlcore.policy.device import peak_gpu_bytes
from rlcore.policy.hf_policy import HFPolicy
from rlcore.policy.sampler import ChunkedSampler, Draws
from rlcore.record.schedule import GenerationRecord
from rlcore.runners.asynchronous.contexts import RolloutContext
from rlcore.runners.asynchronous.messages import (
    Event,
    InterruptedMsg,
    PromptSlot,
    Ready,
    RolloutBatch,
    SampleMsg,
    Stopped,
)


class PromptFeed:
    """Prompts arrive as lists (one message per group); generation takes up to `limit`."""

    def __init__(self, ctx: RolloutContext, limit: int):
        self.ctx, self.limit = ctx, limit
        self.held: deque[PromptSlot] = deque()

    def take(self) -> list[PromptSlot]:
        """Block briefly for prompts, then take what is queued, up to `limit`."""
        if not self.held:
            try:
                self.held.extend(self.ctx.prompt_q.get(timeout=0.05))
            except queue.Empty:
                return []
        while len(self.held) < self.limit:
            try:
                self.held.extend(self.ctx.prompt_q.get_nowait())
            except queue.Empty:
                break
        n = min(self.limit, len(self.held))
        self.ctx.counters[2 * self.ctx.index] += n  # this worker's own entry: no lock
        return [self.held.popleft() for _ in range(n)]


def rollout_main(ctx: RolloutContext) -> None:
    """Worker entry: load the policy, pass the ready barrier, generate until told to stop."""
    cfg, ro, clock = ctx.cfg, ctx.cfg.rollout, ctx.clock
    t_load = clock.now()
    policy = HFPolicy(cfg.model, cfg.train, role="rollout", device=ctx.device, clock=clock)
    params = ctx.slots.ordered(dict(policy.model.named_parameters()))
    local_version = ctx.slots.read_into(params)
    ctx.inbox.put(Ready(ctx.name, ctx.pid(), str(policy.device), clock.now() - t_load))
    ctx.start.wait()
    cpu0 = ctx.own_cpu_s()
    sampled = reprefilled = kv_kept = abandoned = 0
    feed = PromptFeed(ctx, cfg.train.update_batch_size)

    while not ctx.stop.is_set():
        batch = feed.take()
        if not batch:
            continue
        out = RolloutBatch(ctx.name)

        def reload(out: RolloutBatch = out) -> int:
            t0 = clock.now()
            v = ctx.slots.read_into(params)
            clock.charge(Weights("read", ctx.slots.nbytes))
            out.events.append(Event("weight_reload", clock.now(), {
                "worker": ctx.name, "version": v, "reload_s": clock.now() - t0}))
            return v

        t_start = clock.now()
        if ctx.slots.version() > local_version:
            local_version = reload()
        sampler = policy.sampler([policy.encode_prompt(s.prompt, s.system) for s in batch],
                                 max_new_tokens=ro.max_new_tokens,
                                 temperature=ro.temperature,
                                 draws=Draws(cfg.seed, [(s.slot_id, s.attempt) for s in batch]),
                                 version=local_version)
        record = out.generation = GenerationRecord(
            ctx.name, [(s.slot_id, s.attempt, s.group_id) for s in batch], local_version)
        live = list(range(len(batch)))  # rows still owned by this batch
        while not sampler.done:
            sampled += sampler.step(ro.chunk_tokens)
            if ctx.stop.is_set():
                cut = [i for i in live if not sampler.gens[i].finished]
                abandoned += sum(len(sampler.gens[i].response_ids) for i in cut)
                record.cut_rows(sampler.chunks, cut, "stop")
                live = [i for i in live if sampler.gens[i].finished]
                break
            global_version = ctx.slots.version()
            if sampler.done or global_version <= local_version:
                continue
            now = clock.now()
            out.events.append(Event("rollout_interrupt", now, {
                "worker": ctx.name, "old_version": local_version,
                "new_version": global_version, "policy": cfg.staleness.interrupt}))
            old_version, local_version = local_version, reload()
            record.swap(sampler.chunks, local_version)
            if cfg.staleness.interrupt == "continue":
                reprefilled += _unfinished_tokens(sampler, live)
                sampler.reprefill(local_version)
                continue
            if cfg.staleness.interrupt == "keep_kv":  # the re-prefill that continue would do
                kv_kept += _unfinished_tokens(sampler, live)
                sampler.keep_cache(local_version)
                continue
            cut = [i for i in live if not sampler.gens[i].finished]
            for i in cut:
                out.interrupted.append(InterruptedMsg(
                    batch[i], len(sampler.gens[i].response_ids), old_version, local_version,
                    ctx.name, now))
            record.cut_rows(sampler.chunks, cut, "interrupt")
            live = [i for i in live if sampler.gens[i].finished]
            break
        record.chunks = sampler.chunks
        t_end = clock.now()
        for i in live:
            g = sampler.gens[i]
            out.samples.append(SampleMsg(
                batch[i], list(g.prompt_ids), g.response_ids, g.logprobs, g.versions,
                g.finished, policy.decode_response(g.response_ids), ctx.name, t_end))
        out.events.append(Event("span", t_end, {"worker": ctx.name, "role": "rollout",
                                                "start": t_start, "end": t_end,
                                                "samples": len(live)}))
        ctx.counters[2 * ctx.index + 1] += 1
        ctx.inbox.put(out)
    ctx.inbox.put(Stopped(ctx.name, tokens_sampled=sampled, tokens_reprefilled=reprefilled,
                          tokens_kv_kept=kv_kept, tokens_abandoned=abandoned,
                          cpu_s=ctx.own_cpu_s() - cpu0,
                          gpu_peak_bytes=peak_gpu_bytes(policy.device)))


def _unfinished_tokens(sampler: ChunkedSampler, rows: list[int]) -> int:
    """Response tokens that a re-prefill recomputes (those of generations still running)."""
    return sum(len(sampler.gens[i].response_ids) for i in rows if not sampler.gens[i].finished)
