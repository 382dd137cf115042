"""`rlcore bench`, `rlcore calibrate`, `rlcore fidelity` and `rlcore smoke`: measure the
runtime, price the virtual clock's terms on this machine (or fit them to live runs), judge
the emulator on held-out configs, and try a config at its real model size."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from rlcore.config import ConfigError, load_config
from rlcore.config.arguments import add_config, add_overrides


def _bench(args: argparse.Namespace) -> int:
    from rlcore.measure.bench import (
        bench,
        bench_replay,
        bench_sandbox,
        bench_verifiers,
    )
    from rlcore.measure.live_vs_virtual import bench_virtual
    from rlcore.record.rundir import atomic_write_json

    if args.out and Path(args.out).is_dir():  # found now, not after minutes of timing
        raise ConfigError(f"--out {args.out} is a directory: give the JSON file to write, "
                          f"e.g. --out {Path(args.out) / 'bench.json'}")
    cfg = load_config(args.config, args.set)
    if args.virtual:
        from rlcore.plan.planner import sweep_values
        from rlcore.runners.asynchronous import forkserver

        forkserver.context()
        key, values = sweep_values(args.sweep) if args.sweep else ("mode", [cfg.mode])
        cfgs = [(f"{key}={v}", load_config(args.config, [*args.set, f"{key}={v}"]))
                for v in values]
        result = bench_virtual(cfgs, args.updates, args.repeats)
    elif args.sweep:
        raise ConfigError("--sweep goes with --virtual")
    elif args.kernels:
        from rlcore.measure.kernels_bench import bench_kernels

        result = bench_kernels(args.config, args.set, args.updates, args.repeats)
    elif args.sandbox:
        result = bench_sandbox(cfg, args.sandbox)
    elif args.verifiers:
        result = bench_verifiers(cfg, args.verifiers, args.repeats)
    elif args.replay:
        if cfg.mode == "areal":
            from rlcore.runners.asynchronous import forkserver

            forkserver.context()
        result = bench_replay(cfg, args.updates, args.repeats)
    else:
        result = bench(cfg, args.updates, args.repeats, args.floor_steps, args.qwen_weight_sync)
    print(json.dumps(result, indent=2))
    if args.out:
        atomic_write_json(Path(args.out), result)
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    from rlcore.measure.calibrate import calibrate, write_profile

    out = Path(args.out)
    if args.from_runs:
        from rlcore.clock.profile import load_profile
        from rlcore.measure.in_situ import calibrate_from_runs

        if args.config or args.set:
            raise ConfigError("--from-runs fits the runs' own spans: give run directories and "
                              "no CONFIG or --set (the runs' configs are theirs)")
        profile, report = calibrate_from_runs(args.from_runs, load_profile(args.base),
                                              args.name or out.stem, drift=args.drift)
    elif args.drift:
        raise ConfigError("--drift is fitted to live runs' spans: add --from-runs RUN_DIR... "
                          "(an isolated calibration sees no run's drift)")
    elif not args.config:
        raise ConfigError("give a CONFIG to time each term on this machine, or --from-runs "
                          "RUN_DIR... to fit live runs' busy spans (docs/virtual_clock.md)")
    else:
        cfg = load_config(args.config, args.set)
        profile, report = calibrate(cfg, args.name or out.stem, args.repeats)
    print(f"hardware profile {profile.name} on {profile.machine}\n{report}")
    write_profile(profile, report, out)
    print(f"-> {out}")
    return 0


def _fidelity(args: argparse.Namespace) -> int:
    import dataclasses
    import time

    from rlcore.measure.fidelity import fidelity_markdown, load_split, run_split
    from rlcore.record.rundir import atomic_write_json
    from rlcore.runners.asynchronous import forkserver

    forkserver.context()
    split = load_split(args.split)
    split = dataclasses.replace(split, updates=args.updates or split.updates,
                                repeats=args.repeats or split.repeats)
    out = Path(args.out)
    t0 = time.perf_counter()
    result = {"split": str(args.split),
              **run_split(split, out, args.base, Path(args.profile) if args.profile else None)}
    result["total_s"] = time.perf_counter() - t0
    atomic_write_json(out / "fidelity.json", result)
    table = fidelity_markdown(result)
    (out / "fidelity.md").write_text(table)
    print(table + f"-> {out / 'fidelity.json'}, {out / 'fidelity.md'}")
    return 0


def _smoke(args: argparse.Namespace) -> int:
    from rlcore.measure.smoke import RESULT_FILE, smoke, table

    if args.stand_in:
        from rlcore.policy.stand_in import build_stand_in, is_complete

        if not args.model:
            raise ConfigError("--stand-in builds a model into --model DIR; name that directory")
        existed = is_complete(args.model)
        info = build_stand_in(args.model, args.stand_in)
        print(f"{args.stand_in} stand-in {'already built' if existed else 'built'}: "
              f"{args.model} ({info['params']:,} parameters)")
    modes = [m for m in args.modes.split(",") if m]
    result = smoke(args.config, Path(args.out), model=args.model, modes=modes,
                   updates=args.updates, max_new_tokens=args.max_new_tokens,
                   eval_tasks=args.eval_tasks, staleness_k=args.staleness_k,
                   device=args.device, overrides=args.set,
                   compare_generate=not args.no_generate_comparison)
    print(table(result))
    print(f"figures: {Path(args.out) / RESULT_FILE}")
    return 0


def _bench_arguments(n: argparse.ArgumentParser) -> None:
    add_config(n)
    n.add_argument("--updates", type=int, default=200, help="updates per run of each mode")
    n.add_argument("--repeats", type=int, default=3, help="repetitions of the mode comparison")
    n.add_argument("--floor-steps", type=int, default=100,
                   help="timed steps of the bare REINFORCE loop")
    n.add_argument("--qwen-weight-sync", action="store_true",
                   help="also time weight sync for a random Qwen2.5-0.5B-sized model (~2 GB)")
    n.add_argument("--sandbox", type=int, metavar="N", default=0,
                   help="instead: time N sandboxed evaluations of a trivial correct solution")
    n.add_argument("--verifiers", type=int, metavar="N", default=0,
                   help="instead: answers/s of the last_integer, exact and math verifiers on "
                        "N generated answers, --repeats rounds, interleaved")
    n.add_argument("--replay", action="store_true",
                   help="instead: a live run of CONFIG against its verification replay, "
                        "--repeats times, interleaved (`rlcore replay`'s speed)")
    n.add_argument("--virtual", action="store_true",
                   help="instead: live runs of CONFIG against its virtual runs and its plan "
                        "(runtime.hardware), --repeats times, interleaved: the virtual "
                        "clock's and the planner's errors, and a virtual run's cost")
    n.add_argument("--kernels", action="store_true",
                   help="instead: portable against native CPU kernels (runtime.kernels): a "
                        "sync and an AReaL-style run of CONFIG, each in a fresh process, "
                        "--repeats rounds, interleaved")
    n.add_argument("--sweep", metavar="KEY=V1,V2,...",
                   help="with --virtual: one config per value, e.g. staleness.staleness_k=1,2")
    n.add_argument("--out", help="also write the figures to this JSON file")
    add_overrides(n)
    n.set_defaults(func=_bench)


def _calibrate_arguments(c: argparse.ArgumentParser) -> None:
    c.add_argument("config", nargs="?",
                   help="run or pipeline config whose model and devices to time, term by term "
                        "on an idle machine (omit with --from-runs)")
    c.add_argument("--from-runs", nargs="+", metavar="RUN_DIR",
                   help="fit the profile to these live runs' busy spans instead: prices under "
                        "the runs' own contention, on the host they ran on")
    c.add_argument("--base", default="cpu-2core", metavar="PROFILE",
                   help="with --from-runs: the profile whose terms no span exercised are kept "
                        "(a shipped name or a path; default cpu-2core)")
    c.add_argument("--drift", action="store_true",
                   help="with --from-runs: also fit how each role's speed drifts (the profile's "
                        "`drift`); it over-predicted stale drops on this VM in one hour of two")
    c.add_argument("--out", required=True, help="the profile to write (YAML)")
    c.add_argument("--name", help="the profile's name (default: the file's stem)")
    c.add_argument("--repeats", type=int, default=3, help="timings per size of each term")
    add_overrides(c)
    c.set_defaults(func=_calibrate)


def _smoke_arguments(m: argparse.ArgumentParser) -> None:
    m.add_argument("config", help="run or pipeline config (e.g. config/paper.yaml)")
    m.add_argument("--out", required=True, help="directory for the runs, logs and smoke.json")
    m.add_argument("--model", help="model directory (default: the config's model.path)")
    m.add_argument("--stand-in", choices=["tiny", "0.5b"],
                   help="first build a random Qwen2-class stand-in of this size in --model "
                        "(0.5b: Qwen2.5-0.5B-Instruct's architecture, ~1 GB; kept if there)")
    m.add_argument("--modes", default="sync,async,areal",
                   help="comma-separated modes to run, in order")
    m.add_argument("--updates", type=int, default=3, help="updates per mode")
    m.add_argument("--max-new-tokens", type=int, default=16,
                   help="rollout.max_new_tokens (cut down from the config's to fit)")
    m.add_argument("--eval-tasks", type=int, default=8, help="eval.heldout_tasks")
    m.add_argument("--staleness-k", type=int, default=2, help="K of the async modes")
    m.add_argument("--device", metavar="DEVICE",
                   help="both roles' device: cpu, auto or cuda:N (default: the config's)")
    m.add_argument("--no-generate-comparison", action="store_true",
                   help="skip timing rollout sampling against HF generate on one batch")
    add_overrides(m)
    m.set_defaults(func=_smoke)


def _fidelity_arguments(f: argparse.ArgumentParser) -> None:
    f.add_argument("split", help="the validation split (config/fidelity.yaml): fitting and "
                                 "held-out configs")
    f.add_argument("--out", required=True,
                   help="directory for the fitting runs, profile.yaml, fidelity.json and .md")
    f.add_argument("--base", default="cpu-2core", metavar="PROFILE",
                   help="the profile whose terms the fitting runs do not exercise are kept")
    f.add_argument("--profile", metavar="FILE",
                   help="judge this profile instead of fitting one (e.g. a shipped one)")
    f.add_argument("--updates", type=int, help="updates per run (default: the split's)")
    f.add_argument("--repeats", type=int, help="rounds: live runs of each held-out and each "
                                               "fitting config (default: the split's)")
    f.set_defaults(func=_fidelity)


ARGUMENTS: dict[str, Callable[[argparse.ArgumentParser], None]] = {
    "bench": _bench_arguments, "calibrate": _calibrate_arguments, "smoke": _smoke_arguments,
    "fidelity": _fidelity_arguments}


def add_arguments(name: str, parser: argparse.ArgumentParser) -> None:
    """The arguments of `rlcore NAME`, NAME one of bench, calibrate, fidelity and smoke."""
    ARGUMENTS[name](parser)
