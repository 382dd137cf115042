"""CUDA's rules checked on a real GPU, for `tools/gpu_check.py` (stage 1): what the CPU tests
(`tests/test_cuda_rules.py`) check against a fake `torch.cuda`, here against the driver.

  captures_at_once     two threads capture their decode steps at the same moment, each into
                       its own pool; both graphs replay the eager step's logits;
  capture_beside_waits one thread captures buckets while another copies weights through
                       device slots and waits on its stream, as the threaded runner's trainer
                       does;
  pinned_three_times   pinned slots made, copied through, closed and freed three times, then
                       two threads' first copies at once; a kernel runs after each
                       (skipped where /dev/shm cannot hold the slots);
  other_device         (two GPUs or more) a step captured and replayed on cuda:1 from a thread
                       whose current device is cuda:0 gives the eager step's logits;
  scaler_overflow      (with --model) an fp16 update whose scaler overflows on every step:
                       recorded as skipped, a skipped commit, the weights and the optimizer's
                       state untouched (each mode's runs with a forced overflow are cuda
                       tests: tests/test_scaler_skips.py).

`python -m rlcore.measure.cuda_checks --out FILE [--device cuda:0] [--model DIR]`. Each check
is written to FILE as it ends, with its seconds and `ok`, or its error; the module exits 1 if
any failed. On a CPU every check is recorded as skipped, which is its dry run.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlcore.config import ConfigError
from rlcore.policy.decoders import cache_keyword
from rlcore.policy.device import bind, wait_for
from rlcore.policy.graphs import GraphPool
from rlcore.record.rundir import atomic_write_json
from rlcore.runners.asynchronous.vehicles import Threads
from rlcore.runners.asynchronous.weight_slots import (
    ParamSpec,
    WeightSlots,
    check_shared_memory,
    shared_memory_free,
)

TOLERANCE = 1e-3  # a captured step against the same step eager, fp32 on one device


def small_qwen2(device: torch.device, seed: int) -> Qwen2ForCausalLM:
    """A random four-layer Qwen2 on `device`: big enough for real kernels, quick to capture."""
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=512, hidden_size=256, intermediate_size=512,
                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=1024, tie_word_embeddings=True)
    config._attn_implementation = "sdpa"
    return Qwen2ForCausalLM(config).eval().to(device)


def replay_matches_eager(pool: GraphPool) -> float:
    """The largest difference between each bucket's replay and its step run eagerly."""
    worst = 0.0
    for b in pool.buckets.values():
        g = torch.Generator(device="cpu").manual_seed(b.rows)
        b.tok.copy_(torch.randint(0, 512, b.tok.shape, generator=g))
        b.pos.fill_(3)
        b.col.fill_(3)
        b.mask.zero_()
        b.mask[:, :4] = True
        with torch.no_grad():
            eager = b.step().float()
        replayed = b.run(contextlib.nullcontext).float()
        worst = max(worst, (eager - replayed).abs().max().item())
    return worst


def in_threads(*fns: Callable[[], None]) -> list[str]:
    """Run each in its own thread at once; the errors they raised."""
    errors: list[str] = []

    def run(fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as e:  # noqa: BLE001 (the check's finding)
            errors.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=run, args=(f,)) for f in fns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def captures_at_once(dev: torch.device) -> dict[str, Any]:
    pools = [GraphPool(m, contextlib.nullcontext, cache_keyword(m))
             for m in (small_qwen2(dev, 0), small_qwen2(dev, 1))]
    go = threading.Barrier(2)

    def capture(pool: GraphPool) -> Callable[[], None]:
        def fn() -> None:
            bind(dev)
            go.wait()
            pool.prepare(range(1, 9), [256])
        return fn

    errors = in_threads(*(capture(p) for p in pools))
    if errors:
        raise RuntimeError("; ".join(errors))
    worst = max(replay_matches_eager(p) for p in pools)
    if worst > TOLERANCE:
        raise RuntimeError(f"a replay differs from its eager step by {worst:.3g}")
    return {"buckets": sum(len(p.buckets) for p in pools), "max_abs_diff": worst}


def capture_beside_waits(dev: torch.device) -> dict[str, Any]:
    model = small_qwen2(dev, 2)
    spec = [(n, tuple(p.shape), p.dtype) for n, p in model.named_parameters()]
    slots = WeightSlots(spec, 2, Threads().locked_array(4), shared=False, transport="device",
                        device=dev)
    params = slots.ordered(dict(model.named_parameters()))
    done = threading.Event()
    copies = [0]

    def trainer() -> None:
        bind(dev)
        while not done.is_set():
            slots.write(1, params)
            slots.publish(1, copies[0])
            slots.read_into(params)
            wait_for([dev])
            copies[0] += 1

    def rollout() -> None:
        try:
            bind(dev)
            pool = GraphPool(model, contextlib.nullcontext, cache_keyword(model))
            for span in (128, 256, 384):
                pool.prepare(range(1, 17), [span])
        finally:
            done.set()

    errors = in_threads(trainer, rollout)
    if errors:
        raise RuntimeError("; ".join(errors))
    return {"copies_beside_captures": copies[0]}


def pinned_three_times(dev: torch.device, mib: int = 256) -> dict[str, Any]:
    n = mib * 2**20 // 4
    spec: ParamSpec = [("w", (n,), torch.float32)]
    try:  # pinned slots live in /dev/shm: past its size the process dies of SIGBUS
        check_shared_memory(spec, 2, shared_memory_free())
    except ConfigError as e:
        return {"skipped": str(e)}
    gpu = [torch.randn(n, device=dev)]
    for _ in range(3):
        slots = WeightSlots(spec, 2, Threads().locked_array(4), shared=True,
                            transport="pinned")
        slots.write(0, gpu)
        slots.publish(0, 0)
        back = [torch.empty_like(gpu[0])]
        slots.read_into(back)
        if not torch.equal(back[0], gpu[0]):
            raise RuntimeError("a pinned round trip changed the weights")
        slots.close()
        del slots
        gc.collect()
        (torch.ones(1, device=dev) + 1).item()  # a sticky error would surface here
    slots = WeightSlots(spec, 2, Threads().locked_array(4), shared=True, transport="pinned")
    slots.write(0, gpu)
    slots.publish(0, 0)
    outs = [[torch.empty_like(gpu[0])] for _ in range(2)]

    def first_read(out: list[torch.Tensor]) -> Callable[[], None]:
        def fn() -> None:
            bind(dev)
            slots.read_into(out)
        return fn

    errors = in_threads(*(first_read(o) for o in outs))
    slots.close()
    (torch.ones(1, device=dev) + 1).item()
    if errors:
        raise RuntimeError("; ".join(errors))
    return {"rounds": 3, "mib": mib}


def other_device(dev: torch.device) -> dict[str, Any]:
    if torch.cuda.device_count() < 2:
        return {"skipped": "one GPU: no device other than the current one"}
    second = torch.device("cuda", 1)
    torch.cuda.set_device(0)  # the calling thread's current device is not the pool's
    model = small_qwen2(second, 3)
    pool = GraphPool(model, contextlib.nullcontext, cache_keyword(model))
    pool.prepare([4], [128])
    worst = replay_matches_eager(pool)
    if worst > TOLERANCE:
        raise RuntimeError(f"a replay on cuda:1 differs from its eager step by {worst:.3g}")
    return {"max_abs_diff": worst}


def scaler_overflow(dev: torch.device, model_dir: str) -> dict[str, Any]:
    import random

    from rlcore.config import config_from_dict
    from rlcore.measure.timings import random_batch
    from rlcore.policy.hf_policy import HFPolicy
    from rlcore.policy.optim_steps import NO_STEP_APPLIED, commit_verdict, skipped_steps

    cfg = config_from_dict({"model": {"path": model_dir, "rollout_device": str(dev),
                                      "trainer_device": str(dev), "dtype": "fp16"}})
    policy = HFPolicy(cfg.model, cfg.train, role="trainer")
    if policy.scaler is None:
        raise RuntimeError("an fp16 policy on CUDA has no gradient scaler")
    policy.scaler = torch.amp.GradScaler("cuda", init_scale=2.0**120)  # overflows every step
    before = policy.state_digest()
    batch = random_batch(policy, 4, 8, 8, random.Random(0))
    stats = policy.update(batch, temperature=1.0, current_version=0)
    if policy.state_digest() != before:
        raise RuntimeError("an update whose every step the scaler skipped moved the weights")
    if policy.optimizer is not None and policy.optimizer.state:
        raise RuntimeError("an update whose every step the scaler skipped set AdamW's moments")
    if commit_verdict(stats) != NO_STEP_APPLIED:
        raise RuntimeError(f"an update with no step applied would commit: {stats}")
    return {"skipped_steps": skipped_steps(stats), "scale": policy.scaler.get_scale()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--model", help="a model directory, for the fp16 scaler check")
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    checks: dict[str, Callable[[], dict[str, Any]]] = {
        "captures_at_once": lambda: captures_at_once(dev),
        "capture_beside_waits": lambda: capture_beside_waits(dev),
        "pinned_three_times": lambda: pinned_three_times(dev),
        "other_device": lambda: other_device(dev),
    }
    if args.model:
        checks["scaler_overflow"] = lambda: scaler_overflow(dev, args.model)
    result: dict[str, Any] = {"device": str(dev), "checks": {}}
    failed = False
    for name, check in checks.items():
        t0 = time.perf_counter()
        if dev.type != "cuda" or not torch.cuda.is_available():
            entry: dict[str, Any] = {"status": "skipped", "why": f"no CUDA device ({dev})"}
        else:
            try:
                found = check()
                entry = ({"status": "skipped", "why": found["skipped"]} if "skipped" in found
                         else {"status": "ok", **found})
            except Exception as e:  # noqa: BLE001 (recorded; the others still run)
                entry = {"status": "failed", "error": f"{type(e).__name__}: {e}"}
                failed = True
        entry["seconds"] = round(time.perf_counter() - t0, 3)
        result["checks"][name] = entry
        atomic_write_json(args.out, result)  # after each: a crash loses only the one running
        print(f"{name}: {entry['status']} ({entry['seconds']} s)"
              + (f" {entry.get('error', '')}" if entry["status"] == "failed" else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
