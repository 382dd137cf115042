"""Profile the default grid's runs under cProfile, each a cold `python -m rlcore run` as a
job would start one without the warm launcher, and report where the time goes:

    python tools/profile_run.py --out results/profile [--repeats 3]

Profiled: the first sync run on the wall clock (one process: rollout and trainer take
turns), and the first AReaL-style run on an emulated clock (its roles are threads of one
interpreter, each profiled, so one profile sees them all). Repetitions are interleaved, and
the figures are medians with their range. cProfile adds its own cost to every Python call,
so the per-call figures are upper bounds; the split between parts is what to read. Each
repetition keeps its `.prof` (open with `python -m pstats` or snakeviz); `profile.md` sums
them up.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import runpy
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# (what, file suffix, function name) whose cumulative seconds and calls each part reads.
PARTS = {
    "imports": ("<frozen importlib._bootstrap>", "_find_and_load"),
    "run (training)": ("rlcore/runners/__init__.py", "run_mode"),
    "generate, a batch": ("rlcore/policy/generation.py", "generate"),
    "decode step": ("rlcore/policy/decoders.py", "forward"),
    "update": ("rlcore/policy/hf_policy.py", "update"),
    "prefill, a batch": ("rlcore/policy/sampler.py", "_prefill"),
}


def pipeline_config(paths: list[Path]) -> dict[str, Any]:
    """Pipeline config files as `make run CONFIG=...` lays them over each other (each
    overlay over its base), as the Snakefile holds them (the schema's defaults filled in)."""
    from snakemake.utils import validate

    from rlcore.pipeline.grid import build_config

    data, _ = build_config(paths, ROOT, replaced=True)
    validate(data, str(ROOT / "workflow" / "schemas" / "config.schema.yaml"))
    return data


def profiled_points(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The runs profiled, by name: the first sync run on the wall clock, the first
    AReaL-style run on an emulated one."""
    from rlcore.pipeline.grid import grid_points

    points = grid_points(config)
    sync = next(p for p in points if p["mode"] == "sync" and p["clock"] == "wall")
    areal = next(p for p in points if p["mode"] == "areal" and p["clock"] != "wall")
    return {"sync": sync, "areal": areal}


def parts(profile: Path) -> dict[str, dict[str, float]]:
    """Seconds and calls of each of PARTS in one profile (cumulative, summed over every
    function of that name in that file)."""
    stats = pstats.Stats(str(profile)).stats  # type: ignore[attr-defined]
    out = {}
    for what, (suffix, name) in PARTS.items():
        calls = seconds = 0.0
        for (file, _, function), (_, ncalls, _, cumtime, _) in stats.items():
            if function == name and file.endswith(suffix):
                calls += ncalls
                seconds += cumtime
        out[what] = {"s": seconds, "calls": calls}
    return out


def profiled_command(prof: Path, argv: list[str]) -> None:
    """`rlcore ARGV` in this process with every thread under its own cProfile, the profiles
    merged into `prof` at the end (cProfile alone sees only the main thread)."""
    finished: list[cProfile.Profile] = []
    thread_run = threading.Thread.run

    def profiled_run(self: threading.Thread) -> None:
        profile = cProfile.Profile()
        profile.enable()
        try:
            thread_run(self)
        finally:
            profile.disable()
            finished.append(profile)  # a thread still running at the end is left out

    threading.Thread.run = profiled_run  # type: ignore[method-assign]
    main = cProfile.Profile()
    sys.argv = ["rlcore", *argv]
    main.enable()
    try:
        runpy.run_module("rlcore", run_name="__main__")
    except SystemExit as e:
        if e.code:
            raise
    finally:
        main.disable()
        stats = pstats.Stats(main)
        for profile in finished:
            stats.add(profile)
        stats.dump_stats(str(prof))


def profile_once(config_file: Path, out: Path, name: str) -> dict[str, Any]:
    """One cold run under cProfile: the process's wall seconds and its parts."""
    run_dir, prof = out / name, out / f"{name}.prof"
    t0 = time.perf_counter()
    with (out / f"{name}.log").open("w") as log:
        subprocess.run([sys.executable, __file__, "--profile-to", str(prof), "--", "run",
                        str(config_file), "--out", str(run_dir), "--force"],
                       check=True, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - t0
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"wall_s": wall, "updates": summary["updates"], "parts": parts(prof)}


def figures(rep: dict[str, Any]) -> dict[str, float]:
    """A repetition's headline figures: start-up, the run, and per-call costs in ms."""
    p = rep["parts"]
    per_call = {what: 1e3 * p[what]["s"] / p[what]["calls"] if p[what]["calls"] else 0.0
                for what in PARTS if what not in ("imports", "run (training)")}
    return {"process s": rep["wall_s"], "imports s": p["imports"]["s"],
            "run s (with the imports it makes)": p["run (training)"]["s"],
            **{f"{what} ms": v for what, v in per_call.items()},
            "decode steps": p["decode step"]["calls"], "updates": rep["updates"]}


def report(results: dict[str, list[dict[str, Any]]], host: str) -> str:
    """profile.md: each figure's median and range over the repetitions, per run."""
    lines = [f"# Profile of the default grid's runs\n\nHost: {host}. Medians (range) of "
             f"{max(len(r) for r in results.values())} interleaved cold runs under cProfile "
             "(its overhead included).\n"]
    for name, reps in results.items():
        rows = [figures(r) for r in reps]
        lines += [f"\n## {name}\n", "| figure | median | range |", "|---|---|---|"]
        for key in rows[0]:
            values = [row[key] for row in rows]
            lines.append(f"| {key} | {_number(statistics.median(values))} | "
                         f"{_number(min(values))}-{_number(max(values))} |")
    return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.3f}"


def host_cpu() -> str:
    """The CPU model, as /proc/cpuinfo names it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", type=Path, nargs="+", default=[ROOT / "config" / "config.yaml"],
                    help="the pipeline config whose runs are profiled (more files: each laid "
                    "over the one before, and an overlay over its base, as make run's CONFIG)")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "profile")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--profile-to", type=Path, help=argparse.SUPPRESS)  # the child's mode
    ap.add_argument("command", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.profile_to:
        profiled_command(args.profile_to, args.command)
        return 0
    from rlcore.pipeline.grid import run_settings

    config = pipeline_config(args.config)
    model = ROOT / config["run"]["model"]["path"]
    if not (model / "config.json").is_file():
        raise SystemExit(f"no model at {model}: build it first (`make run` does, or "
                         f"`rlcore build-base {model} --config {args.config[0]}`)")
    args.out.mkdir(parents=True, exist_ok=True)
    configs = {}
    for name, point in profiled_points(config).items():
        configs[name] = args.out / f"{name}.json"
        configs[name].write_text(json.dumps(run_settings(config, point), indent=1))
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
    for r in range(args.repeats):
        for name, config_file in configs.items():
            print(f"[{r + 1}/{args.repeats}] {name}", flush=True)
            results[name].append(profile_once(config_file, args.out, f"{name}-{r}"))
    (args.out / "profile.json").write_text(json.dumps(results, indent=1))
    text = report(results, host_cpu())
    (args.out / "profile.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
