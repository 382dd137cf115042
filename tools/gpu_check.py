#!/usr/bin/env python3
"""rlcore's CUDA path and the virtual clock checked on one GPU, in three stages.

  stage 1  the machine (device, torch, transformers, driver), `pytest -m cuda`, the
           Qwen2.5-0.5B-architecture stand-in built on the machine, and `rlcore smoke` of
           config/paper.yaml in every mode with both roles on the one GPU;
  stage 2  `rlcore calibrate` of the stand-in on the GPU (a profile named after the card),
           then one short config, the paper's preset at K = 2, live and under the
           virtual clock on that profile, AReaL-style and sync (`rlcore bench --virtual`);
  stage 3  the runtime at GPU speed: `pytest -m cuda`, a policy version of the stand-in
           through each weight transport, the sampler's token under each decoder at batch
           4, 32 and 64 against HF generate (rlcore/measure/device_probe.py), and the
           paper's pipeline on one GPU end to end (config/gpu-smoke.yaml over
           config/paper.yaml, Snakemake and its report), with each run's seconds,
           updates/s, tokens/s, weight hand-over and peak GPU memory. On a machine without
           a registry, carry the wheels of tools/device_wheels.py.

Every step runs as its own process with a time limit, and `gpu_check.json` under --out is
rewritten after each one, so a step that fails or runs out of time loses nothing that the
steps before it measured. The logs and the smoke's run records go into one archive per
stage (the device tool returns at most 8 files). A short table is printed last.

A dry run on a CPU (`--device cpu --size tiny`) goes through every step in a minute or two,
so that a GPU call cannot fail on a typo. Run from the repository root, with rlcore on
PYTHONPATH or installed: `python3 tools/gpu_check.py --out OUT --stage 1`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "config/paper.yaml"
# The paper's preset (config/paper.yaml, presets.paper) at K = 2, short and chunked.
PAPER = ["preset_name=paper", "staleness.staleness_control=filter",
          "staleness.interrupt=resubmit"]


def sizes(size: str) -> dict[str, Any]:
    """How much each step does: the real stand-in on a GPU, or a tiny one for a dry run."""
    if size == "0.5b":
        return {"smoke_updates": 3, "max_new_tokens": 32, "chunk_tokens": 8,
                "bench_updates": 24, "calibrate_repeats": 2, "transport_repeats": 5,
                "decode_batches": [4, 32, 64], "decode_steps": 32, "overlay": {}}
    # a dry run on CPU: the overlay's runs on the CPU, short
    return {"smoke_updates": 2, "max_new_tokens": 8, "chunk_tokens": 4,
            "bench_updates": 4, "calibrate_repeats": 1, "transport_repeats": 2,
            "decode_batches": [4, 8], "decode_steps": 4,
            "overlay": {"run": {"model": {"rollout_device": "cpu", "trainer_device": "cpu",
                                          "dtype": "fp32"},
                                "train": {"updates": 2},
                                "rollout": {"max_new_tokens": 8},
                                "eval": {"heldout_tasks": 8}}}}


class Check:
    """The steps' results, rewritten to OUT/gpu_check.json after each step."""

    def __init__(self, out: Path, work: Path):
        self.out, self.work = out, work
        self.path = out / "gpu_check.json"
        self.data: dict[str, Any] = (json.loads(self.path.read_text())
                                     if self.path.is_file() else {"steps": {}})
        (work / "logs").mkdir(parents=True, exist_ok=True)

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1) + "\n")
        tmp.replace(self.path)

    def start(self, name: str, cmd: list[str], env: dict[str, str] | None = None
              ) -> tuple[subprocess.Popen[str], float, Path]:
        log = self.work / "logs" / f"{name}.log"
        print(f"--> {name}: {' '.join(cmd)}", flush=True)
        f = log.open("w")
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
                                start_new_session=True)
        return proc, time.perf_counter(), log

    def finish(self, name: str, started: tuple[subprocess.Popen[str], float, Path],
               timeout: float) -> bool:
        proc, t0, log = started
        try:
            code: int | None = proc.wait(timeout=max(1.0, timeout - (time.perf_counter() - t0)))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            code = None
        seconds = time.perf_counter() - t0
        tail = log.read_text(errors="replace").splitlines()[-25:]
        status = "timeout" if code is None else ("ok" if code == 0 else f"exit {code}")
        self.data["steps"][name] = {"status": status, "seconds": round(seconds, 1),
                                    "tail": tail if status != "ok" else tail[-6:]}
        self.save()
        print(f"<-- {name}: {status} in {seconds:.1f} s", flush=True)
        if status != "ok":
            print("\n".join(f"    {line}" for line in tail[-12:]), flush=True)
        return status == "ok"

    def step(self, name: str, cmd: list[str], timeout: float,
             env: dict[str, str] | None = None) -> bool:
        return self.finish(name, self.start(name, cmd, env), timeout)

    def archive(self, stage: str, extra: list[Path]) -> None:
        """The logs and small run records of this stage in one archive under OUT."""
        with tarfile.open(self.out / f"stage{stage}.tar.gz", "w:gz") as tar:
            for path in [self.work / "logs", *extra]:
                if not path.exists():
                    continue
                for f in sorted(path.rglob("*") if path.is_dir() else [path]):
                    if f.is_file() and f.suffix in {".json", ".jsonl", ".log", ".yaml",
                                                    ".txt"} and f.stat().st_size < 4e6:
                        tar.add(f, arcname=str(f.relative_to(self.work)))


def environment(device: str) -> dict[str, Any]:
    """The machine: device, driver, torch, transformers, CPU."""
    import torch
    import transformers

    env: dict[str, Any] = {
        "python": platform.python_version(), "torch": torch.__version__,
        "torch_cuda": torch.version.cuda, "transformers": transformers.__version__,
        "cpu": next((line.split(":", 1)[1].strip() for line in
                     Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name")), platform.processor()),
        "cpu_count": os.cpu_count(), "device": device}
    if device.startswith("cuda") and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(device)
        env.update(gpu=props.name, gpu_memory_bytes=props.total_memory,
                   multiprocessors=props.multi_processor_count,
                   capability=f"{props.major}.{props.minor}")
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


def build_command(py: list[str], args: argparse.Namespace) -> list[str]:
    """The stand-in's build as a process of its own (kept if already built)."""
    return [*py, "-c", "import sys; from rlcore.policy.stand_in import build_stand_in; "
            "print(build_stand_in(sys.argv[1], sys.argv[2]))", str(args.model), args.size]


def stage1(check: Check, args: argparse.Namespace, py: list[str]) -> None:
    env = environment(args.device)
    check.data["env"] = env
    check.save()
    print(json.dumps(env, indent=1), flush=True)
    n = sizes(args.size)
    # the tests build their own tiny model; the stand-in build is CPU work beside them
    tests = check.start("pytest_cuda", [*py, "-m", "pytest", "-m", "cuda", "-q", "-rs",
                                        "-p", "no:cacheprovider", "tests/test_cuda.py"])
    build = check.start("stand_in", build_command(py, args))
    check.finish("stand_in", build, args.limit_build)
    check.finish("pytest_cuda", tests, args.limit_tests)
    check.data["pytest_cuda"] = pytest_counts(check.work / "logs" / "pytest_cuda.log")
    check.save()
    smoke_out = check.work / "smoke"
    check.step("smoke", [*py, "-m", "rlcore", "smoke", CONFIG, "--model", str(args.model),
                         "--device", args.device, "--out", str(smoke_out),
                         "--updates", str(n["smoke_updates"]),
                         "--max-new-tokens", str(n["max_new_tokens"])], args.limit_smoke)
    if (smoke_out / "smoke.json").is_file():
        check.data["smoke"] = json.loads((smoke_out / "smoke.json").read_text())
        check.save()
    check.archive("1", [smoke_out])


def run_sets(args: argparse.Namespace) -> list[str]:
    """The short config of stage 2: the stand-in, both roles on the device."""
    n = sizes(args.size)
    return [f"model.path={args.model}", f"model.rollout_device={args.device}",
            f"model.trainer_device={args.device}",
            f"rollout.max_new_tokens={n['max_new_tokens']}",
            f"rollout.chunk_tokens={n['chunk_tokens']}", "runtime.save_policy=false"]


def stage2(check: Check, args: argparse.Namespace, py: list[str]) -> None:
    env = check.data.get("env") or environment(args.device)
    check.data["env"] = env
    n = sizes(args.size)
    sets = run_sets(args)
    name = f"{card_name(env)}-qwen0.5b" if args.size == "0.5b" else "dry-run-tiny"
    profile = check.out / f"{name}.yaml"
    if not args.model.is_dir():
        check.step("stand_in", build_command(py, args), args.limit_build)
    ok = check.step("calibrate", [*py, "-m", "rlcore", "calibrate", CONFIG, "--out",
                                  str(profile), "--name", name, "--repeats",
                                  str(n["calibrate_repeats"]),
                                  *[a for s in sets for a in ("--set", s)]],
                    args.limit_calibrate)
    check.data["profile"] = str(profile.name) if ok else None
    check.save()
    if ok:
        for label, mode_sets in (("areal", ["mode=areal", "staleness.staleness_k=2", *PAPER]),
                                 ("sync", ["mode=sync", "staleness.staleness_k=0"])):
            result = check.work / f"bench-{label}.json"
            check.step(f"bench_{label}", [
                *py, "-m", "rlcore", "bench", CONFIG, "--virtual", "--updates",
                str(n["bench_updates"]), "--repeats", "1", "--out", str(result),
                *[a for s in [*sets, *mode_sets, f"runtime.hardware={profile}"]
                  for a in ("--set", s)]], args.limit_bench)
            if result.is_file():
                check.data.setdefault("live_vs_virtual", {})[label] = json.loads(
                    result.read_text())
                check.save()
    check.archive("2", [check.work / f"bench-{x}.json" for x in ("areal", "sync")])


OVERLAY = "config/gpu-smoke.yaml"
STAND_IN_LINK = ROOT / "models" / "qwen2.5-0.5b-stand-in"  # where OVERLAY reads the model


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


def stage3(check: Check, args: argparse.Namespace, py: list[str]) -> None:
    env = check.data.get("env") or environment(args.device)
    check.data["env"] = env
    check.save()
    n = sizes(args.size)
    # `pytest -m cuda` beside the stand-in's build (CPU work), as in stage 1
    tests = check.start("pytest_cuda", [*py, "-m", "pytest", "-m", "cuda", "-q", "-rs",
                                        "-p", "no:cacheprovider", "tests/test_cuda.py"])
    if not args.model.is_dir():
        check.step("stand_in", build_command(py, args), args.limit_build)
    check.finish("pytest_cuda", tests, args.limit_tests)
    check.data["pytest_cuda"] = pytest_counts(check.work / "logs" / "pytest_cuda.log")
    check.save()
    probes = {"transport": ["--repeats", str(n["transport_repeats"])],
              "decode": ["--batches", *map(str, n["decode_batches"]), "--steps",
                         str(n["decode_steps"]),
                         "--dtype", "fp16" if args.device.startswith("cuda") else "fp32"]}
    for probe, extra in probes.items():
        result = check.work / f"{probe}.json"
        check.step(probe, [*py, "-m", "rlcore.measure.device_probe", probe, str(args.model),
                           "--device", args.device, "--out", str(result), *extra],
                   getattr(args, f"limit_{probe}"))
        if result.is_file():
            check.data[probe] = json.loads(result.read_text())
            check.save()
    if not STAND_IN_LINK.exists():
        STAND_IN_LINK.parent.mkdir(exist_ok=True)
        STAND_IN_LINK.symlink_to(args.model.resolve())
    results = check.work / "gpu-smoke"
    local = check.work / "overlay-local.json"  # JSON is YAML: a third config file
    overlay = overlay_config(n["overlay"], check.data.get("decode", {}).get("errors", {}))
    check.data["overlay_config"] = overlay
    local.write_text(json.dumps({"results": str(results), **overlay}))
    snakemake = [*py, "-m", "snakemake", "--cores", "all", "--resources", "gpu=1",
                 "--rerun-incomplete", "--configfile", CONFIG, OVERLAY, str(local),
                 "--replace-workflow-config"]
    # the jobs call `python` and `rlcore`: this interpreter's, as `make run` puts the venv's
    # first (where rlcore is not installed, `rlcore` is a shim running `python -m rlcore`)
    shims = check.work / "bin"
    shims.mkdir(exist_ok=True)
    (shims / "rlcore").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m rlcore "$@"\n')
    (shims / "rlcore").chmod(0o755)
    path = {"PATH": os.pathsep.join([str(shims), str(Path(sys.executable).parent),
                                     os.environ.get("PATH", "")])}
    if check.step("overlay", snakemake, args.limit_overlay, path):
        check.step("overlay_report", [*snakemake, "--report", str(results / "report.html")],
                   args.limit_report, path)
    check.data["overlay"] = overlay_figures(results)
    check.save()
    check.archive("3", [check.work / "transport.json", check.work / "decode.json",
                        results / "tables", *results.glob("runs/**/summary.json")])


def overlay_config(overlay: dict[str, Any], decode_errors: dict[str, str]) -> dict[str, Any]:
    """The overlay's own settings; with `model.decode: static` where the captured step failed
    in the decode probe, so that the pipeline's run still answers (the failure is recorded
    there)."""
    if not any(kind.startswith("graph") for kind in decode_errors):
        return overlay
    run = overlay.get("run", {})
    return {**overlay, "run": {**run, "model": {**run.get("model", {}), "decode": "static"}}}


def table(data: dict[str, Any]) -> str:
    """The short table printed last."""
    lines = [f"{k}: {v['status']} ({v['seconds']} s)" for k, v in data["steps"].items()]
    env = data.get("env", {})
    lines.insert(0, f"{env.get('gpu', env.get('device'))}, torch {env.get('torch')}, "
                    f"transformers {env.get('transformers')}, driver {env.get('driver')}")
    if "pytest_cuda" in data:
        lines.append(f"pytest -m cuda: {data['pytest_cuda']}")
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="results folder ($OUT)")
    p.add_argument("--compare", nargs=2, metavar=("DERIVED", "MEASURED"),
                   help="instead: a derived profile beside a calibrated one, term by term")
    p.add_argument("--work", type=Path, default=Path("/tmp/gpu-check"),
                   help="models, runs and logs (kept between the stages of one machine)")
    p.add_argument("--stage", choices=["1", "2", "3", "all"], default="all")
    p.add_argument("--device", default="cuda:0", help="both roles' device")
    p.add_argument("--size", choices=["0.5b", "tiny"], default="0.5b",
                   help="the stand-in: 0.5b on a GPU, tiny for a dry run")
    for step, limit in (("build", 150), ("tests", 180), ("smoke", 200), ("calibrate", 170),
                        ("bench", 130), ("transport", 60), ("decode", 90), ("overlay", 240),
                        ("report", 60)):
        p.add_argument(f"--limit-{step}", type=float, default=limit,
                       help=f"seconds the {step} step may take (default {limit})")
    args = p.parse_args()
    if args.compare:
        print(compare(*args.compare))
        return 0
    if args.out is None:
        p.error("--out is required (or --compare)")
    args.out.mkdir(parents=True, exist_ok=True)
    args.model = args.work / f"stand-in-{args.size}"
    check = Check(args.out, args.work)
    py = [sys.executable]
    if args.stage in ("1", "all"):
        stage1(check, args, py)
    if args.stage in ("2", "all"):
        stage2(check, args, py)
    if args.stage in ("3", "all"):
        stage3(check, args, py)
    print("\n" + table(check.data), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
