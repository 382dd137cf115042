"""`sync_train`: the synchronous baseline (paper §4).

Each step samples `update_batch_size` responses with the current policy, rewards them,
applies one update and bumps the policy version. Rollout and training never overlap, so
every sample has staleness 0 and is accepted; the measured busy spans show the barrier.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from rlcore.backend import HFPolicy
from rlcore.config import RunConfig
from rlcore.records import RunRecorder
from rlcore.reward import RewardPool
from rlcore.runners.common import (
    Progress,
    PromptStream,
    build_summary,
    finish_run,
    preflight,
    sample_row,
    set_threads,
    train_batch,
    update_row,
)
from rlcore.tasks import Task


def sync_train(cfg: RunConfig, out_dir: str | Path, force: bool = False) -> dict[str, Any]:
    """Run the synchronous loop for cfg.train.updates updates; returns the summary."""
    train_tasks = preflight(cfg)
    rec = RunRecorder(out_dir, force=force)
    rewards = RewardPool(cfg.reward)
    try:
        return _run(cfg, rec, train_tasks, rewards)
    finally:
        rewards.close()
        rec.close()


def _run(cfg: RunConfig, rec: RunRecorder, train_tasks: list[Task], rewards: RewardPool
         ) -> dict[str, Any]:
    set_threads(cfg)
    torch.manual_seed(cfg.seed)
    t_load = time.perf_counter()
    # One process holds both roles, so it uses the trainer's device (the paper's sync_train).
    policy = HFPolicy(cfg.model, cfg.train, role="trainer")
    cold_start_s = time.perf_counter() - t_load
    gen = torch.Generator(device=policy.device).manual_seed(cfg.seed)
    stream = PromptStream(train_tasks, cfg.seed)
    ro, groups = cfg.rollout, cfg.train.update_batch_size // cfg.rollout.group_size
    progress = Progress(cfg)
    samples: list[dict[str, Any]] = []
    updates: list[dict[str, Any]] = []
    busy = {"rollout": 0.0, "reward": 0.0, "trainer": 0.0}
    token_staleness: dict[str, list[int]] = {"accepted": []}
    tokens = 0  # counted by the sampler, independently of the sample rows

    rec.start_clock()
    rec.event("run_start", cold_start_s=cold_start_s)
    for version in range(cfg.train.updates):
        prompts = [p for p in stream.take(groups) for _ in range(ro.group_size)]
        t0 = rec.now()
        sampler = policy.sampler([policy.encode_prompt(p.task.prompt) for p in prompts],
                                 max_new_tokens=ro.max_new_tokens, temperature=ro.temperature,
                                 generator=gen, version=version)
        while not sampler.done:
            tokens += sampler.step(ro.chunk_tokens)
        gens = sampler.gens
        t1 = rec.now()
        rec.event("span", worker="rollout", start=t0, end=t1)
        rows = []
        texts = [policy.decode_response(g.response_ids) for g in gens]
        results = rewards.map(zip(texts, [p.task for p in prompts], strict=True))
        for p, g, text, result in zip(prompts, gens, texts, results, strict=True):
            row = sample_row(len(samples), p, g, {"response": text, **result}, version,
                             "accepted", t_emit=t1)
            samples.append(row)
            rows.append(row)
            rec.sample(row)
            token_staleness["accepted"] += [version - v for v in g.versions]
        t2 = rec.now()
        rec.event("span", worker="reward", start=t1, end=t2)
        stats = policy.update(train_batch(rows, gens, cfg), temperature=ro.temperature,
                              current_version=version)
        t3 = rec.now()
        rec.event("span", worker="trainer", start=t2, end=t3)
        rec.event("version_change", old_version=version, new_version=version + 1)
        up = update_row(version + 1, version, rows, stats, t_commit=t3)
        updates.append(up)
        rec.update(up)
        busy["rollout"] += t1 - t0
        busy["reward"] += t2 - t1
        busy["trainer"] += t3 - t2
        progress(version + 1, up["pass_rate"], tokens, t3)

    wall_s = rec.now()
    summary = build_summary(cfg, samples=samples, updates=updates, wall_s=wall_s,
                            cold_start_s=cold_start_s, busy=busy, overlap_s=0.0,
                            tokens_sampled=tokens)
    return finish_run(rec, policy, cfg, summary, samples, token_staleness,
                      {"devices": {"rollout": str(policy.device), "trainer": str(policy.device)}})
