"""Held-out evaluation of a policy: greedy and sampled pass rates (`rlcore eval`)."""

from __future__ import annotations

import time
from typing import Any

import torch

from rlcore.backend import HFPolicy
from rlcore.config import RunConfig
from rlcore.reward import evaluate_response
from rlcore.tasks import Task


def evaluate_policy(policy: HFPolicy, tasks: list[Task], cfg: RunConfig, seed: int
                    ) -> dict[str, Any]:
    """Pass rates on `tasks`: greedy (one response each) and sampled (samples_per_task each)."""
    start = time.perf_counter()
    ev, ro = cfg.eval, cfg.rollout
    gen = torch.Generator(device=policy.device).manual_seed(seed)
    prompts = [policy.encode_prompt(t.prompt) for t in tasks]
    greedy_pass = 0
    sampled_pass = 0
    per_task = []
    for lo in range(0, len(tasks), ev.batch_size):
        chunk, ids = tasks[lo : lo + ev.batch_size], prompts[lo : lo + ev.batch_size]
        greedy = policy.greedy(ids, ro.max_new_tokens)
        repeated = [p for p in ids for _ in range(ev.samples_per_task)]
        sampled = policy.generate(repeated, max_new_tokens=ro.max_new_tokens,
                                  temperature=ro.temperature, chunk_tokens=ro.max_new_tokens,
                                  generator=gen)
        for i, task in enumerate(chunk):
            g_ok = evaluate_response(policy.decode_response(greedy[i]), task,
                                     cfg.reward.timeout_sec)["pass"]
            s_ok = sum(
                evaluate_response(policy.decode_response(s.response_ids), task,
                                  cfg.reward.timeout_sec)["pass"]
                for s in sampled[i * ev.samples_per_task : (i + 1) * ev.samples_per_task]
            )
            greedy_pass += g_ok
            sampled_pass += s_ok
            per_task.append({"task_id": task.task_id, "greedy_pass": bool(g_ok),
                             "sampled_passes": int(s_ok)})
    n = len(tasks)
    return {
        "tasks": n,
        "samples_per_task": ev.samples_per_task,
        "greedy_pass_rate": greedy_pass / n,
        "sampled_pass_rate": sampled_pass / (n * ev.samples_per_task),
        "eval_s": time.perf_counter() - start,
        "per_task": per_task,
    }
