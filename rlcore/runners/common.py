"""What every runner shares besides the ledger: checks, the prompt stream, training batches.

The three runners differ only in scheduling; what a sample goes through between the sampler
and the optimizer is here and in `rlcore/record/ledger.py`, once.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from rlcore.algo.advantages import compute_advantages
from rlcore.config import RunConfig
from rlcore.policy.device import resolve_device
from rlcore.policy.lora import model_targets
from rlcore.policy.model_dir import base_mismatch_warning, check_model_dir
from rlcore.policy.sampler import Generation
from rlcore.policy.train_batch import TrainBatch
from rlcore.tasks.reward import check_suite
from rlcore.tasks.sandbox import detect_isolation
from rlcore.tasks.suites import Task


def preflight(cfg: RunConfig) -> list[Task]:
    """Check what a run reads before anything is written; returns the training tasks."""
    check_model_dir(cfg.model.path)
    if cfg.train.lora is not None:  # a target the model lacks, a rank above a layer's width
        model_targets(cfg.model.path, cfg.train.lora)
    # a device this machine lacks, or a GPU the installed torch has no kernels for
    for role in ("trainer",) if cfg.mode == "sync" else ("rollout", "trainer"):
        resolve_device(getattr(cfg.model, f"{role}_device"), role)
    tasks = check_suite(cfg.task, cfg.reward).split("train")
    if cfg.reward.verifier == "code":
        detect_isolation(cfg.reward)  # no usable sandbox: fail now, not at the first reward
    # after the checks, so that a config's error is what a failed start shows first
    if warning := base_mismatch_warning(cfg.model.path, cfg.to_dict()["task"]):
        print(warning, file=sys.stderr)
    return tasks


def train_batch(rewards: Sequence[float], group_ids: Sequence[int],
                gens: Sequence[Generation], cfg: RunConfig) -> TrainBatch:
    """Advantages (reward minus the configured baseline) and tensors-to-be for an update."""
    adv = compute_advantages(rewards, [str(g) for g in group_ids],
                             cfg.train.advantage_baseline, cfg.train.normalize_advantage)
    return TrainBatch(
        prompt_ids=[g.prompt_ids for g in gens],
        response_ids=[g.response_ids for g in gens],
        behav_logprobs=[g.logprobs for g in gens],
        versions=[g.versions for g in gens],
        advantages=adv,
        group_ids=list(group_ids),
    )


class Progress:
    """A one-line progress report every `every` updates, on stderr."""

    def __init__(self, cfg: RunConfig):
        self.every = cfg.runtime.progress_every
        self.total = cfg.train.updates
        self.tag = f"[{cfg.mode} {cfg.train.objective} k{cfg.staleness.staleness_k} s{cfg.seed}]"

    def __call__(self, version: int, pass_rate: float, trained_tokens: int, elapsed: float
                 ) -> None:
        if self.every and (version % self.every == 0 or version == self.total):
            print(f"{self.tag} update {version}/{self.total} | batch pass {pass_rate:.2f} | "
                  f"{trained_tokens / max(elapsed, 1e-9):.0f} trained tok/s | {elapsed:.1f}s",
                  file=sys.stderr, flush=True)
