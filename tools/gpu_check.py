#!/usr/bin/env python3
"""rlcore's CUDA path and the virtual clock checked on one GPU, in seven stages.

  stage 1  checks: the machine (device, torch and the GPUs it was built for, driver,
           /dev/shm); `python -m rlcore.measure.cuda_checks` (two threads capturing, a
           capture beside a synchronizing thread, pinned slots registered three times, a
           forced fp16 scaler overflow, on the tiny stand-in); `pytest -m cuda`;
  stage 2  probes (rlcore/measure/device_probe.py): a policy version of the
           Qwen2.5-0.5B-architecture stand-in through each weight transport, and the
           sampler's token under each decoder at batch 4, 32 and 64 against HF generate;
  stage 3  LoRA: config/paper-lora.yaml's path on the stand-in under fp16, both roles on
           the GPU: an AReaL-style run at K = 2 with its held-out evaluation, `rlcore eval`
           of it in a fresh process, and a replay of it (the adapter's base digest checked
           by each; its hand-over's bytes and seconds recorded);
  stage 4  smoke: `rlcore smoke` of config/paper.yaml in every mode, both roles on the GPU;
  stage 5  calibrate: `rlcore calibrate` of the stand-in on the path `auto` takes there (a
           profile named after the card), beside the card's derived profile term by term
           (which prices HF decoding and host copies: two paths side by side);
  stage 6  live against virtual: the paper's preset at K = 2 (AReaL-style) and sync, live
           and under the virtual clock on the card's profile (`rlcore bench --virtual`): the
           one stage 5 wrote on this machine, else config/hardware/<card>-qwen0.5b.yaml;
  stage 7  pipeline: config/gpu-smoke.yaml over config/paper.yaml through Snakemake to its
           report (shortened), with `model.decode: static` where this machine's decode probe
           failed, stopped early or wrote no JSON.

Each stage is one device command that fits 7 minutes (COMMAND_LIMIT_S) on a bare machine:
every step runs as its own process under the time limit LIMITS gives it, and a stage's
worst case (`--budget`) is the sum of its steps' limits, with the wheels' install and the
stand-in's build. No step runs in two stages. Stages run on one machine share --work: a
later one keeps the installed wheels, the stand-in and what earlier ones measured.

`gpu_check.json` under --out is rewritten after every step, each step's probe JSON is
written there as it measures, and `step_logs.txt` there holds the last lines of every
step's log, refreshed while it runs: a step or a command stopped at its limit loses nothing
measured before. The full logs and run records go into one archive per stage. A short
table is printed last.

A dry run on a CPU (`--device cpu --size tiny`) goes through every step of a stage in a
minute or two, so that a GPU call cannot fail on a typo. On your own GPU machine,
`make gpu-check` runs all seven stages in one go (docs/setup.md, "Checking a GPU").

On a short-lived machine, lent one command at a time. The stages are sized for a loan of
at most 7 minutes a command and 15 minutes of device time in all, start-ups included, on a
machine that stays warm about 30 s after a command:
  - one stage per command, in order: 1 first (the rest rely on the rules it checks), then 2,
    3, 4, 5 and 6; expect to reach stage 3 or 4 on one loan; stage 7 needs a loan of its
    own, and stage 6 without stage 5 on the same machine prices with the card's profile in
    the tree;
  - before each command, the device time left must cover the stage's worst case
    (`--budget`) plus a start-up of about 2 minutes, in case the machine has gone back;
    give the command a timeout of the worst case plus 20 s, and make the next one at once;
  - an image with torch but without Snakemake, math-verify and the lock's transformers:
    `python tools/device_wheels.py` here, once, downloads them with what they need as
    wheels into .whl (git-ignored, about 44 MB); carry .whl and install it with --wheels,
    into WORK/site ahead of the image's packages (`python tools/device_wheels.py --check`
    names any module the stages import that is in neither):
        python3 tools/gpu_check.py --stage 1 --wheels .whl --out "$OUT"
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "config/paper.yaml"
LORA_CONFIG = "config/paper-lora.yaml"
OVERLAY = "config/gpu-smoke.yaml"
HARDWARE = ROOT / "config" / "hardware"
# The paper's preset (config/paper.yaml, presets.paper) at K = 2, short and chunked.
PAPER = ["preset_name=paper", "staleness.staleness_control=filter",
         "staleness.interrupt=resubmit"]

COMMAND_LIMIT_S = 420  # one device command: at most 7 minutes, machine start not counted
# Seconds each step may take on an H200 before it is killed: a few times what it took there
# (notebook/results.md), or what a step new there may need.
LIMITS: dict[str, float] = {
    "wheels": 45,  # pip install --no-index of the carried wheels, about 45 MB
    "machine": 45,  # import torch, CUDA's first initialisation, nvidia-smi
    "stand_in": 90,  # the 0.5b stand-in: random init and 1 GB written, ~25 s on 2 cores
    "cuda_checks": 60,
    "pytest_cuda": 180,  # 7 tests took 27 s there; about 27 are marked cuda
    "transport": 60,
    "decode": 100,
    "lora_run": 120,  # new: the stand-in's rank-8 adapters, a few updates and an eval
    "lora_eval": 45,
    "lora_replay": 100,
    "smoke": 200,
    "calibrate": 170,
    "compare": 30,
    "bench_areal": 130,
    "bench_sync": 130,
    "overlay": 200,
    "overlay_report": 50,
}
OVERHEAD_S = 10  # this script between steps: JSON, tails, the archive
SETUP = ("wheels", "machine", "stand_in")  # every stage on a bare machine; kept on a warm one
TAIL_LINES = 200  # of each step's log, under --out
TAIL_EVERY_S = 10.0  # a running step's tail is refreshed this often


class Stage(NamedTuple):
    name: str
    steps: tuple[str, ...]  # run in this order, each once across all stages
    stand_in: str  # the stand-in it builds beside the machine step: "tiny", or "run" (--size)


STAGES: dict[str, Stage] = {
    "1": Stage("checks", ("cuda_checks", "pytest_cuda"), "tiny"),  # cuda_checks' fp16 model
    "2": Stage("probes", ("transport", "decode"), "run"),
    "3": Stage("lora", ("lora_run", "lora_eval", "lora_replay"), "run"),
    "4": Stage("smoke", ("smoke",), "run"),
    "5": Stage("calibrate", ("calibrate", "compare"), "run"),
    "6": Stage("live against virtual", ("bench_areal", "bench_sync"), "run"),
    "7": Stage("pipeline", ("overlay", "overlay_report"), "run"),
}


def budget(stage: str, limits: dict[str, float] | None = None) -> dict[str, float]:
    """A stage's worst case on a bare machine, by part: the wheels, the machine step (the
    stand-in's build runs beside it), each step's limit, this script; and their `total`."""
    lim = {**LIMITS, **(limits or {})}
    st = STAGES[stage]
    parts = {"wheels": lim["wheels"], "machine": max(lim["machine"], lim["stand_in"]),
             **{s: lim[s] for s in st.steps}, "script": OVERHEAD_S}
    return {**parts, "total": sum(parts.values())}


def budget_table(limits: dict[str, float] | None = None) -> str:
    """Each stage's worst case, part by part, against the command limit."""
    lines = []
    for n, st in STAGES.items():
        b = budget(n, limits)
        parts = " + ".join(f"{k} {v:g}" for k, v in b.items() if k != "total")
        lines.append(f"stage {n} ({st.name}): {b['total']:g} s of {COMMAND_LIMIT_S} = "
                     f"{parts.replace('machine', 'machine beside stand_in', 1)}")
    return "\n".join(lines)


def sizes(size: str) -> dict[str, Any]:
    """How much each step does: the real stand-in on a GPU, or a tiny one for a dry run."""
    if size == "0.5b":
        # the overlay at half gpu-smoke.yaml's updates and tasks: its runs, evals, tables and
        # figures then fit LIMITS["overlay"]
        return {"smoke_updates": 3, "lora_updates": 6, "lora_heldout": 16,
                "max_new_tokens": 32, "chunk_tokens": 8,
                "bench_updates": 24, "calibrate_repeats": 2, "transport_repeats": 5,
                "decode_batches": [4, 32, 64], "decode_steps": 32,
                "overlay": {"run": {"train": {"updates": 12}, "eval": {"heldout_tasks": 32}}}}
    # a dry run on CPU: the overlay's runs on the CPU, short
    return {"smoke_updates": 2, "lora_updates": 2, "lora_heldout": 4,
            "max_new_tokens": 8, "chunk_tokens": 4,
            "bench_updates": 4, "calibrate_repeats": 1, "transport_repeats": 2,
            "decode_batches": [4, 8], "decode_steps": 4,
            "overlay": {"run": {"model": {"rollout_device": "cpu", "trainer_device": "cpu",
                                          "dtype": "fp32"},
                                "train": {"updates": 2},
                                "rollout": {"max_new_tokens": 8},
                                "eval": {"heldout_tasks": 8}}}}


class Check:
    """The steps' results: WORK/gpu_check.json (what every stage on this machine measured),
    copied to OUT after each step, with each step's log tail in OUT/step_logs.txt."""

    def __init__(self, out: Path, work: Path, limits: dict[str, float]):
        self.out, self.work, self.limits = out, work, limits
        self.path = work / "gpu_check.json"
        self.data: dict[str, Any] = (json.loads(self.path.read_text())
                                     if self.path.is_file() else {"steps": {}})
        self.data.setdefault("stages", {})
        self.tails: dict[str, list[str]] = {}
        (work / "logs").mkdir(parents=True, exist_ok=True)
        out.mkdir(parents=True, exist_ok=True)

    def save(self) -> None:
        text = json.dumps(self.data, indent=1) + "\n"
        for path in (self.path, self.out / "gpu_check.json"):
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(path)

    def log(self, name: str) -> Path:
        return self.work / "logs" / f"{name}.log"

    def save_tail(self, name: str) -> None:
        """The last TAIL_LINES lines of each step's log this stage ran, under OUT."""
        log = self.log(name)
        self.tails[name] = (log.read_text(errors="replace").splitlines()[-TAIL_LINES:]
                            if log.is_file() else [])
        steps = self.data["steps"]
        text = "".join(f"==> {n}: {steps.get(n, {}).get('status', 'running')} <==\n"
                       + "".join(f"{line}\n" for line in lines) + "\n"
                       for n, lines in self.tails.items())
        tmp = self.out / "step_logs.tmp"
        tmp.write_text(text)
        tmp.replace(self.out / "step_logs.txt")

    def start(self, name: str, cmd: list[str], env: dict[str, str] | None = None
              ) -> tuple[subprocess.Popen[str], float]:
        print(f"--> {name} (limit {self.limits[name]:g} s): {' '.join(cmd)}", flush=True)
        with self.log(name).open("w") as f:
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                                    text=True, start_new_session=True,
                                    env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        self.data["steps"][name] = {"status": "running", "limit_s": self.limits[name]}
        self.save()
        return proc, time.perf_counter()

    def finish(self, name: str, started: tuple[subprocess.Popen[str], float]) -> bool:
        proc, t0 = started
        code: int | None = None
        while True:
            left = self.limits[name] - (time.perf_counter() - t0)
            if left <= 0:
                with contextlib.suppress(ProcessLookupError):  # it ended just now
                    os.killpg(proc.pid, 9)  # its whole session: workers and jobs too
                proc.wait()
                code = None
                break
            try:
                code = proc.wait(timeout=min(left, TAIL_EVERY_S))
                break
            except subprocess.TimeoutExpired:
                self.save_tail(name)  # a command stopped from outside still returns it
        seconds = time.perf_counter() - t0
        status = "timeout" if code is None else ("ok" if code == 0 else f"exit {code}")
        tail = self.log(name).read_text(errors="replace").splitlines()[-25:]
        self.data["steps"][name] = {"status": status, "seconds": round(seconds, 1),
                                    "limit_s": self.limits[name],
                                    "tail": tail if status != "ok" else tail[-6:]}
        self.save()
        self.save_tail(name)
        print(f"<-- {name}: {status} in {seconds:.1f} s", flush=True)
        if status != "ok":
            print("\n".join(f"    {line}" for line in tail[-12:]), flush=True)
        return status == "ok"

    def step(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> bool:
        return self.finish(name, self.start(name, cmd, env))

    def skip(self, name: str, why: str) -> None:
        self.data["steps"][name] = {"status": "skipped", "seconds": 0.0, "why": why}
        self.save()
        print(f"--- {name}: skipped: {why}", flush=True)

    def load(self, key: str, path: Path) -> None:
        """A step's JSON into the record under `key` (absent where it wrote none)."""
        if path.is_file():
            self.data[key] = json.loads(path.read_text())
        else:
            self.data.pop(key, None)
        self.save()

    def archive(self, stage: str, extra: list[Path]) -> None:
        """The logs and small run records of this stage in one archive under OUT."""
        with tarfile.open(self.out / f"stage{stage}.tar.gz", "w:gz") as tar:
            for path in [self.work / "logs", *extra]:
                if not path.exists():
                    continue
                for f in sorted(path.rglob("*") if path.is_dir() else [path]):
                    if f.is_file() and f.suffix in {".json", ".jsonl", ".log", ".yaml",
                                                    ".txt", ".md"} and f.stat().st_size < 4e6:
                        tar.add(f, arcname=str(f.relative_to(self.work)))


def environment(device: str) -> dict[str, Any]:
    """The machine: device, the GPU architectures torch was built for, driver, torch,
    transformers, CPU, memory and /dev/shm."""
    import torch
    import transformers

    shm = shutil.disk_usage("/dev/shm") if Path("/dev/shm").is_dir() else None
    env: dict[str, Any] = {
        "python": platform.python_version(), "torch": torch.__version__,
        "torch_cuda": torch.version.cuda, "transformers": transformers.__version__,
        "cpu": next((line.split(":", 1)[1].strip() for line in
                     Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name")), platform.processor()),
        "cpu_count": os.cpu_count(), "device": device,
        "mem_total_bytes": next((int(line.split()[1]) * 1024 for line in
                                 Path("/proc/meminfo").read_text().splitlines()
                                 if line.startswith("MemTotal:")), None),
        "dev_shm_free_bytes": shm.free if shm else None}
    if device.startswith("cuda") and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(device)
        env.update(gpu=props.name, gpu_memory_bytes=props.total_memory,
                   multiprocessors=props.multi_processor_count,
                   capability=f"{props.major}.{props.minor}",
                   torch_arch_list=torch.cuda.get_arch_list())
        try:
            env["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired) as e:
            env["driver"] = f"nvidia-smi failed: {e}"
    return env


def card_name(env: dict[str, Any]) -> str:
    """A profile name for the card: h100, h200, ... (cpu for a dry run)."""
    m = re.search(r"\b([A-Z]\d{2,3})\b", env.get("gpu", ""))
    return m.group(1).lower() if m else "cpu"


def pytest_counts(log: Path) -> dict[str, int]:
    """passed / failed / skipped / errors from pytest's last summary line."""
    text = log.read_text(errors="replace") if log.is_file() else ""
    counts = {k: 0 for k in ("passed", "failed", "skipped", "error", "deselected")}
    for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", text):
        counts["error" if word.startswith("error") else word] = int(n)
    return counts


def cuda_test_files() -> list[str]:
    """The test files with tests marked `cuda`: what `pytest -m cuda` collects (only these,
    so that a test file importing a package the GPU machine lacks cannot stop it)."""
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                  if "mark.cuda" in p.read_text())


def stage_sources() -> list[Path]:
    """The source files the stages import from this tree: rlcore, this script, the tests
    `pytest -m cuda` collects with their conftest and the test modules they import, and the
    workflow Snakemake runs."""
    tests = {ROOT / "tests" / "conftest.py", *(ROOT / f for f in cuda_test_files())}
    todo = list(tests)
    while todo:
        for name in re.findall(r"^\s*(?:from|import)\s+tests\.(\w+)", todo.pop().read_text(),
                               re.M):
            module = ROOT / "tests" / f"{name}.py"
            if module.is_file() and module not in tests:
                tests.add(module)
                todo.append(module)
    return sorted({*ROOT.glob("rlcore/**/*.py"), Path(__file__).resolve(), *tests,
                   ROOT / "Snakefile", *ROOT.glob("workflow/rules/*.smk"),
                   *ROOT.glob("workflow/scripts/*.py")})


def calibrated_profile(args: argparse.Namespace, env: dict[str, Any]) -> Path:
    """Where stage 5 writes the card's profile on this machine."""
    name = f"{card_name(env)}-qwen0.5b" if args.size == "0.5b" else "dry-run-tiny"
    return args.work / f"{name}.yaml"


def bench_profile(args: argparse.Namespace, env: dict[str, Any]) -> Path:
    """What stage 6 prices its virtual runs with: stage 5's profile where it ran on this
    machine, else the card's in the tree."""
    profile = calibrated_profile(args, env)
    return profile if profile.is_file() else committed_profile(env)


def committed_profile(env: dict[str, Any]) -> Path:
    """The card's calibrated profile in the tree (a dry run's: cpu-2core)."""
    card = card_name(env)
    return HARDWARE / ("cpu-2core.yaml" if card == "cpu" else f"{card}-qwen0.5b.yaml")


def reference_profile(env: dict[str, Any]) -> Path | None:
    """What a new calibration is put beside: the card's derived profile, else its calibrated
    one in the tree (a dry run's: cpu-2core)."""
    card = card_name(env)
    for name in (f"{card}-qwen0.5b-derived.yaml", committed_profile(env).name):
        if (HARDWARE / name).is_file():
            return HARDWARE / name
    return None


def run_sets(args: argparse.Namespace) -> list[str]:
    """The short config of the calibration and the benches: the stand-in, both roles on
    the device."""
    n = sizes(args.size)
    return [f"model.path={args.model}", f"model.rollout_device={args.device}",
            f"model.trainer_device={args.device}",
            f"rollout.max_new_tokens={n['max_new_tokens']}",
            f"rollout.chunk_tokens={n['chunk_tokens']}", "runtime.save_policy=false"]


def lora_sets(args: argparse.Namespace) -> list[str]:
    """config/paper-lora.yaml's path on the stand-in: AReaL-style at K = 2 under the paper's
    preset, short, its adapters saved for the evaluation and the replay (fp32 on a CPU)."""
    n = sizes(args.size)
    return [*run_sets(args), "mode=areal", "staleness.staleness_k=2", *PAPER,
            f"train.updates={n['lora_updates']}", f"eval.heldout_tasks={n['lora_heldout']}",
            "runtime.save_policy=true",
            *([] if args.device.startswith("cuda") else ["model.dtype=fp32"])]


def lora_figures(work: Path) -> dict[str, Any]:
    """What the LoRA stage measured: the run's adapter hand-over and speed, its held-out
    score, and the replay's verdict."""
    out: dict[str, Any] = {}
    for name in ("run", "replay"):
        d = work / "lora" / name
        if (d / "summary.json").is_file():
            s = json.loads((d / "summary.json").read_text())
            out[name] = {"wall_s": s["time"]["wall_s"], "updates": s["updates"],
                         "weight_sync": s["scheduling"]["weight_sync"],
                         "gpu_peak_bytes": s["gpu_peak_bytes"],
                         "replay": s["reproducibility"]["replay"]}
        if (d / "eval.json").is_file():
            scores = json.loads((d / "eval.json").read_text())
            out.setdefault(name, {})["eval"] = {k: v for k, v in scores.items()
                                                if k != "per_task"}
    return out


def sets(values: list[str]) -> list[str]:
    return [a for s in values for a in ("--set", s)]


BENCH_MODES = {"bench_areal": ["mode=areal", "staleness.staleness_k=2", *PAPER],
               "bench_sync": ["mode=sync", "staleness.staleness_k=0"]}


def commands(args: argparse.Namespace, env: dict[str, Any]) -> dict[str, list[str]]:
    """Every step's command line: the setup's and each stage's."""
    py, n, work = [sys.executable], sizes(args.size), args.work
    wheels = sorted(str(p) for p in args.wheels.glob("*.whl")) if args.wheels else []
    profile, reference = calibrated_profile(args, env), reference_profile(env)
    snakemake = [*py, "-m", "snakemake", "--cores", "all", "--resources", "gpu=1",
                 "--rerun-incomplete", "--configfile", CONFIG, OVERLAY,
                 str(work / "overlay-local.json"), "--replace-workflow-config"]
    out = {
        "wheels": [*py, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                   "--no-compile", "--no-cache-dir", "--upgrade", "--target",
                   str(work / "site"), *wheels],
        "machine": [*py, str(Path(__file__).resolve()), "--machine", str(work / "machine.json"),
                    "--device", args.device],
        "stand_in": build_command(args.model, args.size),
        "cuda_checks": [*py, "-m", "rlcore.measure.cuda_checks", "--out",
                        str(args.out / "cuda_checks.json"), "--device", args.device,
                        "--model", str(work / "stand-in-tiny")],
        "pytest_cuda": [*py, "-m", "pytest", "-m", "cuda", "-q", "-rs", "-p",
                        "no:cacheprovider", *cuda_test_files()],
        "transport": [*py, "-m", "rlcore.measure.device_probe", "transport", str(args.model),
                      "--device", args.device, "--out", str(args.out / "transport.json"),
                      "--repeats", str(n["transport_repeats"])],
        "decode": [*py, "-m", "rlcore.measure.device_probe", "decode", str(args.model),
                   "--device", args.device, "--out", str(args.out / "decode.json"),
                   "--batches", *map(str, n["decode_batches"]), "--steps",
                   str(n["decode_steps"]),
                   "--dtype", "fp16" if args.device.startswith("cuda") else "fp32"],
        "smoke": [*py, "-m", "rlcore", "smoke", CONFIG, "--model", str(args.model),
                  "--device", args.device, "--out", str(work / "smoke"),
                  "--updates", str(n["smoke_updates"]),
                  "--max-new-tokens", str(n["max_new_tokens"])],
        "calibrate": [*py, "-m", "rlcore", "calibrate", CONFIG, "--out", str(profile),
                      "--name", profile.stem, "--repeats", str(n["calibrate_repeats"]),
                      *sets(run_sets(args))],
        "compare": [*py, str(Path(__file__).resolve()), "--compare", str(reference),
                    str(profile)],
        "lora_run": [*py, "-m", "rlcore", "run", LORA_CONFIG, "--out", str(work / "lora" / "run"),
                     "--force", "--eval", *sets(lora_sets(args))],
        "lora_eval": [*py, "-m", "rlcore", "eval", str(work / "lora" / "run")],
        # a verification; GPU kernels are not bit-reproducible, so it reports its divergence
        "lora_replay": [*py, "-m", "rlcore", "replay", str(work / "lora" / "run"), "--out",
                        str(work / "lora" / "replay"), "--force", "--eval",
                        *(["--tolerance", "0.05"] if args.device.startswith("cuda") else [])],
        "overlay": snakemake,
        "overlay_report": [*snakemake, "--report", str(work / "gpu-smoke" / "report.html")],
    }
    for name, mode_sets in BENCH_MODES.items():
        out[name] = [*py, "-m", "rlcore", "bench", CONFIG, "--virtual", "--updates",
                     str(n["bench_updates"]), "--repeats", "1", "--out",
                     str(work / f"{name}.json"),
                     *sets([*run_sets(args), *mode_sets,
                            f"runtime.hardware={bench_profile(args, env)}"])]
    return out


def build_command(model: Path, size: str) -> list[str]:
    """The stand-in's build (an existing complete one is kept)."""
    return [sys.executable, "-c", "import sys; from rlcore.policy.stand_in import "
            "build_stand_in; print(build_stand_in(sys.argv[1], sys.argv[2]))", str(model), size]


def setup(check: Check, args: argparse.Namespace, stage: Stage) -> bool:
    """The carried wheels installed, the machine recorded and the stand-in built (beside
    it); False where the stage cannot go on."""
    cmds = commands(args, check.data.get("env", {}))
    site = args.work / "site"
    if args.wheels:
        marker = site / ".rlcore-wheels"
        names = "\n".join(sorted(p.name for p in args.wheels.glob("*.whl")))
        if not names:
            check.skip("wheels", f"no wheels in {args.wheels}")
            return False
        if marker.is_file() and marker.read_text() == names:
            check.skip("wheels", "installed by an earlier stage on this machine")
        elif check.step("wheels", cmds["wheels"]):
            marker.write_text(names)
        else:
            return False
    machine = check.start("machine", cmds["machine"])
    build = check.start("stand_in", cmds["stand_in"] if stage.stand_in == "run" else
                        build_command(args.work / "stand-in-tiny", "tiny"))
    if check.finish("machine", machine):
        check.data["env"] = json.loads((args.work / "machine.json").read_text())
        check.save()
        print(json.dumps(check.data["env"], indent=1), flush=True)
    return check.finish("stand_in", build) and "env" in check.data


def captured_step_failure(step: dict[str, Any] | None, result: dict[str, Any] | None
                          ) -> str | None:
    """Why the overlay should not decode through captured graphs, from the decode probe on
    this machine: it failed in the graph kind, stopped early or wrote no JSON. None where
    it finished with the graph measured, or did not run here."""
    if step is None:
        return None
    if result is None:
        return f"the decode probe wrote no JSON ({step['status']})"
    errors = result.get("errors", {})
    graph = next((k for k in errors if k.startswith("graph")), None)
    if graph:
        return f"{graph} failed in the decode probe: {errors[graph]}"
    if step["status"] != "ok" and not result.get("finished"):
        return f"the decode probe stopped before it finished ({step['status']})"
    return None


def overlay_config(overlay: dict[str, Any], failure: str | None) -> dict[str, Any]:
    """The overlay's own settings; with `model.decode: static` where the captured step
    failed (`captured_step_failure`), so that the pipeline's run still answers."""
    if failure is None:
        return overlay
    run = overlay.get("run", {})
    return {**overlay, "run": {**run, "model": {**run.get("model", {}), "decode": "static"}}}


def overlay_figures(results: Path) -> dict[str, Any]:
    """Per run of the overlay: seconds, updates/s, tokens/s, weight hand-over, GPU peaks;
    and its claims table."""
    runs = {}
    for summary in sorted(results.glob("runs/**/summary.json")):
        s = json.loads(summary.read_text())
        t, ws = s["time"], s["scheduling"]["weight_sync"]
        name = str(summary.parent.relative_to(results / "runs"))
        runs[name] = {"wall_s": t["wall_s"], "job_s": t["job_s"],
                      "updates_per_s": s["updates"] / t["wall_s"] if t["wall_s"] else 0.0,
                      "tokens_per_s": s["metrics"]["tokens_per_s"],
                      "weight_transport": ws.get("transport"),
                      "rollout_dtype": ws.get("rollout_dtype"),
                      "weight_per_version_s": ws["per_version_s"],
                      "gpu_peak_bytes": s["gpu_peak_bytes"]}
    claims = results / "tables" / "claims.md"
    return {"runs": runs, "claims_md": claims.read_text() if claims.is_file() else None,
            "report": (results / "report.html").is_file()}


def run_steps(check: Check, args: argparse.Namespace, stage: str) -> list[Path]:
    """The stage's own steps, each recorded as it ends; the run records to archive."""
    cmds = commands(args, check.data["env"])
    work, out = args.work, args.out
    if STAGES[stage].name == "checks":
        check.step("cuda_checks", cmds["cuda_checks"])
        check.load("cuda_checks", out / "cuda_checks.json")
        check.step("pytest_cuda", cmds["pytest_cuda"])
        check.data["pytest_cuda"] = pytest_counts(check.log("pytest_cuda"))
        check.save()
        return []
    if STAGES[stage].name == "probes":
        for probe in ("transport", "decode"):
            check.step(probe, cmds[probe])
            check.load(probe, out / f"{probe}.json")
        return []
    if STAGES[stage].name == "lora":
        # each step reads what the one before wrote: no eval or replay of a failed run
        for name in STAGES[stage].steps:
            if name != "lora_run" and check.data["steps"]["lora_run"]["status"] != "ok":
                check.skip(name, "the LoRA run failed")
                continue
            check.step(name, cmds[name])
        check.data["lora"] = lora_figures(work)
        check.save()
        return [work / "lora"]
    if STAGES[stage].name == "smoke":
        check.step("smoke", cmds["smoke"])
        check.load("smoke", work / "smoke" / "smoke.json")
        return [work / "smoke"]
    if STAGES[stage].name == "calibrate":
        profile = calibrated_profile(args, check.data["env"])
        ok = check.step("calibrate", cmds["calibrate"])
        check.data["profile"] = profile.name if ok and profile.is_file() else None
        check.save()
        if not check.data["profile"]:
            check.skip("compare", "calibrate wrote no profile")
            return []
        shutil.copy(profile, out / profile.name)
        if reference_profile(check.data["env"]) is None:
            check.skip("compare", f"no profile of the card in {HARDWARE} to compare with")
        elif check.step("compare", cmds["compare"]):
            check.data["profile_compare"] = check.log("compare").read_text()
            check.save()
        return [profile]
    if STAGES[stage].name == "live against virtual":
        profile = bench_profile(args, check.data["env"])
        check.data["bench_profile"] = str(profile)
        for name in BENCH_MODES:
            if not profile.is_file():
                check.skip(name, f"no profile {profile}: run stage 5 first on this machine")
                continue
            check.step(name, cmds[name])
            label = name.removeprefix("bench_")
            if (work / f"{name}.json").is_file():
                check.data.setdefault("live_vs_virtual", {})[label] = json.loads(
                    (work / f"{name}.json").read_text())
                check.save()
        return [work / f"{name}.json" for name in BENCH_MODES]
    return pipeline(check, args, cmds)


def pipeline(check: Check, args: argparse.Namespace, cmds: dict[str, list[str]]) -> list[Path]:
    """Stage 7: the paper's pipeline on one GPU through Snakemake, then its report."""
    results = args.work / "gpu-smoke"
    failure = captured_step_failure(check.data["steps"].get("decode"), check.data.get("decode"))
    own = sizes(args.size)["overlay"]
    # the stand-in built here, in place of OVERLAY's models/ path
    own = {**own, "run": {**own["run"], "model": {**own["run"].get("model", {}),
                                                  "path": str(args.model)}}}
    overlay = overlay_config(own, failure)
    check.data["overlay_config"] = overlay
    check.data["overlay_static_because"] = failure
    check.save()
    # JSON is YAML: a third config file
    (args.work / "overlay-local.json").write_text(json.dumps({"results": str(results),
                                                               **overlay}))
    # the jobs call `python` and `rlcore`: this interpreter's, as `make run` puts the venv's
    # first (where rlcore is not installed, `rlcore` is a shim running `python -m rlcore`)
    shims = args.work / "bin"
    shims.mkdir(exist_ok=True)
    (shims / "rlcore").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m rlcore "$@"\n')
    (shims / "rlcore").chmod(0o755)
    path = {"PATH": os.pathsep.join([str(shims), str(Path(sys.executable).parent),
                                     os.environ.get("PATH", "")])}
    if check.step("overlay", cmds["overlay"], path):
        check.step("overlay_report", cmds["overlay_report"], path)
    else:
        check.skip("overlay_report", "the overlay failed")
    check.data["overlay"] = overlay_figures(results)
    check.save()
    return [results / "tables", *results.glob("runs/**/summary.json")]


def run_stage(check: Check, args: argparse.Namespace, n: str) -> None:
    stage = STAGES[n]
    b = budget(n, args.limits)
    record = {"name": stage.name, "budget_s": b["total"], "budget": b,
              "command_limit_s": COMMAND_LIMIT_S}
    check.data["stages"][n] = record
    check.save()
    print(f"=== stage {n} ({stage.name}): worst case {b['total']:g} s "
          f"(limit {COMMAND_LIMIT_S} s a command)", flush=True)
    if b["total"] > COMMAND_LIMIT_S:
        print(f"    over the limit of one device command: {budget_table(args.limits)}",
              flush=True)
    t0 = time.perf_counter()
    check.tails.clear()
    extra: list[Path] = []
    if setup(check, args, stage):
        extra = run_steps(check, args, n)
    else:
        for name in stage.steps:
            check.skip(name, "the setup failed (wheels, machine or stand-in)")
    record["seconds"] = round(time.perf_counter() - t0, 1)
    check.save()
    check.archive(n, extra)
    print(f"=== stage {n}: {record['seconds']} s", flush=True)


def table(data: dict[str, Any]) -> str:
    """The short table printed last."""
    lines = [f"{k}: {v['status']} ({v.get('seconds', '-')} s)" for k, v in data["steps"].items()]
    env = data.get("env", {})
    lines.insert(0, f"{env.get('gpu', env.get('device'))}, torch {env.get('torch')}, "
                    f"transformers {env.get('transformers')}, driver {env.get('driver')}")
    for n, s in data.get("stages", {}).items():
        lines.append(f"stage {n} ({s['name']}): {s.get('seconds', '-')} s, worst case "
                     f"{s['budget_s']:g} s")
    for name, c in data.get("cuda_checks", {}).get("checks", {}).items():
        lines.append(f"cuda_checks {name}: {c.get('status')} ({c.get('seconds')} s)"
                     + (f" {c['error']}" if "error" in c else ""))
    if "pytest_cuda" in data:
        lines.append(f"pytest -m cuda: {data['pytest_cuda']}")
    for name, r in data.get("lora", {}).items():
        ws, ev, rep = r.get("weight_sync", {}), r.get("eval", {}), r.get("replay") or {}
        lines.append(f"lora {name}: {r.get('updates')} updates in {r.get('wall_s', 0):.1f} s, "
                     f"adapter {ws.get('bytes_per_version')} B/version in "
                     f"{ws.get('per_version_s', 0) * 1000:.1f} ms, held-out greedy "
                     f"{ev.get('greedy_pass_rate')}"
                     + (f", {rep['kind']} with max divergence {rep['max_divergence']}"
                        if rep else ""))
    for mode, m in data.get("smoke", {}).get("modes", {}).items():
        ws = m["weight_sync"]
        lines.append(f"smoke {mode}: {m['s_per_update']:.3f} s/update, "
                     f"{m['tokens_per_s']:.0f} tok/s, cold start {m['cold_start_s']:.1f} s, "
                     f"sync/version {ws['per_version_s'] * 1000:.1f} ms, "
                     f"gpu peak {m['gpu_peak_bytes']}")
    gen = data.get("smoke", {}).get("generate")
    if gen:
        lines.append(f"rollout {gen['rollout_tokens_per_s']:.0f} tok/s vs HF generate "
                     f"{gen['hf_generate_tokens_per_s']:.0f} ({gen['ratio_to_hf_generate']:.2f}x)")
    for transport, t in data.get("transport", {}).get("transports", {}).items():
        lines.append(f"weights by {transport}: write {t['write_s'] * 1000:.1f} ms, read "
                     f"{t['read_s'] * 1000:.1f} ms, bit for bit {t['bit_for_bit']}")
    for probe in ("transport", "decode"):
        for name, error in data.get(probe, {}).get("errors", {}).items():
            lines.append(f"{probe} {name} FAILED: {error}")
        for name, why in data.get(probe, {}).get("skipped", {}).items():
            lines.append(f"{probe} {name} skipped: {why}")
    dec = data.get("decode")
    if dec:
        for kind, by_rows in dec["step_s"].items():
            lines.append(f"decode {kind}: " + ", ".join(
                f"batch {rows} {s * 1000:.2f} ms" for rows, s in by_rows.items()))
        if "ratio_to_hf_generate" in dec:
            lines.append(f"rollout ({dec['best']}) {dec['rollout_tokens_per_s']:.0f} tok/s vs "
                         f"HF generate {dec['hf_generate_tokens_per_s']:.0f} at batch "
                         f"{dec['batch']} ({dec['ratio_to_hf_generate']:.2f}x)")
        for label, tps in dec.get("generate_tokens_per_s", {}).items():
            lines.append(f"{label}: {tps:.0f} tok/s at batch {dec['batch']}")
    if data.get("overlay_static_because"):
        lines.append(f"overlay decoded static: {data['overlay_static_because']}")
    for name, r in data.get("overlay", {}).get("runs", {}).items():
        lines.append(f"overlay {name}: {r['wall_s']:.1f} s, {r['updates_per_s']:.3f} upd/s, "
                     f"{r['tokens_per_s']:.0f} tok/s, weights {r['weight_transport']} "
                     f"{r['weight_per_version_s'] * 1000:.1f} ms/version, "
                     f"rollout weights {r['rollout_dtype']}, gpu peak {r['gpu_peak_bytes']}")
    for label, b in data.get("live_vs_virtual", {}).items():
        for cfg, e in b["configs"].items():
            lines.append(
                f"{label} {cfg}: live {e['live']['updates_per_s']['median']:.3f} upd/s, "
                f"virtual {e['virtual']['updates_per_s']:.3f} "
                f"({e['virtual_error']['updates_per_s_rel']:+.1%}); stale drops live "
                f"{e['live']['stale_drop_rate']['median']:.3f}, virtual "
                f"{e['virtual']['stale_drop_rate']:.3f}")
    return "\n".join(lines)


def compare(derived_path: str, measured_path: str) -> str:
    """Markdown: each term of a derived profile beside a calibrated one, with the ratio
    measured / derived, per coefficient and priced at the paper's sizes."""
    from rlcore.clock.profile import load_profile
    from rlcore.clock.work import Decode, Handle, Prefill, Update, Weights, Work

    state = 1976131072  # Qwen2.5-0.5B's fp32 state, the stand-in's too
    # the paper's sizes (config/paper.yaml): 4 rows, ~40 prompt tokens, up to 96 new ones
    at_size: dict[str, Work] = {
        "decode step, 4 rows, 56 positions": Decode(steps=1, rows=4, row_context=224),
        "prefill, 4 rows of 40": Prefill(calls=1, tokens=160),
        "update, 4 rows of 136": Update(tokens=544),
        "weight write, 1.976 GB": Weights("write", state),
        "weight read, 1.976 GB": Weights("read", state),
        "controller, a message of 4": Handle(samples=4)}

    derived, measured = load_profile(derived_path), load_profile(measured_path)
    d, m = derived.to_dict(), measured.to_dict()

    def ratio(a: float, b: float) -> str:
        return f"{b / a:.2f}" if a else ("=" if a == b else "-")

    rows = [f"| term | {derived.name} | {measured.name} | measured / derived |",
            "|---|---|---|---|"]
    for section, fields in d.items():
        if not isinstance(fields, dict):
            continue
        for key, a in fields.items():
            b = (m.get(section) or {}).get(key)
            if isinstance(a, int | float) and isinstance(b, int | float):
                rows.append(f"| {section}.{key} | {a:.3g} | {b:.3g} | {ratio(a, b)} |")
    rows.append("| **priced at the paper's sizes** | s | s | |")
    for label, w in at_size.items():
        a, b = derived.seconds(w), measured.seconds(w)
        rows.append(f"| {label} | {a:.4g} | {b:.4g} | {ratio(a, b)} |")
    return "\n".join(rows)


def limit(text: str) -> tuple[str, float]:
    """`STEP=SECONDS` of --limit."""
    name, _, seconds = text.partition("=")
    if name not in LIMITS or not seconds:
        raise argparse.ArgumentTypeError(f"--limit {text!r}: give STEP=SECONDS, STEP one of "
                                         f"{', '.join(LIMITS)}")
    return name, float(seconds)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter,
        epilog="stages, each one device command, worst case on a bare machine:\n"
               + budget_table())
    p.add_argument("--out", type=Path, help="results folder ($OUT)")
    p.add_argument("--stage", choices=[*STAGES, "all"], default="all")
    p.add_argument("--wheels", type=Path,
                   help="first install these wheels (tools/device_wheels.py's .whl) into "
                        "WORK/site, ahead of the image's packages for every step")
    p.add_argument("--work", type=Path, default=Path("/tmp/gpu-check"),
                   help="models, runs, logs and the record (kept between the stages of one "
                        "machine)")
    p.add_argument("--device", default="cuda:0", help="both roles' device")
    p.add_argument("--size", choices=["0.5b", "tiny"], default="0.5b",
                   help="the stand-in: 0.5b on a GPU, tiny for a dry run")
    p.add_argument("--limit", type=limit, action="append", default=[], metavar="STEP=S",
                   help="seconds STEP may take (defaults: "
                        + ", ".join(f"{k} {v:g}" for k, v in LIMITS.items()) + ")")
    p.add_argument("--budget", action="store_true",
                   help="instead: print each stage's worst case and exit")
    p.add_argument("--compare", nargs=2, metavar=("DERIVED", "MEASURED"),
                   help="instead: a derived profile beside a calibrated one, term by term")
    p.add_argument("--machine", type=Path, metavar="FILE",
                   help="instead: write the machine's description (for --device) to FILE")
    return p


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    """Parsed arguments made whole: absolute folders, the stand-in's place, the limits."""
    args.limits = {**LIMITS, **dict(args.limit)}
    args.out = args.out.resolve() if args.out else None
    args.work = args.work.resolve()
    args.model = args.work / f"stand-in-{args.size}"
    args.wheels = args.wheels.resolve() if args.wheels else None
    return args


def step_commands(argv: list[str] | None = None) -> list[list[str]]:
    """Every step's command line as a GPU run would give it (what the stages run)."""
    args = resolve(parser().parse_args(["--out", "/tmp/gpu-check-out", *(argv or [])]))
    return list(commands(args, {"gpu": "NVIDIA H200"}).values())


def main() -> int:
    p = parser()
    args = resolve(p.parse_args())
    if args.budget:
        print(budget_table(args.limits))
        return 0
    if args.compare:
        print(compare(*args.compare))
        return 0
    if args.machine:
        args.machine.write_text(json.dumps(environment(args.device), indent=1) + "\n")
        return 0
    if args.out is None:
        p.error("--out is required (or --budget, --compare, --machine)")
    # every step imports the carried wheels ahead of the image's packages, and this rlcore
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [*([str(args.work / "site")] if args.wheels else []), str(ROOT),
         *filter(None, [os.environ.get("PYTHONPATH")])])
    check = Check(args.out, args.work, args.limits)
    for n in STAGES if args.stage == "all" else [args.stage]:
        run_stage(check, args, n)
    print("\n" + table(check.data), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
