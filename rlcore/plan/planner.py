"""`rlcore plan`: what a run of a config would do on a hardware profile, without a model.

The planner runs the asynchronous run's live roles with the model taken out (`roles.py`) on
the virtual clock, priced by the profile, with response lengths drawn from `lengths.py`;
sync's time is the sum of the same prices in sync's order (`rlcore/runners/sync.py`). It
reports the figures of `rlcore/record/timing.py`, plus the speed-up over sync and each role's
idle time: enough to ask "would async help on this hardware, and at which K?" before a GPU
hour is spent.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from rlcore.algo.batching import slowest_rank_tokens
from rlcore.algo.registry import objective
from rlcore.clock.profile import HardwareProfile, LoraView, load_profile
from rlcore.clock.virtual import VirtualClock
from rlcore.clock.work import AllReduce, Handle, Prefill, Reward, Update, Work
from rlcore.config import RunConfig
from rlcore.errors import ConfigError
from rlcore.plan.controller import PlanController
from rlcore.plan.lengths import Lengths, geometric
from rlcore.plan.roles import Plan
from rlcore.plan.sampler import LengthPolicy
from rlcore.policy.generation import generate
from rlcore.policy.sampler import Draws
from rlcore.record.summary import profile_mismatch
from rlcore.record.timing import stale_drop_rate, wasted_token_share
from rlcore.runners.asynchronous.layout import GIB, ModelSize, role_bytes
from rlcore.tasks.prompts import PromptStream
from rlcore.tasks.suites import Task


@dataclass(frozen=True)
class Workload:
    """What a plan draws its work from: the training prompts, their token counts, and the
    response lengths."""

    tasks: list[Task]
    prompt_tokens: dict[str, int]
    lengths: Lengths
    trainable_bytes: int  # of the config's model: a weight copy's size unless the profile sets it
    adapter_elements: int  # the config's model's LoRA adapters (0: no train.lora)


def workload(cfg: RunConfig, lengths: Lengths | None = None) -> Workload:
    """The config's training prompts tokenized by its model's tokenizer, and `lengths` (by
    default a geometric distribution with half of `rollout.max_new_tokens` as its mean)."""
    from rlcore.policy.loading import encode_prompt, load_tokenizer
    from rlcore.policy.lora import adapter_elements, model_targets
    from rlcore.policy.model_dir import check_model_dir
    from rlcore.runners.asynchronous.weight_slots import spec_bytes, trainable_spec
    from rlcore.tasks.suites import load_suite

    path = check_model_dir(cfg.model.path)
    tasks = load_suite(cfg.task).split("train")
    tokenizer = load_tokenizer(path)
    chat = cfg.model.prompt_format == "chat"
    prompt_tokens = {t.prompt: len(encode_prompt(tokenizer, t.prompt, chat=chat,
                                                      system=t.system))
                     for t in tasks}
    max_new = cfg.rollout.max_new_tokens
    if lengths is None:
        lengths = geometric(max(1.0, max_new / 2), max_new,
                            f"assumed: geometric, mean {max(1.0, max_new / 2):g} tokens "
                            "(give --lengths RUN_DIR for measured ones)")
    lora = cfg.train.lora
    chosen = model_targets(path, lora) if lora is not None else []
    return Workload(tasks, prompt_tokens, lengths.capped(max_new),
                    spec_bytes(trainable_spec(str(path), lora)),
                    adapter_elements(chosen, lora.rank) if lora is not None else 0)


def weight_bytes(profile: HardwareProfile, work: Workload) -> int:
    return profile.model_bytes if profile.model_bytes is not None else work.trainable_bytes


def plan_sync(cfg: RunConfig, work: Workload, profile: HardwareProfile, devices: int = 1
              ) -> dict[str, Any]:
    """Sync's seconds and tokens for `cfg.train.updates` updates: generate, score, train, in
    turn, as `sync_train` does, each step at its price. On `devices` > 1 devices, as AReaL
    compares at equal GPUs: each generates its share of the batch's groups at once, then
    each trains its share as a data-parallel rank (the slowest rank's tokens and a gradient
    sum per step); the weights stay where they are, so nothing is copied."""
    total = {"s": 0.0}

    def charge(w: Work) -> None:
        total["s"] += profile.seconds(w)

    ro, b = cfg.rollout, cfg.train.update_batch_size
    # each device's sampling seconds of the current batch (one device: charged in turn)
    shares = [{"s": 0.0} for _ in range(devices)]

    def on_device(t: dict[str, float]) -> Callable[[Work], None]:
        return charge if devices == 1 else (
            lambda w: t.__setitem__("s", t["s"] + profile.seconds(w)))

    policies = [LengthPolicy(on_device(t), work.tasks, work.prompt_tokens, work.lengths,
                             work.adapter_elements, profile.prices_captured_steps)
                for t in shares]
    stream = PromptStream(work.tasks, cfg.seed)
    sampled = trained = 0
    for version in range(cfg.train.updates):
        groups = stream.take(b // ro.group_size)
        prompts = [p for p in groups for _ in range(ro.group_size)]
        first = version * len(prompts)
        lengths: list[int] = []
        for t in shares:
            t["s"] = 0.0
        for d, policy in enumerate(policies):  # device d: groups d, d + devices, ...
            mine = [i for i in range(len(prompts)) if (i // ro.group_size) % devices == d]
            if not mine:
                continue
            sampler = policy.sampler([policy.encode_prompt(prompts[i].task.prompt,
                                                           prompts[i].task.system)
                                      for i in mine],
                                     max_new_tokens=ro.max_new_tokens,
                                     temperature=ro.temperature,
                                     draws=Draws(cfg.seed, [(first + i, 0) for i in mine]))
            sampled += generate(sampler, ro.chunk_tokens, cfg.staleness.interrupt).sampled
            for j, i in enumerate(mine):
                lengths.append(work.prompt_tokens[prompts[i].task.prompt] + sampler.length(j))
                trained += sampler.length(j)
        if devices > 1:  # the devices sample at once: the batch is ready with the last
            total["s"] += max(t["s"] for t in shares)
        for _ in prompts:
            charge(Reward(kind=cfg.reward.verifier))
        charge(Handle(samples=len(prompts)))
        if objective(cfg.train.objective).needs_prox:
            charge(Prefill(calls=1, tokens=len(lengths) * max(lengths)))
        lora = cfg.train.lora is not None
        if devices == 1:
            charge(Update(tokens=slowest_rank_tokens(lengths, cfg.train.minibatches),
                          frozen_base=lora))
        else:
            order = sorted(range(len(prompts)),
                           key=lambda i: ((i // ro.group_size) % devices, i))
            charge(Update(tokens=slowest_rank_tokens(
                lengths, cfg.train.minibatches, devices,
                [i // ro.group_size for i in order],
                [lengths[k] - work.prompt_tokens[prompts[i].task.prompt]
                 for k, i in enumerate(order)]), frozen_base=lora))
            charge(AllReduce(calls=cfg.train.minibatches, nbytes=weight_bytes(profile, work),
                             ranks=devices))
    wall = total["s"]
    return {"wall_s": wall, "updates_per_s": cfg.train.updates / wall if wall else 0.0,
            "accepted_samples_per_s": cfg.train.updates * b / wall if wall else 0.0,
            "tokens_generated": sampled, "tokens_trained": trained}


def plan_async(cfg: RunConfig, work: Workload, profile: HardwareProfile) -> dict[str, Any]:
    """An asynchronous run of `cfg` (areal or async mode) on the virtual clock."""
    clock = VirtualClock(profile, seed=cfg.seed, shared_interpreter=cfg.mode == "async")
    p = Plan(cfg, clock, work.tasks, work.prompt_tokens, work.lengths,
             weight_bytes(profile, work), work.adapter_elements)
    controller = PlanController(p)
    try:
        p.launch()
        wall = p.drive(controller)
        p.stop(controller)
    finally:
        p.shutdown()
    t = p.tally
    accepted = t.accepted + controller.unsettled()
    samples = len(accepted) + t.dropped_stale + t.dropped_interrupted
    busy = clock.charged_by_role()
    return {
        "wall_s": wall,
        "updates_per_s": cfg.train.updates / wall if wall else 0.0,
        "accepted_samples_per_s": len(accepted) / wall if wall else 0.0,
        "stale_drop_rate": stale_drop_rate(samples, t.dropped_stale, t.dropped_interrupted),
        "wasted_token_share": wasted_token_share(t.tokens_sampled, t.tokens_trained),
        "staleness": {str(k): n for k, n in sorted(Counter(accepted).items())},
        "samples": {"generated": samples, "accepted": len(accepted),
                    "dropped_stale": t.dropped_stale,
                    "dropped_interrupted": t.dropped_interrupted,
                    "resubmissions": t.resubmissions},
        "skipped_commits": t.skipped_commits,
        "tokens_generated": t.tokens_sampled,
        "tokens_trained": t.tokens_trained,
        "tokens_reprefilled": t.tokens_reprefilled,
        "idle_s": {r: max(0.0, wall - busy[r]) for r in sorted(busy) if r != "controller"},
        "charged_s": {k: clock.charged[k] for k in sorted(clock.charged)},
        "waits": controller.waits,
    }


def plan(cfg: RunConfig, work: Workload, profile: HardwareProfile | None = None,
         sync_devices: int = 1) -> dict[str, Any]:
    """A plan of `cfg` on `profile` (default: `runtime.hardware`): the async figures (sync's
    for a sync config), with sync's time beside them (on `sync_devices` devices) and the
    planner's own seconds, and where the config would decode or copy otherwise than the
    profile priced (`profile_mismatch`)."""
    t0 = time.perf_counter()
    whole = profile or load_profile(cfg.runtime.hardware)
    profile = whole.under(cfg.train.lora)
    # sync's batch is always B: a device for each group of a minibatch, at most
    fed = max(1, cfg.train.update_batch_size // cfg.train.minibatches // cfg.rollout.group_size)
    if cfg.mode == "sync":  # a sync config's own devices, as its virtual run has them
        sync_devices = max(sync_devices, cfg.runtime.trainer_ranks)
    sync_devices = min(sync_devices, fed)
    profile.check_ranks(max(cfg.runtime.trainer_ranks, sync_devices))
    sync = plan_sync(cfg, work, profile, sync_devices)
    if cfg.mode == "sync":
        out = {**sync, "stale_drop_rate": 0.0,
               "wasted_token_share": wasted_token_share(sync["tokens_generated"],
                                                        sync["tokens_trained"]),
               "staleness": {"0": cfg.train.updates * cfg.train.update_batch_size}}
    else:
        out = plan_async(cfg, work, profile)
    return {"mode": cfg.mode, "hardware": profile.name, "lengths": work.lengths.source,
            "profile_mismatch": profile_mismatch(cfg, profile),
            **out, "sync_wall_s": sync["wall_s"], "sync_devices": sync_devices,
            "speedup_vs_sync": sync["wall_s"] / out["wall_s"] if out["wall_s"] else 0.0,
            "memory_gib": device_memory_gib(cfg, work, whole, profile.lora_view),
            "plan_s": time.perf_counter() - t0}


def device_memory_gib(cfg: RunConfig, work: Workload, profile: HardwareProfile,
                      view: LoraView | None) -> dict[str, float] | None:
    """GiB a rollout worker and a trainer rank each hold on a GPU of their own for the
    profile's model (`rlcore/runners/asynchronous/layout.py::role_bytes`; sync on a device
    holds both), `view` the profile as a LoRA run sees it; None where the profile gives no
    model size or KV cache."""
    if profile.model_bytes is None or profile.kv_bytes_per_position is None:
        return None
    params = profile.model_bytes // 4
    trainable = params if cfg.train.lora is None else (
        view.adapter_elements if view is not None and view.adapter_elements is not None
        else work.adapter_elements)
    needs = role_bytes(ModelSize(params, trainable, profile.kv_bytes_per_position), cfg,
                       max(work.prompt_tokens.values(), default=0), 0)
    return {role: sum(needs[role].values()) / GIB for role in ("rollout", "trainer")}


def plan_sweep(cfgs: list[RunConfig], key: str, values: list[str | None],
               lengths: list[Lengths | None], sync_devices: int = 1) -> list[dict[str, Any]]:
    """One plan per config of a sweep, labelled `key`: the value (the mode without a sweep),
    each with its own lengths; the prompts and the model are read once unless the sweep
    changes them."""
    works: dict[str, Workload] = {}
    plans = []
    for cfg, value, own in zip(cfgs, values, lengths, strict=True):
        k = repr((cfg.task, cfg.model, cfg.rollout.max_new_tokens, cfg.train.lora))
        if k not in works:
            works[k] = workload(cfg, own)
        work = works[k] if own is None else \
            replace(works[k], lengths=own.capped(cfg.rollout.max_new_tokens))
        plans.append({key: value if value is not None else cfg.mode,
                      **plan(cfg, work, sync_devices=sync_devices)})
    return plans


SPLIT = "rollout+trainer"  # a split's label in a plan: rollout workers + trainer ranks


def splits(gpus: int) -> list[tuple[int, int]]:
    """Every split of `gpus` devices into R rollout workers and M trainer ranks, a device
    each, R and M at least 1."""
    return [(r, gpus - r) for r in range(1, gpus)]


def split_settings(rollout: int, trainer: int) -> list[str]:
    """The overrides that make a config AReaL-style on this split."""
    return ["mode=areal", f"runtime.rollout_workers={rollout}",
            f"runtime.trainer_ranks={trainer}", "runtime.trainer_workers=1"]


def pick(plans: list[dict[str, Any]], gpus: int) -> dict[str, Any]:
    """The split with the most updates/s (the fewer trainer ranks on a tie); each plan gains
    its GPU-seconds per update on `gpus` devices."""
    for p in plans:
        p["gpu_s_per_update"] = gpus / p["updates_per_s"] if p["updates_per_s"] else math.inf
    return max(plans, key=lambda p: (p["updates_per_s"], -int(p[SPLIT].split("+")[1])))


def sweep_values(spec: str) -> tuple[str, list[str]]:
    """`key=v1,v2,...` -> (key, values)."""
    key, sep, values = spec.partition("=")
    if not sep or not key or not values:
        raise ConfigError(f"--sweep {spec!r}: write it as key=v1,v2,... "
                          "(e.g. staleness.staleness_k=0,1,2,4,8)")
    return key, [v for v in values.split(",") if v]


def table(plans: list[dict[str, Any]], label: str) -> str:
    """The plans as a text table, one row each, labelled by the `label` entry."""
    head = (f"{label:>14} {'updates/s':>10} {'accepted/s':>11} {'vs sync':>8} "
            f"{'drop rate':>10} {'wasted tok':>11} {'staleness (share by K)':<26} "
            f"{'idle: rollout/trainer s':>24} {'GiB/GPU r/t':>12} {'plan s':>7}")
    lines = [head]
    for r in plans:
        n = sum(r["staleness"].values()) or 1
        hist = " ".join(f"{k}:{v / n:.2f}" for k, v in r["staleness"].items())
        idle = r.get("idle_s", {})
        idle_txt = "/".join(f"{sum(v for k, v in idle.items() if k.startswith(role)):.2f}"
                            for role in ("rollout", "trainer")) if idle else "-"
        lines.append(f"{str(r[label]):>14} {r['updates_per_s']:>10.2f} "
                     f"{r['accepted_samples_per_s']:>11.1f} {r['speedup_vs_sync']:>7.2f}x "
                     f"{r['stale_drop_rate']:>10.3f} {r['wasted_token_share']:>11.3f} "
                     f"{hist:<26} {idle_txt:>24} {memory_text(r.get('memory_gib')):>12} "
                     f"{r['plan_s']:>7.3f}")
    return "\n".join(lines)


def memory_text(memory: dict[str, float] | None) -> str:
    """'5.6/7.4': GiB a rollout worker's and a trainer rank's GPU holds; '-' unknown."""
    return "-" if memory is None else f"{memory['rollout']:.1f}/{memory['trainer']:.1f}"
