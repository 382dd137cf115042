"""`rlcore`: build the base model, run a training job, replay or evaluate a run, measure
(bench, smoke), print the config schema."""

from __future__ import annotations

import argparse
import atexit
import json
import os
import sys
from pathlib import Path
from typing import Any

from rlcore.config import (
    ConfigError,
    config_from_dict,
    config_reference_markdown,
    load_config,
    read_run_config,
    run_config_schema,
)
from rlcore.errors import HarnessFailed, ReplayError, RunExistsError, WorkerFailed
from rlcore.kernels import take_intel_mkl_paths

CONFIG_HELP = "run config (YAML or JSON), a pipeline config (its run: section) or a run directory"


def _say_which_part_runs(path: str) -> None:
    """A line on stderr when the config file is not a plain run config (a pipeline config, a
    run's record): what of it is used."""
    note = read_run_config(path)[1]
    if note:
        print(f"rlcore: {note}", file=sys.stderr)


def _run(args: argparse.Namespace) -> int:
    if args.exit_with_parent:
        from rlcore.runners.asynchronous.health import die_with_parent

        die_with_parent(args.exit_with_parent)
    _say_which_part_runs(args.config)
    cfg = load_config(args.config, args.set)
    if args.eval and not cfg.runtime.save_policy:  # fail now, not after the whole run
        raise ConfigError("--eval scores the run's saved final policy, but "
                          "runtime.save_policy is false; set it to true or drop --eval")
    if cfg.mode == "areal":  # its imports overlap this process's own
        from rlcore.runners.asynchronous import forkserver

        forkserver.context()
    from rlcore.runners import run_mode

    summary = run_mode(cfg, args.out, force=args.force)
    m = summary["metrics"]
    print(f"run complete: {args.out} | {summary['updates']} updates in "
          f"{summary['time']['wall_s']:.1f}s | train pass (last {cfg.eval.window} updates) "
          f"{m['train_pass_rate_final']:.3f}")
    if args.eval:
        from rlcore.evaluation import EVAL_SEED, eval_line, evaluate_run

        result, out = evaluate_run(Path(args.out), "final", seed=EVAL_SEED)
        print(eval_line(Path(args.out), "final", result, out))
    return 0


def _replay(args: argparse.Namespace) -> int:
    if args.exit_with_parent:
        from rlcore.runners.asynchronous.health import die_with_parent

        die_with_parent(args.exit_with_parent)
    from rlcore.runners.asynchronous import forkserver

    forkserver.context()  # the trainer process's imports overlap this process's own
    from rlcore.replay.replayer import replay_run

    summary = replay_run(args.run_dir, args.out, args.set, tolerance=args.tolerance,
                         threads=args.threads, force=args.force)
    info = summary["reproducibility"]["replay"]
    if info["kind"] == "verification":
        verdict = "verified: every sample, update loss and the final state match" \
            if args.tolerance is None else f"largest divergence {info['max_divergence']}"
    else:
        verdict = f"counterfactual with {info['overrides']}"
    print(f"replay complete: {args.out} | {summary['updates']} updates in "
          f"{summary['time']['wall_s']:.1f}s | {verdict}")
    if args.eval:
        from rlcore.evaluation import EVAL_SEED, eval_line, evaluate_run

        result, out = evaluate_run(Path(args.out), "final", seed=EVAL_SEED)
        print(eval_line(Path(args.out), "final", result, out))
    return 0


def _build_base(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.set) if args.config else config_from_dict({})
    from rlcore.policy.tiny import build_base
    from rlcore.policy.tiny import is_complete as base_done

    existed = base_done(args.out_dir) and not args.force
    info = build_base(args.out_dir, cfg, force=args.force)
    verb = "already built" if existed else f"built in {info['build_s']:.1f}s"
    print(f"base model {verb}: {args.out_dir} ({info['params']:,} parameters)")
    return 0


def _eval(args: argparse.Namespace) -> int:
    from rlcore.evaluation import EVAL_SEED, eval_line, evaluate_run

    seed = EVAL_SEED if args.seed is None else args.seed
    result, out = evaluate_run(Path(args.run_dir), args.policy, seed=seed)
    print(eval_line(Path(args.run_dir), args.policy, result, out))
    return 0


def _bench(args: argparse.Namespace) -> int:
    from rlcore.measure.bench import (
        bench,
        bench_replay,
        bench_sandbox,
        bench_verifiers,
        bench_virtual,
    )
    from rlcore.record.rundir import atomic_write_json

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

    cfg = load_config(args.config, args.set)
    out = Path(args.out)
    profile, report = calibrate(cfg, args.name or out.stem, args.repeats)
    print(f"hardware profile {profile.name} on {profile.machine}\n{report}")
    write_profile(profile, report, out)
    print(f"-> {out}")
    return 0


def _plan(args: argparse.Namespace) -> int:
    from rlcore.plan.lengths import chosen
    from rlcore.plan.planner import plan_sweep, sweep_values, table

    _say_which_part_runs(args.config)
    base = [*args.set, *([f"runtime.hardware={args.hardware}"] if args.hardware else [])]
    key, values = sweep_values(args.sweep) if args.sweep else ("mode", [None])
    cfgs = [load_config(args.config, base + ([f"{key}={v}"] if v is not None else []))
            for v in values]
    runs = args.lengths or [None]
    if len(runs) not in (1, len(values)):
        raise ConfigError(f"{len(runs)} --lengths for {len(values)} sweep values: give one, "
                          "or one per value in the sweep's order")
    lengths = [chosen(run, cfgs[0].rollout.max_new_tokens, fit=args.fit,
                      as_recorded=args.as_recorded, mean_tokens=args.mean_tokens,
                      pooled=args.pooled) for run in runs] * (len(values) // len(runs))
    plans = plan_sweep(cfgs, key, list(values), lengths)
    first = plans[0]
    print(f"{args.config} on {first['hardware']}, {cfgs[0].train.updates} updates; "
          f"response lengths {first['lengths']}")
    print(table(plans, key))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(plans, indent=1) + "\n")
        print(f"plans: {args.out}")
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


def _schema(args: argparse.Namespace) -> int:
    print(config_reference_markdown() if args.markdown else
          json.dumps(run_config_schema(), indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlcore", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    overrides: dict[str, Any] = {
        "action": "append", "default": [], "metavar": "KEY=VALUE",
        "help": "override a config key, e.g. --set train.updates=10 (repeatable)"}

    r = sub.add_parser("run", help="train one run and write its run directory")
    r.add_argument("config", help=CONFIG_HELP)
    r.add_argument("--out", required=True, help="run directory to write")
    r.add_argument("--force", action="store_true", help="replace a complete run in --out")
    r.add_argument("--set", **overrides)
    r.add_argument("--exit-with-parent", action="store_const", const=os.getppid(), default=0,
                   help="die with the process that started this one (the pipeline uses it so "
                        "that killing Snakemake leaves no run behind)")
    r.add_argument("--eval", action="store_true",
                   help="then score the final policy on the held-out split (eval.json in "
                        "--out, as `rlcore eval OUT` does), in the same process: the "
                        "interpreter, torch and the run's device are already set up, so the "
                        "pipeline scores each run in its run job")
    r.set_defaults(func=_run)

    y = sub.add_parser("replay", help="re-execute a run's schedule in one process: verify it "
                       "bit for bit, or train differently on the same schedule")
    y.add_argument("run_dir", help="a complete run directory (with schedule.jsonl)")
    y.add_argument("--out", required=True, help="run directory to write the replay into")
    y.add_argument("--set", action="append", default=[], metavar="train.KEY=VALUE",
                   help="a counterfactual: change a train setting and hold the schedule, e.g. "
                        "--set train.objective=decoupled (repeatable); none: a verification")
    y.add_argument("--tolerance", type=float, default=None, metavar="T",
                   help="where bit-exactness cannot hold (another device or thread count, GPU "
                        "kernels): report the largest divergence instead of failing")
    y.add_argument("--threads", type=int, default=None,
                   help="threads per role (default: the run's runtime.threads_per_role)")
    y.add_argument("--force", action="store_true", help="replace a complete run in --out")
    y.add_argument("--exit-with-parent", action="store_const", const=os.getppid(), default=0,
                   help="die with the process that started this one (as for `rlcore run`)")
    y.add_argument("--eval", action="store_true",
                   help="then score the final policy on the held-out split, as `rlcore run "
                        "--eval` does")
    y.set_defaults(func=_replay)

    b = sub.add_parser("build-base", help="build and warm-start the embedded tiny model")
    b.add_argument("out_dir", help="directory to save the model in (save_pretrained)")
    b.add_argument("--config", help="config whose task and base sections to use")
    b.add_argument("--force", action="store_true", help="rebuild even if already built")
    b.add_argument("--set", **overrides)
    b.set_defaults(func=_build_base)

    e = sub.add_parser("eval", help="score a run's policy on the held-out split")
    e.add_argument("run_dir", help="a complete run directory")
    e.add_argument("--policy", choices=["final", "base"], default="final",
                   help="the run's final weights (eval.json) or its base model (eval_base.json)")
    e.add_argument("--seed", type=int, default=None,
                   help="sampling seed of the evaluation (default: the pipeline's)")
    e.set_defaults(func=_eval)

    n = sub.add_parser("bench", help="modes side by side, overlap efficiency, weight sync; "
                       "or the code sandbox's evaluations/s, or the verifiers' answers/s")
    n.add_argument("config", help=CONFIG_HELP)
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
    n.add_argument("--set", **overrides)
    n.set_defaults(func=_bench)

    c = sub.add_parser("calibrate", help="time each cost term of the virtual clock on this "
                       "machine for a config's model and devices, and write a hardware profile")
    c.add_argument("config", help=CONFIG_HELP)
    c.add_argument("--out", required=True, help="the profile to write (YAML)")
    c.add_argument("--name", help="the profile's name (default: the file's stem)")
    c.add_argument("--repeats", type=int, default=3, help="timings per size of each term")
    c.add_argument("--set", **overrides)
    c.set_defaults(func=_calibrate)

    pl = sub.add_parser("plan", help="what a config would do on a hardware profile, without "
                        "a model: updates/s, drops, staleness, speed-up over sync")
    pl.add_argument("config", help=CONFIG_HELP)
    pl.add_argument("--hardware", help="profile name or path (default: runtime.hardware)")
    pl.add_argument("--sweep", metavar="KEY=V1,V2,...",
                    help="one plan per value, e.g. staleness.staleness_k=0,1,2,4,8")
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
    pl.add_argument("--set", **overrides)
    pl.set_defaults(func=_plan)

    m = sub.add_parser("smoke", help="a config end to end at its real model size, a few "
                       "updates per mode, then eval: time, memory and weight sync per mode")
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
    m.add_argument("--set", **overrides)
    m.set_defaults(func=_smoke)

    s = sub.add_parser("config-schema", help="print the run config's JSON Schema")
    s.add_argument("--markdown", action="store_true",
                   help="print the reference table of config/README.md instead")
    s.set_defaults(func=_schema)
    return p


def main(argv: list[str] | None = None) -> int:
    # before any command imports torch; a failure is reported by the `pin` it would fail
    take_intel_mkl_paths()
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, RunExistsError, FileExistsError) as e:
        print(f"rlcore: error: {e}", file=sys.stderr)
        return 2
    except ReplayError as e:  # a schedule that cannot be replayed, or a divergence
        print(f"rlcore: error: {e}", file=sys.stderr)
        return 1
    except HarnessFailed as e:  # the message names the sample and the exception
        print(f"rlcore: error: {e}", file=sys.stderr)
        return 1
    except WorkerFailed as e:
        detail = f"\n{e.__cause__}" if e.__cause__ else ""
        print(f"rlcore: error: {e}{detail}", file=sys.stderr)
        return 1


def entry() -> None:
    """The `rlcore` program: main(), then an exit that skips the interpreter's teardown.

    Tearing down torch's and transformers' modules costs about 0.9 s of CPU per process
    after every file is written and closed, and a grid pays it once per job. Exit handlers
    (multiprocessing's, logging's) still run; only module teardown and the final garbage
    collection are skipped. An uncaught exception exits the usual way.
    """
    code: int | None = None

    def skip_teardown() -> None:
        if code is not None:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    atexit.register(skip_teardown)  # registered first, so it runs after every other handler
    code = main()
    sys.exit(code)


if __name__ == "__main__":
    entry()
