"""`rlcore plan`: what a config would do on a hardware profile, without a model."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rlcore.config import ConfigError, load_config
from rlcore.config.arguments import add_config, add_overrides, say_which_part_runs


def _plan(args: argparse.Namespace) -> int:
    from rlcore.clock.profile import load_profile
    from rlcore.plan.lengths import chosen
    from rlcore.plan.planner import (
        SPLIT,
        pick,
        plan_sweep,
        split_settings,
        splits,
        sweep_values,
        table,
    )
    from rlcore.record.summary import mismatch_warning

    say_which_part_runs(args.config)
    base = [*args.set, *([f"runtime.hardware={args.hardware}"] if args.hardware else [])]
    refused: list[str] = []
    values: list[str | None]
    if args.gpus is not None:
        if args.sweep:
            raise ConfigError("--gpus sweeps the splits of its devices: give no --sweep with it")
        key, values, cfgs = SPLIT, [], []
        for r, m in splits(args.gpus):
            try:
                cfg = load_config(args.config, base + split_settings(r, m))
                load_profile(cfg.runtime.hardware).check_ranks(m)
            except ConfigError as e:  # a split that cannot run: said, not planned
                refused.append(f"{r}+{m}: {e}")
                continue
            cfgs.append(cfg)
            values.append(f"{r}+{m}")
        if not cfgs:
            raise ConfigError(f"no split of {args.gpus} GPUs can run this config:\n"
                              + "\n".join(refused))
    else:
        key, swept = sweep_values(args.sweep) if args.sweep else ("mode", [None])
        values = list(swept)
        cfgs = [load_config(args.config, base + ([f"{key}={v}"] if v is not None else []))
                for v in values]
    runs = args.lengths or [None]
    if len(runs) not in (1, len(values)):
        raise ConfigError(f"{len(runs)} --lengths for {len(values)} sweep values: give one, "
                          "or one per value in the sweep's order")
    lengths = [chosen(run, cfgs[0].rollout.max_new_tokens, fit=args.fit,
                      as_recorded=args.as_recorded, mean_tokens=args.mean_tokens,
                      pooled=args.pooled) for run in runs] * (len(values) // len(runs))
    plans = plan_sweep(cfgs, key, list(values), lengths, sync_devices=args.gpus or 1)
    first = plans[0]
    print(f"{args.config} on {first['hardware']}, {cfgs[0].train.updates} updates; "
          f"response lengths {first['lengths']}")
    for line in dict.fromkeys(mismatch_warning(load_profile(c.runtime.hardware),
                                               p["profile_mismatch"])
                              for c, p in zip(cfgs, plans, strict=True) if p["profile_mismatch"]):
        print(line, file=sys.stderr)
    print(table(plans, key))
    if args.gpus is not None:
        best = pick(plans, args.gpus)
        for line in refused:
            print(f"not planned: {line}")
        sync_rate = cfgs[0].train.updates / best["sync_wall_s"]
        used = best["sync_devices"]
        fewer = ("" if used == args.gpus else f" (of {args.gpus}: a minibatch of its batch "
                 f"has {used} group{'s' if used > 1 else ''}, one to a device)")
        print(f"sync on {used} GPUs{fewer}, each sampling its share of a batch and then "
              f"training it as a rank: {sync_rate:.2f} updates/s; `vs sync` is against it")
        print(f"pick: {best[SPLIT]} (rollout workers + trainer ranks) on {args.gpus} GPUs: "
              f"{best['updates_per_s']:.2f} updates/s, {best['gpu_s_per_update']:.2f} "
              "GPU-seconds an update")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(plans, indent=1) + "\n")
        print(f"plans: {args.out}")
    return 0


def add_arguments(name: str, pl: argparse.ArgumentParser) -> None:
    """The arguments of `rlcore plan` (`name` is always "plan")."""
    add_config(pl)
    pl.add_argument("--hardware", help="profile name or path (default: runtime.hardware)")
    pl.add_argument("--sweep", metavar="KEY=V1,V2,...",
                    help="one plan per value, e.g. staleness.staleness_k=0,1,2,4,8")
    pl.add_argument("--gpus", type=int, metavar="N",
                    help="plan AReaL-style on N devices, one plan per split into rollout "
                         "workers and trainer ranks (a device each), and pick the split with "
                         "the most updates/s (docs/placement.md)")
    pl.add_argument("--lengths", metavar="RUN_DIR", action="append",
                    help="draw response lengths from a finished run's samples, each attempt "
                         "at a task from that task's own (tasks the run never sampled: from "
                         "all); with --sweep, once for all values or once per value, in order")
    pl.add_argument("--pooled", action="store_true",
                    help="with --lengths: every attempt from all of the run's lengths alike")
    pl.add_argument("--fit", action="store_true",
                    help="with --lengths: a geometric fit to that run's mean length instead")
    pl.add_argument("--as-recorded", action="store_true",
                    help="with --lengths: each attempt that run recorded keeps its length "
                         "(checks the planner against the run)")
    pl.add_argument("--mean-tokens", type=float,
                    help="a geometric length distribution with this mean (default: half of "
                         "rollout.max_new_tokens)")
    pl.add_argument("--out", help="write the plans here (JSON)")
    add_overrides(pl)
    pl.set_defaults(func=_plan)
