"""`rlcore bench`: the runner's cost over a bare REINFORCE loop on the same model and batch.

The floor is the least a synchronous step can cost: sample a batch in one chunk, reward it,
one policy-gradient update -- no records, no chunk boundaries, no per-sample bookkeeping.
The runner figure is `sync_train`'s measured wall time per update with the same settings.
Their difference is the runtime's overhead. Timed on whatever else the machine is doing, so
run it alone.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from typing import Any

import torch

from rlcore.backend import HFPolicy, TrainBatch
from rlcore.config import RunConfig
from rlcore.objectives import compute_advantages
from rlcore.reward import evaluate_response
from rlcore.runners.common import PromptStream, preflight, set_threads
from rlcore.runners.sync import sync_train


def bare_reinforce_ms(cfg: RunConfig, steps: int) -> float:
    """Mean milliseconds of one bare sample-reward-update step (after one warm-up step)."""
    tasks = preflight(cfg)
    set_threads(cfg)
    policy = HFPolicy(cfg.model, cfg.train, role="trainer")
    gen = torch.Generator().manual_seed(cfg.seed)
    stream = PromptStream(tasks, cfg.seed)
    ro = cfg.rollout
    groups = cfg.train.update_batch_size // ro.group_size
    t0 = 0.0
    for step in range(steps + 1):
        if step == 1:
            t0 = time.perf_counter()
        prompts = [p for p in stream.take(groups) for _ in range(ro.group_size)]
        gens = policy.generate([policy.encode_prompt(p.task.prompt) for p in prompts],
                               max_new_tokens=ro.max_new_tokens, temperature=ro.temperature,
                               chunk_tokens=ro.max_new_tokens, generator=gen)
        rewards = [evaluate_response(policy.decode_response(g.response_ids), p.task,
                                     cfg.reward.timeout_sec)["reward"]
                   for p, g in zip(prompts, gens, strict=True)]
        adv = compute_advantages(rewards, [str(p.group_id) for p in prompts],
                                 cfg.train.advantage_baseline, cfg.train.normalize_advantage)
        policy.update(TrainBatch([g.prompt_ids for g in gens], [g.response_ids for g in gens],
                                 [g.logprobs for g in gens], [g.versions for g in gens], adv),
                      temperature=ro.temperature, current_version=step)
    return 1000 * (time.perf_counter() - t0) / steps


def runner_ms(cfg: RunConfig, steps: int) -> tuple[float, dict[str, Any]]:
    """Mean milliseconds per update of sync_train (measured clock), and its summary."""
    cfg = dataclasses.replace(
        cfg, train=dataclasses.replace(cfg.train, updates=steps),
        runtime=dataclasses.replace(cfg.runtime, progress_every=0, save_policy=False))
    with tempfile.TemporaryDirectory() as tmp:
        summary = sync_train(cfg, tmp)
    return 1000 * summary["time"]["wall_s"] / steps, summary


def bench(cfg: RunConfig, steps: int) -> dict[str, Any]:
    """Floor and runner step times, the overhead between them, and throughput."""
    floor = bare_reinforce_ms(cfg, steps)
    runner, summary = runner_ms(cfg, steps)
    return {
        "steps": steps,
        "samples_per_step": cfg.train.update_batch_size,
        "threads_per_role": cfg.runtime.threads_per_role,
        "bench/bare_step_ms": floor,
        "bench/sync_step_ms": runner,
        "bench/overhead_ms": runner - floor,
        "bench/overhead_ratio": runner / floor,
        "bench/sync_samples_per_s": summary["metrics"]["samples_per_s"],
        "bench/sync_tokens_per_s": summary["metrics"]["tokens_per_s"],
    }
