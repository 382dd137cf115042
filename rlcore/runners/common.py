"""What every runner shares: the prompt stream, sample rows, training batches, the summary.

The three runners differ only in scheduling; everything a sample goes through between the
sampler and the optimizer is here, once.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlcore import metrics
from rlcore.backend import Generation, HFPolicy, TrainBatch, check_model_dir
from rlcore.config import RunConfig
from rlcore.objectives import compute_advantages
from rlcore.records import RunRecorder, environment_info
from rlcore.sandbox import detect_isolation
from rlcore.tasks import Task, load_suite


def preflight(cfg: RunConfig) -> list[Task]:
    """Check what a run reads before anything is written; returns the training tasks."""
    check_model_dir(cfg.model.path)
    tasks = load_suite(cfg.task).split("train")
    if any(t.kind == "code" for t in tasks):
        detect_isolation(cfg.reward)  # no usable sandbox: fail now, not at the first reward
    return tasks


def set_threads(cfg: RunConfig) -> None:
    """The per-role CPU thread budget, the same in every mode so that modes are matched."""
    torch.set_num_threads(cfg.runtime.threads_per_role)


@dataclass(frozen=True)
class Prompt:
    """One dispatched prompt: a task and the id of its group of samples."""

    group_id: int
    task: Task


class PromptStream:
    """Training prompts in seeded epochs of shuffled order, identical across runners."""

    def __init__(self, tasks: Sequence[Task], seed: int):
        self._tasks = list(tasks)
        self._rng = random.Random(seed)
        self._prompts = self._epochs()

    def _epochs(self) -> Iterator[Prompt]:
        group_id = 0
        while True:
            order = list(self._tasks)
            self._rng.shuffle(order)
            for task in order:
                yield Prompt(group_id, task)
                group_id += 1

    def take(self, n: int) -> list[Prompt]:
        """The next n prompts."""
        return [next(self._prompts) for _ in range(n)]


def sample_row(sample_id: int, prompt: Prompt, gen: Generation, scored: dict[str, Any],
               current_version: int, status: str, t_emit: float, **extra: Any
               ) -> dict[str, Any]:
    """One line of samples.jsonl. Fields starting with t_ are timings; the rest is determined.

    `policy_version` is the version of the oldest token (see the controller's docstring).
    """
    rollout_version = min(gen.versions) if gen.versions else current_version
    return {
        "sample_id": sample_id,
        "task_id": prompt.task.task_id,
        "group_id": prompt.group_id,
        "policy_version": rollout_version,
        "policy_version_max": max(gen.versions) if gen.versions else current_version,
        "current_version": current_version,
        "staleness": max(0, current_version - rollout_version),
        "status": status,
        "reward": scored["reward"],
        "pass": scored["pass"],
        "response": scored["response"],
        "response_tokens": len(gen.response_ids),
        "finished": gen.finished,
        "logprob_sum": sum(gen.logprobs),
        # code tasks: how many tests passed, and the first failure (None when all passed)
        **{k: scored[k] for k in ("tests_passed", "error") if k in scored},
        **extra,
        "t_emit": t_emit,
    }


def train_batch(rows: Sequence[dict[str, Any]], gens: Sequence[Generation], cfg: RunConfig
                ) -> TrainBatch:
    """Advantages (reward minus the configured baseline) and tensors-to-be for an update."""
    adv = compute_advantages(
        [r["reward"] for r in rows], [str(r["group_id"]) for r in rows],
        cfg.train.advantage_baseline, cfg.train.normalize_advantage,
    )
    return TrainBatch(
        prompt_ids=[g.prompt_ids for g in gens],
        response_ids=[g.response_ids for g in gens],
        behav_logprobs=[g.logprobs for g in gens],
        versions=[g.versions for g in gens],
        advantages=adv,
    )


def update_row(version: int, batch_id: int, rows: Sequence[dict[str, Any]],
               stats: dict[str, float], t_commit: float) -> dict[str, Any]:
    """One line of updates.jsonl: the commit that produced `version`."""
    return {
        "version": version,
        "batch_id": batch_id,
        "sample_ids": [r["sample_id"] for r in rows],
        "reward_mean": sum(r["reward"] for r in rows) / len(rows),
        "pass_rate": sum(r["pass"] for r in rows) / len(rows),
        "staleness_mean": sum(r["staleness"] for r in rows) / len(rows),
        "staleness_max": max(r["staleness"] for r in rows),
        "tokens": sum(r["response_tokens"] for r in rows),
        **stats,
        "t_commit": t_commit,
    }


class Progress:
    """A one-line progress report every `every` updates, on stderr."""

    def __init__(self, cfg: RunConfig):
        self.every = cfg.runtime.progress_every
        self.total = cfg.train.updates
        self.tag = f"[{cfg.mode} {cfg.train.objective} k{cfg.staleness.staleness_k} s{cfg.seed}]"

    def __call__(self, version: int, pass_rate: float, tokens: int, elapsed: float) -> None:
        """`tokens`: generated (sync) or trained (async: the controller sees only those)."""
        if self.every and (version % self.every == 0 or version == self.total):
            print(f"{self.tag} update {version}/{self.total} | batch pass {pass_rate:.2f} | "
                  f"{tokens / max(elapsed, 1e-9):.0f} tok/s | {elapsed:.1f}s",
                  file=sys.stderr, flush=True)


def build_summary(cfg: RunConfig, *, samples: Sequence[dict[str, Any]],
                  updates: Sequence[dict[str, Any]], wall_s: float, cold_start_s: float,
                  busy: dict[str, float], overlap_s: float, tokens_sampled: int,
                  resubmissions: int = 0, interrupted_tokens: int = 0,
                  abandoned_tokens: int = 0, reprefilled_tokens: int = 0,
                  extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """summary.json from the per-sample and per-update rows of a finished run.

    `tokens_sampled` is counted by the samplers themselves, so the ledger
    generated = trained + stale_dropped + interrupted + untrained is a real check.
    """
    trained_ids = {i for u in updates for i in u["sample_ids"]}
    by_status = {s: [r for r in samples if r["status"] == s]
                 for s in ("accepted", "dropped_stale", "dropped_interrupted")}
    trained = [r for r in by_status["accepted"] if r["sample_id"] in trained_ids]
    untrained = [r for r in by_status["accepted"] if r["sample_id"] not in trained_ids]
    tok = {
        "trained": sum(r["response_tokens"] for r in trained),
        "stale_dropped": sum(r["response_tokens"] for r in by_status["dropped_stale"]),
        "interrupted": interrupted_tokens,
        "untrained": sum(r["response_tokens"] for r in untrained) + abandoned_tokens,
    }
    generated_tokens = tokens_sampled
    total_reward = sum(r["reward"] for r in samples if r["status"] != "dropped_interrupted")
    pass_curve = [u["pass_rate"] for u in updates]
    window = cfg.eval.window
    emitted = len(samples) - len(by_status["dropped_interrupted"])
    summary = {
        "schema_version": 1,
        "mode": cfg.mode,
        "objective": cfg.train.objective,
        "staleness_k": cfg.staleness.staleness_k,
        "seed": cfg.seed,
        "updates": len(updates),
        "policy_version": updates[-1]["version"] if updates else 0,
        "samples": {
            "generated": len(samples),
            "accepted": len(by_status["accepted"]),
            "trained": len(trained),
            "dropped_stale": len(by_status["dropped_stale"]),
            "dropped_interrupted": len(by_status["dropped_interrupted"]),
            "resubmissions": resubmissions,
        },
        "tokens": {"generated": generated_tokens, **tok, "reprefilled": reprefilled_tokens},
        "time": {
            "wall_s": wall_s,
            "cold_start_s": cold_start_s,
            "rollout_busy_s": busy.get("rollout", 0.0),
            "reward_s": busy.get("reward", 0.0),
            "trainer_busy_s": busy.get("trainer", 0.0),
            "overlap_frac": min(1.0, overlap_s / wall_s) if wall_s else 0.0,
        },
        "metrics": {
            "train_pass_rate": sum(r["pass"] for r in trained) / max(len(trained), 1),
            "train_pass_rate_final": metrics.moving_average(pass_curve, window)[-1]
            if pass_curve else 0.0,
            "reward_per_1k_tokens": metrics.reward_per_1k_tokens(total_reward, generated_tokens),
            "threshold": cfg.eval.threshold,
            "time_to_threshold_s": metrics.time_to_threshold(
                [u["t_commit"] for u in updates], pass_curve, cfg.eval.threshold, window),
            "samples_per_s": len(samples) / wall_s if wall_s else 0.0,
            "accepted_samples_per_s": len(by_status["accepted"]) / wall_s if wall_s else 0.0,
            "tokens_per_s": generated_tokens / wall_s if wall_s else 0.0,
            "acceptance_rate": len(by_status["accepted"]) / emitted if emitted else 0.0,
        },
        "staleness": {
            "mean_accepted": sum(r["staleness"] for r in by_status["accepted"])
            / max(len(by_status["accepted"]), 1),
            "max_accepted": max((r["staleness"] for r in by_status["accepted"]), default=0),
        },
    }
    return {**summary, **(extra or {})}


def staleness_stats(samples: Sequence[dict[str, Any]], token_staleness: dict[str, list[int]]
                    ) -> dict[str, Any]:
    """staleness.json: histograms per sample and per token, for accepted and dropped samples."""
    return {
        "per_sample": {
            "accepted": metrics.histogram(r["staleness"] for r in samples
                                          if r["status"] == "accepted"),
            "dropped_stale": metrics.histogram(r["staleness"] for r in samples
                                               if r["status"] == "dropped_stale"),
        },
        "per_token": {k: metrics.histogram(v) for k, v in token_staleness.items()},
    }


def finish_run(rec: RunRecorder, policy: HFPolicy, cfg: RunConfig, summary: dict[str, Any],
               samples: Sequence[dict[str, Any]], token_staleness: dict[str, list[int]],
               extra_config: dict[str, Any]) -> dict[str, Any]:
    """Save the final policy, then finalize the run directory (summary.json last)."""
    if cfg.runtime.save_policy:
        policy.save(rec.stage_dir("policy"))
    base_info = Path(cfg.model.path) / "rlcore_base.json"
    config_json = {
        "config": cfg.to_dict(),
        "environment": environment_info(),
        "base_model": _read_json(base_info) if base_info.is_file() else None,
        **extra_config,
    }
    if any("tests_passed" in s for s in samples):  # code was run: say what isolated it
        config_json["sandbox"] = detect_isolation(cfg.reward).describe()
    rec.finalize(summary, {"staleness.json": staleness_stats(samples, token_staleness),
                           "config.json": config_json},
                 dirs=("policy",) if cfg.runtime.save_policy else ())
    return summary


def _read_json(path: Path) -> Any:
    import json

    return json.loads(path.read_text())
