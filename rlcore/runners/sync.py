"""`sync_train`: the synchronous baseline (paper §4).

Each step samples `update_batch_size` responses with the current policy, rewards them,
applies one update and bumps the policy version. Rollout and training never overlap, so
every sample has staleness 0 and is accepted; the measured busy spans show the barrier.
An update that applied no optimizer step (the fp16 loss scaler skipped every one) is a
skipped commit that bumps nothing, as in the asynchronous modes (`commit_verdict`), and, as
there, `train.updates` counts applied updates. Its schedule is fixed by the config and those
skips: batch b holds slots b*B .. b*B + B - 1 (b = v while no update was skipped).
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Any, cast

import torch

from rlcore.clock import Clock, clock_for
from rlcore.clock.virtual import VirtualClock
from rlcore.clock.work import Handle
from rlcore.config import RunConfig
from rlcore.errors import ConfigError
from rlcore.kernels import pin
from rlcore.policy.device import peak_gpu_bytes
from rlcore.policy.generation import generate
from rlcore.policy.hf_policy import HFPolicy
from rlcore.policy.optim_steps import commit_verdict, skipped_steps
from rlcore.policy.sampler import Draws, Generation
from rlcore.record.ledger import IN_PLACE_COMMIT, RunLedger
from rlcore.record.schedule import GenerationRecord, TrainerOp
from rlcore.runners.common import Progress, preflight, train_batch
from rlcore.tasks.prompts import Prompt, PromptStream
from rlcore.tasks.reward import RewardPool
from rlcore.tasks.suites import Task

# Both roles live in this one process; the names its spans and samples carry.
ROLLOUT, CONTROLLER, TRAINER = "rollout0", "controller", "trainer0"


def sync_train(cfg: RunConfig, out_dir: str | Path, force: bool = False) -> dict[str, Any]:
    """Run the synchronous loop until cfg.train.updates updates applied; returns the
    summary."""
    train_tasks = preflight(cfg)
    clock = clock_for(cfg.runtime, seed=cfg.seed, lora=cfg.train.lora)
    ledger = RunLedger(cfg, out_dir, force=force, clock=clock)
    rewards = RewardPool(cfg.reward, clock=clock)
    try:
        return _run(cfg, ledger, train_tasks, rewards, clock)
    finally:
        rewards.close()
        ledger.close()


def _run(cfg: RunConfig, ledger: RunLedger, train_tasks: list[Task], rewards: RewardPool,
         clock: Clock) -> dict[str, Any]:
    pin(cfg)
    torch.manual_seed(cfg.seed)
    t_load = clock.now()
    # One process holds both roles, so it uses the trainer's device (the paper's sync_train).
    policy = HFPolicy(cfg.model, cfg.train, role="trainer", clock=clock)
    policy.prepare_decoding([cfg.train.update_batch_size],
                            [(t.prompt, t.system) for t in train_tasks],
                            cfg.rollout.max_new_tokens)
    # on several devices (virtual clock only): an update of their ranks, priced as theirs
    policy.priced_ranks = cfg.runtime.trainer_ranks
    cold_start_s = clock.now() - t_load
    stream = PromptStream(train_tasks, cfg.seed)
    ro, groups = cfg.rollout, cfg.train.update_batch_size // cfg.rollout.group_size
    progress = Progress(cfg)
    waiting_for_data = 0.0  # the trainer idles while the batch is generated and scored

    ledger.start_clock()
    ledger.event("run_start", cold_start_s=cold_start_s)
    version = batch_id = 0  # the version counts applied updates, the batch every one
    while version < cfg.train.updates:  # the policy ends an endless run of skips
        prompts = [p for p in stream.take(groups) for _ in range(ro.group_size)]
        slots = [batch_id * len(prompts) + i for i in range(len(prompts))]
        t0 = ledger.now()
        clock.take_work()  # what came before the step is no span's
        gens, workers = _sample(cfg, policy, ledger, clock, prompts, slots, version)
        t1 = ledger.now()
        ledger.span("rollout", ROLLOUT, t0, t1, samples=len(gens), work=clock.take_work())
        texts = [policy.decode_response(g.response_ids) for g in gens]
        results = rewards.map(zip(texts, [p.task for p in prompts], strict=True))
        ids = []
        for p, g, text, result, s, w in zip(prompts, gens, texts, results, slots, workers,
                                            strict=True):
            ids.append(ledger.arrive(p, g, {"response": text, **result},
                                     current_version=version, slot=s, attempt=0,
                                     worker=w, t_emit=t1))
            rewards.admit(ids[-1], p, result)
        batch = train_batch([r["reward"] for r in results], [p.group_id for p in prompts],
                            gens, cfg)
        clock.charge(Handle(samples=len(ids)))
        t2 = ledger.now()
        ledger.span("controller", CONTROLLER, t1, t2, samples=len(ids),
                    work=clock.take_work())
        waiting_for_data += t2 - t0
        stats = policy.update(batch, temperature=ro.temperature, current_version=version)
        t3 = ledger.now()
        ledger.span("trainer", TRAINER, t2, t3, samples=len(ids), work=clock.take_work())
        ledger.count_skipped_steps(skipped_steps(stats))
        skip = commit_verdict(stats)
        for i, a in zip(ids, batch.advantages, strict=True):  # trained if the update applied
            ledger.settle(i, "accepted", current_version=version,
                          batch_id=batch_id if skip is None else None,
                          advantage=a if skip is None else None)
        if skip is None:
            ledger.event("version_change", old_version=version, new_version=version + 1,
                         batch_id=batch_id, trainer=0)
        else:
            ledger.event("commit_skipped", version=version, batch_id=batch_id, trainer=0,
                         reason=skip)
            ledger.event("update_skipped", batch_id=batch_id, trainer=0, reason=skip)
        ledger.trainer_steps([TrainerOp(0, batch_id, "update", version, batch_id=batch_id)])
        ledger.commit(batch_id=batch_id, trainer=0, base_version=version, sample_ids=ids,
                      outcome="applied" if skip is None else "skipped",
                      version=version + (skip is None), reason=skip or "")
        if skip is None:
            version += 1
            up = ledger.record_update(version, batch_id, ids, {**stats, **IN_PLACE_COMMIT},
                                      t_commit=t3)
            progress(version, up["pass_rate"], ledger.tokens["trained"], t3)
        batch_id += 1

    device = str(policy.device)
    return ledger.finish(
        policy, wall_s=ledger.now(), cold_start_s=cold_start_s,
        waits={"trainer_data_s": waiting_for_data, "trainer_ratio_s": 0.0,
               "rollout_throttle_s": 0.0, "rollout_ratio_s": 0.0},
        placement={"cpus": {}, "unpinned_reason": "sync runs both roles in one thread"},
        devices={"rollout": device, "trainer": device}, weight_transport="none", weight_bytes=0,
        gpu_peak_bytes={**dict.fromkeys(("rollout", "trainer"), peak_gpu_bytes(policy.device)),
                        "weight_slots": None})


def _sample(cfg: RunConfig, policy: HFPolicy, ledger: RunLedger, clock: Clock,
            prompts: list[Prompt], slots: list[int], version: int
            ) -> tuple[list[Generation], list[str]]:
    """Generate the batch, each sample's generation and the worker that made it: on one
    device, or on `runtime.trainer_ranks` devices side by side (the virtual clock only),
    device d generating groups d, d + N, ... as the ranks will train them."""
    ro, n = cfg.rollout, cfg.runtime.trainer_ranks
    shares = [[i for i in range(len(prompts)) if (i // ro.group_size) % n == d]
              for d in range(n)]
    gens: list[Generation | None] = [None] * len(prompts)
    workers = [ROLLOUT] * len(prompts)
    if n > 1 and not isinstance(clock, VirtualClock):
        raise ConfigError(f"sync on {n} devices (runtime.trainer_ranks) runs on the virtual "
                          "clock only: set runtime.clock to virtual")
    lanes = clock.side_by_side() if isinstance(clock, VirtualClock) and n > 1 else None
    with lanes if lanes is not None else nullcontext(lambda: None) as next_device:
        for d, mine in enumerate(shares):
            if d:
                next_device()
            sampler = policy.sampler([policy.encode_prompt(prompts[i].task.prompt,
                                                           prompts[i].task.system)
                                      for i in mine],
                                     max_new_tokens=ro.max_new_tokens,
                                     temperature=ro.temperature,
                                     draws=Draws(cfg.seed, [(slots[i], 0) for i in mine]),
                                     version=version)
            ledger.count_tokens(
                sampled=generate(sampler, ro.chunk_tokens, cfg.staleness.interrupt).sampled)
            worker = ROLLOUT if n == 1 else f"rollout{d}"
            ledger.generation(GenerationRecord(worker, [(slots[i], 0, prompts[i].group_id)
                                                        for i in mine],
                                               version, chunks=sampler.chunks))
            for j, i in enumerate(mine):
                gens[i], workers[i] = sampler.gens[j], worker
    assert all(g is not None for g in gens)
    return cast(list[Generation], gens), workers
