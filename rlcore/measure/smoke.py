"""`rlcore smoke`: a config's code path end to end at its real model size, a few updates per
mode, with what each mode costs.

Each mode runs as its own `rlcore run` process (so one mode's memory never counts in
another's), then `rlcore eval` scores its final policy, watched from outside by
`memory_watch.TreeWatch`. Recorded per mode: seconds per update, generated tokens/s, weight
sync per version against one copy of the same state onto the rollout device, the peak
resident set of every process, the peak use of /dev/shm, and on a GPU each role's allocator
peak. `make paper-smoke` runs config/paper.yaml on a randomly initialised Qwen2.5-0.5B-size
stand-in (`rlcore.policy.stand_in`) on CPU.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlcore.config import ConfigError, RunConfig, load_config
from rlcore.measure.memory_watch import TreeWatch
from rlcore.policy.device import wait_for
from rlcore.policy.model_dir import check_model_dir
from rlcore.record.rundir import atomic_write_json

RESULT_FILE = "smoke.json"
GIB = 1024**3


def run_overrides(mode: str, model: str, updates: int, max_new_tokens: int, eval_tasks: int,
                  staleness_k: int, device: str | None) -> list[str]:
    """The --set overrides that cut a config down to a smoke run of `mode`."""
    out = [f"mode={mode}", f"model.path={model}", f"train.updates={updates}",
           f"rollout.max_new_tokens={max_new_tokens}", f"eval.heldout_tasks={eval_tasks}",
           f"staleness.staleness_k={0 if mode == 'sync' else staleness_k}",
           "runtime.save_policy=true", "runtime.progress_every=1"]
    if device is not None:
        out += [f"model.rollout_device={device}", f"model.trainer_device={device}"]
    return out


def _watched(cmd: list[str], log: Path, prefix: str) -> tuple[TreeWatch, float]:
    """Run cmd, echoing its output with a prefix into the console and into log, watching
    its process tree; raises with the output's tail if it fails."""
    t0 = time.perf_counter()
    tail: list[str] = []
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, bufsize=1)
        watch = TreeWatch(proc.pid).start()
        assert proc.stdout is not None
        for line in proc.stdout:
            f.write(line)
            print(f"[{prefix}] {line}", end="", flush=True)
            tail = [*tail[-19:], line]
        code = proc.wait()
        watch.stop()
    if code != 0:
        raise ConfigError(f"smoke: `{' '.join(cmd)}` exited with {code} (log: {log}):\n"
                          + "".join(tail))
    return watch, time.perf_counter() - t0


def _process_peaks(watch: TreeWatch, run_dir: Path) -> list[dict[str, Any]]:
    """Every watched process with its peak; workers named as the run's events name them."""
    names = {watch.root: "main"}
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event["type"] == "worker_ready" and event["pid"] != watch.root:
            names[event["pid"]] = event["worker"]  # threaded workers are the main process
    return [{"process": names.get(p.pid, p.label), "pid": p.pid,
             "peak_rss_bytes": p.peak_rss_bytes}
            # the main process first: pids wrap, so its workers' may be lower
            for p in sorted(watch.processes.values(), key=lambda p: (p.pid != watch.root, p.pid))]


def one_copy_s(spec: Sequence[tuple[str, tuple[int, ...], Any]], device: str = "cpu",
               reps: int = 5) -> float:
    """Best-of-reps seconds of one copy of a state with these shapes and dtypes from host
    memory onto `device`: what a rollout worker's reload from the weight slots must do."""
    import torch

    from rlcore.measure.bench import copy_best_s

    src = [torch.zeros(shape, dtype=dtype) for _, shape, dtype in spec]
    dst = [torch.empty_like(t, device=device) for t in src]
    return copy_best_s(dst, src, reps)


def clean_generate(model: Any, config: Any, **inputs: Any) -> Any:
    """HF `generate` under `config` (a GenerationConfig) alone. transformers fills what a
    config leaves unset from the model's generation_config.json, as Qwen's and the
    stand-in's repetition_penalty 1.05, so that file is set aside for the call."""
    from transformers import GenerationConfig

    own = model.generation_config
    model.generation_config = GenerationConfig()
    try:
        return model.generate(generation_config=config, **inputs)
    finally:
        model.generation_config = own


def generate_comparison(cfg: RunConfig, reps: int = 3) -> dict[str, Any]:
    """Rollout sampling (chunked, with a KV cache) against HF `generate` on the same device,
    prompts and batch (a training batch of the config), interleaved `reps` times after one
    warm-up each; medians of generated tokens/s. Both sample at the config's temperature
    with no top-k, top-p or repetition penalty, and both stop at the model's stop ids."""
    import torch
    from transformers import GenerationConfig

    from rlcore.kernels import pin
    from rlcore.policy.hf_policy import HFPolicy
    from rlcore.policy.sampler import Draws
    from rlcore.runners.common import preflight
    from rlcore.tasks.prompts import PromptStream

    pin(cfg)
    policy = HFPolicy(cfg.model, cfg.train, role="rollout")
    ro = cfg.rollout
    groups = cfg.train.update_batch_size // ro.group_size
    prompts = [policy.encode_prompt(p.task.prompt, p.task.system)
               for p in PromptStream(preflight(cfg), cfg.seed).take(groups)
               for _ in range(ro.group_size)]
    width = max(map(len, prompts))
    pad = policy.pad_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=policy.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts],
                        device=policy.device)
    hf_config = GenerationConfig(
        do_sample=True, temperature=ro.temperature, top_k=0, top_p=1.0,
        max_new_tokens=ro.max_new_tokens, eos_token_id=sorted(policy.stop_ids),
        pad_token_id=pad)

    def sync() -> None:
        wait_for([policy.device])

    def ours(rep: int) -> tuple[int, float]:
        sync()
        t0 = time.perf_counter()
        gens = policy.generate(prompts, max_new_tokens=ro.max_new_tokens,
                               temperature=ro.temperature, chunk_tokens=ro.chunk_tokens,
                               draws=Draws(cfg.seed + rep, [(i, 0) for i in range(len(prompts))]))
        sync()
        return sum(len(g.response_ids) for g in gens), time.perf_counter() - t0

    def hf(rep: int) -> tuple[int, float]:
        torch.manual_seed(cfg.seed + rep)
        sync()
        t0 = time.perf_counter()
        with torch.no_grad(), policy.autocast():
            out = clean_generate(policy.model, hf_config, input_ids=ids, attention_mask=mask)
        sync()
        elapsed = time.perf_counter() - t0
        new = out[:, width:].tolist()
        # a row's tokens up to and including its first stop id; the rest is padding
        tokens = sum(next((j + 1 for j, t in enumerate(r) if t in policy.stop_ids), len(r))
                     for r in new)
        return tokens, elapsed

    ours(-1)
    hf(-1)  # warm-up: first calls allocate and pick kernels
    rates: dict[str, list[float]] = {"rollout": [], "hf_generate": []}
    for rep in range(reps):
        for name, fn in (("rollout", ours), ("hf_generate", hf)):
            tokens, elapsed = fn(rep)
            rates[name].append(tokens / elapsed)
    med = {k: statistics.median(v) for k, v in rates.items()}
    return {"device": str(policy.device), "batch": len(prompts),
            "max_new_tokens": ro.max_new_tokens, "chunk_tokens": ro.chunk_tokens,
            "reps": reps, "tokens_per_s": rates,
            "rollout_tokens_per_s": med["rollout"], "hf_generate_tokens_per_s":
            med["hf_generate"], "ratio_to_hf_generate": med["rollout"] / med["hf_generate"]}


def mode_figures(summary: dict[str, Any], evaluation: dict[str, Any], run: TreeWatch,
                 run_s: float, run_dir: Path, scored: TreeWatch, eval_s: float,
                 copy_s: float) -> dict[str, Any]:
    """One mode's figures from its summary, its eval and the watches of both processes."""
    sync = summary["scheduling"]["weight_sync"]
    processes = _process_peaks(run, run_dir)
    return {
        "updates": summary["updates"],
        "job_s": run_s,
        "cold_start_s": summary["time"]["cold_start_s"],
        "wall_s": summary["time"]["wall_s"],
        "s_per_update": summary["time"]["wall_s"] / summary["updates"],
        "generated_tokens": summary["tokens"]["generated"],
        "trained_tokens": summary["tokens"]["trained"],
        # generated counts what rollout ran ahead and the run ended before training
        "tokens_per_s": summary["metrics"]["tokens_per_s"],
        "trained_tokens_per_s": summary["tokens"]["trained"] / summary["time"]["wall_s"],
        "weight_sync": {**sync, "one_copy_s": copy_s,
                        "per_version_vs_one_copy": sync["per_version_s"] / copy_s
                        if sync["reloads"] else None},
        "processes": processes,
        "peak_rss_max_bytes": max(p["peak_rss_bytes"] for p in processes),
        "machine_peak_bytes": run.machine_peak_bytes,
        "shm_peak_bytes": run.shm_peak_bytes,
        "gpu_peak_bytes": summary["gpu_peak_bytes"],
        "eval": {"tasks": evaluation["tasks"],
                 "greedy_pass_rate": evaluation["greedy_pass_rate"],
                 "sampled_pass_rate": evaluation["sampled_pass_rate"],
                 "eval_s": evaluation["eval_s"], "job_s": eval_s,
                 "peak_rss_bytes": max(p.peak_rss_bytes for p in scored.processes.values())},
    }


def smoke(config: str, out_dir: Path, *, model: str | None, modes: Sequence[str],
          updates: int, max_new_tokens: int, eval_tasks: int, staleness_k: int,
          device: str | None, overrides: Sequence[str] = (),
          compare_generate: bool = True) -> dict[str, Any]:
    """Run and score each mode, then (compare_generate) time rollout sampling against HF
    `generate`; smoke.json is rewritten after each step, so a failure keeps what the steps
    before it measured."""
    from rlcore.policy.device import resolve_device
    from rlcore.runners.asynchronous.weight_slots import spec_bytes, trainable_spec

    base = load_config(config, overrides)  # a bad config or override fails here, at once
    model = str(check_model_dir(model or base.model.path))
    sets = {mode: [*overrides, *run_overrides(mode, model, updates, max_new_tokens,
                                               eval_tasks, staleness_k, device)]
            for mode in {*modes, "sync"}}
    resolved = {mode: load_config(config, s) for mode, s in sets.items()}  # all, up front
    spec = trainable_spec(model, base.train.lora)  # under train.lora: the adapters
    rollout_device = str(resolve_device(resolved["sync"].model.rollout_device, "rollout"))
    state_bytes = spec_bytes(spec)
    result: dict[str, Any] = {
        "config": config, "model": model,
        "settings": {"updates": updates, "max_new_tokens": max_new_tokens,
                     "eval_tasks": eval_tasks, "staleness_k": staleness_k, "device": device,
                     "overrides": list(overrides), "update_batch_size":
                     base.train.update_batch_size, "threads_per_role":
                     base.runtime.threads_per_role},
        "state": {"tensors": len(spec), "fp32_bytes": state_bytes,
                  "areal_weight_slots_bytes": state_bytes * (base.runtime.trainer_workers + 1)},
        "one_copy_device": rollout_device,
        "one_copy_s": one_copy_s(spec, rollout_device),
        "modes": {},
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    rlcore = [sys.executable, "-m", "rlcore"]
    for mode in modes:
        run_dir = out_dir / mode
        args = [a for o in sets[mode] for a in ("--set", o)]
        run, run_s = _watched([*rlcore, "run", config, "--out", str(run_dir), "--force",
                               "--exit-with-parent", *args], out_dir / f"{mode}.log", mode)
        scored, eval_s = _watched([*rlcore, "eval", str(run_dir)],
                                  out_dir / f"{mode}-eval.log", f"{mode} eval")
        result["modes"][mode] = mode_figures(
            json.loads((run_dir / "summary.json").read_text()),
            json.loads((run_dir / "eval.json").read_text()), run, run_s, run_dir, scored,
            eval_s, result["one_copy_s"])
        atomic_write_json(out_dir / RESULT_FILE, result)
    if compare_generate:
        print("[generate] rollout sampling against HF generate, same batch and device",
              flush=True)
        result["generate"] = generate_comparison(resolved["sync"])
        atomic_write_json(out_dir / RESULT_FILE, result)
    return result


def _size(n: int) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB / 10 else f"{n / 2**20:.1f} MiB"


def table(result: dict[str, Any]) -> str:
    """The figures of smoke.json as plain text: a row per mode, then each mode's processes."""
    rows = [("mode", "job s", "cold start s", "s/update", "tokens/s gen", "trained",
             "weight sync", "vs 1 copy", "RSS max", "machine peak", "/dev/shm peak",
             "eval greedy pass", "eval job s")]
    for mode, m in result["modes"].items():
        ws = m["weight_sync"]
        rows.append((mode, f"{m['job_s']:.1f}", f"{m['cold_start_s']:.1f}",
                     f"{m['s_per_update']:.2f}", f"{m['tokens_per_s']:.2f}",
                     f"{m['trained_tokens_per_s']:.2f}",
                     f"{ws['per_version_s'] * 1000:.1f} ms" if ws["reloads"] else "in place",
                     f"{ws['per_version_vs_one_copy']:.1f}x" if ws["reloads"] else "-",
                     _size(m["peak_rss_max_bytes"]), _size(m["machine_peak_bytes"]),
                     _size(m["shm_peak_bytes"]),
                     f"{m['eval']['greedy_pass_rate']:.3f} of {m['eval']['tasks']}",
                     f"{m['eval']['job_s']:.1f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
             for r in rows]
    lines.append(f"one copy of the state ({_size(result['state']['fp32_bytes'])}) from host "
                 f"memory to {result['one_copy_device']}: "
                 f"{result['one_copy_s'] * 1000:.3g} ms; peak RSS per process:")
    for mode, m in result["modes"].items():
        lines.append(f"  {mode}: " + ", ".join(f"{p['process']} {_size(p['peak_rss_bytes'])}"
                                               for p in m["processes"])
                     + f"; eval {_size(m['eval']['peak_rss_bytes'])}")
    on_gpu = {mode: {r: b for r, b in m["gpu_peak_bytes"].items() if b is not None}
              for mode, m in result["modes"].items()}
    if any(on_gpu.values()):
        lines.append("peak GPU memory (torch's allocator) per role; one process's in sync and "
                     "threaded async:")
        lines += [f"  {mode}: " + ", ".join(f"{r} {_size(b)}" for r, b in peaks.items())
                  for mode, peaks in on_gpu.items() if peaks]
    if "generate" in result:
        g = result["generate"]
        lines.append(f"sampling on {g['device']}, batch {g['batch']} x {g['max_new_tokens']} "
                     f"tokens, median of {g['reps']}: rollout {g['rollout_tokens_per_s']:.1f} "
                     f"tokens/s, HF generate {g['hf_generate_tokens_per_s']:.1f} "
                     f"({g['ratio_to_hf_generate']:.2f}x)")
    return "\n".join(lines)
