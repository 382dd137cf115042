"""Two probes of a device for `tools/gpu_check.py` (stage 3), each a JSON file:

  transport  a policy version through the weight slots by each `runtime.weight_transport` the
             device allows (host, pinned, device): a trainer's write and a rollout's read of
             the model's whole trainable state, medians of `repeats`, each read checked bit
             for bit against what was written (on CUDA also read into fp16, as a rollout
             holding fp16 weights reads);
  decode     the sampler's seconds a token under each `model.decode` the device allows (hf,
             static, graph) at each batch size, on the weights as runs hold them (and, under
             fp16 on CUDA, on fp32 weights autocast at every step), and at the largest batch
             the best decoder's tokens/s against HF `generate` on the same prompts and
             weights.

`python -m rlcore.measure.device_probe {transport,decode} MODEL_DIR --device D --out FILE`.
On a CPU both run with what CPU allows (host; hf and static), which is their dry run. A
transport or decoder that fails is recorded under `errors` with its message, the others are
still measured, and the probe exits 1 after writing its file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch

from rlcore.config import config_from_dict
from rlcore.kernels import pin
from rlcore.policy.decoders import Decoders
from rlcore.policy.hf_policy import HFPolicy
from rlcore.policy.sampler import Draws
from rlcore.record.rundir import atomic_write_json
from rlcore.runners.asynchronous.vehicles import Threads
from rlcore.runners.asynchronous.weight_slots import (
    ParamSpec,
    WeightSlots,
    spec_bytes,
    trainable_spec,
)

PROMPT_TOKENS = 40  # about the paper's prompts (config/paper.yaml: arith, chat template)
WARM_STEPS = 8  # tokens sampled before timing: first calls pick kernels, graphs capture


T = TypeVar("T")


def _attempt(errors: dict[str, str], name: str, fn: Callable[..., T], *args: Any) -> T | None:
    """fn(*args); None, its error recorded under `name`, where it raises: a failing kind
    costs its own figure, not the others' (device time is scarce)."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 (recorded, and the probe then exits 1)
        errors[name] = f"{type(e).__name__}: {e}"
        return None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def transport_probe(model_dir: str, device: str, repeats: int = 5) -> dict[str, Any]:
    """Write and read seconds of one version by each transport the device allows."""
    dev = torch.device(device)
    spec = trainable_spec(model_dir)
    g = torch.Generator().manual_seed(0)  # random values: zeros hide unwritten bytes
    src = [torch.randn(shape, generator=g).to(dtype=dtype, device=dev)
           for _, shape, dtype in spec]
    transports = ["host", "pinned", "device"] if dev.type == "cuda" else ["host"]
    # On CUDA a rollout under model.dtype fp16 reads each version into fp16 weights
    # (model.rollout_weights: compute): the same copies, casting.
    reads_into = [None, torch.float16] if dev.type == "cuda" else [None]
    out: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for transport, into in ((t, d) for t in transports for d in reads_into):
        name = transport if into is None else f"{transport}, into fp16"
        timed = _attempt(errors, name, _version_s, spec, src, dev, transport, into, repeats)
        if timed is not None:
            out[name] = timed
    return {"device": str(dev), "state_bytes": spec_bytes(spec), "repeats": repeats,
            "transports": out, "errors": errors}


def _version_s(spec: ParamSpec, src: list[torch.Tensor], dev: torch.device, transport: str,
               into: torch.dtype | None, repeats: int) -> dict[str, Any]:
    """One transport's write and read seconds, medians of `repeats` versions, each read
    checked against what was written."""
    slots = WeightSlots(spec, 2, Threads().locked_array(4),
                        shared=transport != "device", transport=transport, device=dev)
    dst = [torch.empty_like(t, dtype=into or t.dtype) for t in src]
    writes, reads, whole = [], [], True
    for rep in range(repeats + 1):  # the first is a warm-up (registration, allocation)
        for t in dst:
            t.fill_(float("nan"))
        _sync(dev)
        t0 = time.perf_counter()
        slots.write(1, src)
        t1 = time.perf_counter()
        slots.publish(1, rep)
        slots.read_into(dst)
        t2 = time.perf_counter()
        whole = whole and all(torch.equal(a, b.to(a.dtype))
                              for a, b in zip(dst, src, strict=True))
        if rep:
            writes.append(t1 - t0)
            reads.append(t2 - t1)
    return {"write_s": statistics.median(writes), "read_s": statistics.median(reads),
            "per_version_s": statistics.median(w + r for w, r in zip(writes, reads,
                                                                      strict=True)),
            "writes_s": writes, "reads_s": reads, "bit_for_bit": whole}


def _prompts(vocab: int, rows: int) -> list[list[int]]:
    """Rows of random token ids, 30 to 40 long (left padding included), above the ids a
    vocabulary keeps for special tokens: past 100 in a large one, past 1 (pad, stop) in the
    tiny model's 99."""
    g = torch.Generator().manual_seed(1)
    low = 100 if vocab > 1000 else 2
    return [torch.randint(low, min(vocab, 30000), (PROMPT_TOKENS - i % 11,),
                          generator=g).tolist() for i in range(rows)]


def _step_s(policy: HFPolicy, kind: str, batches: Sequence[int], steps: int
            ) -> dict[str, float]:
    """Seconds a token of the sampler under decoder `kind`, by batch size."""
    policy.decoders = Decoders(policy.decoders.model, kind, policy.autocast)
    vocab = policy.model.config.vocab_size
    out = {}
    for rows in batches:
        prompts = _prompts(vocab, rows)
        s = policy.sampler(prompts, max_new_tokens=WARM_STEPS + steps, temperature=1.0,
                           draws=Draws(0, [(i, 0) for i in range(rows)]))
        s.step(WARM_STEPS)
        _sync(policy.device)
        t0 = time.perf_counter()
        s.step(steps)
        _sync(policy.device)
        out[str(rows)] = (time.perf_counter() - t0) / steps
    return out


def _generate_tokens_per_s(policy: HFPolicy, rows: int, steps: int) -> float:
    """HF `generate`'s sampled tokens a second on the policy's sampling weights."""
    model: Any = policy.decoders.model  # a PreTrainedModel: it has generate
    dev, pad = policy.device, policy.pad_id
    prompts = _prompts(policy.model.config.vocab_size, rows)
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=dev)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=dev)
    kw = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0,
          "pad_token_id": pad, "attention_mask": mask}
    with torch.no_grad(), policy.autocast():
        model.generate(input_ids=ids, min_new_tokens=0, max_new_tokens=WARM_STEPS, **kw)
        _sync(dev)
        t0 = time.perf_counter()
        model.generate(input_ids=ids, min_new_tokens=steps, max_new_tokens=steps, **kw)
        _sync(dev)
    return rows * steps / (time.perf_counter() - t0)


def decode_probe(model_dir: str, device: str, batches: Sequence[int], steps: int,
                 dtype: str) -> dict[str, Any]:
    """Seconds a token of the sampler under each decoder and batch, with the rollout's
    weights held as `model.rollout_weights` says (and, under fp16 on CUDA, in fp32 beside);
    HF generate on the same weights beside."""
    dev = torch.device(device)
    kinds = ["hf", "static", "graph"] if dev.type == "cuda" else ["hf", "static"]
    held = ["compute", "fp32"] if dtype == "fp16" and dev.type == "cuda" else ["compute"]
    step_s: dict[str, dict[str, float]] = {}
    generate_s: dict[str, float] = {}
    errors: dict[str, str] = {}
    rows = max(batches)
    for weights in held:
        cfg = config_from_dict({"model": {"path": model_dir, "dtype": dtype,
                                          "rollout_weights": weights,
                                          "rollout_device": device, "trainer_device": device},
                                "runtime": {"kernels": "native"}})
        pin(cfg)
        policy = HFPolicy(cfg.model, cfg.train, role="rollout")
        policy.stop_ids = set()  # every row samples every step: the steps are the same for all
        suffix = "" if weights == "compute" else ", fp32 weights"
        for kind in kinds:
            per_rows = _attempt(errors, kind + suffix, _step_s, policy, kind, batches, steps)
            if per_rows is not None:
                step_s[kind + suffix] = per_rows
        tokens_s = _attempt(errors, "hf generate" + suffix, _generate_tokens_per_s, policy,
                            rows, steps)
        if tokens_s is not None:
            generate_s["hf generate" + suffix] = tokens_s
        del policy
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    out: dict[str, Any] = {"device": str(dev), "dtype": dtype, "steps": steps,
                           "step_s": step_s, "batch": rows,
                           "generate_tokens_per_s": generate_s, "errors": errors}
    timed = [k for k in kinds if k in step_s]  # on the weights runs hold
    if timed:
        best = min(timed, key=lambda k: step_s[k][str(rows)])
        out.update(best=best, rollout_tokens_per_s=rows / step_s[best][str(rows)])
    if timed and "hf generate" in generate_s:
        out.update(hf_generate_tokens_per_s=generate_s["hf generate"],
                   ratio_to_hf_generate=out["rollout_tokens_per_s"] / generate_s["hf generate"])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rlcore.measure.device_probe",
                                description=__doc__.splitlines()[0])
    p.add_argument("probe", choices=("transport", "decode"))
    p.add_argument("model", help="a model directory (the stand-in)")
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    p.add_argument("--repeats", type=int, default=5, help="transport: timed versions")
    p.add_argument("--batches", type=int, nargs="+", default=[4, 32, 64],
                   help="decode: batch sizes")
    p.add_argument("--steps", type=int, default=32, help="decode: timed tokens a batch")
    p.add_argument("--dtype", choices=("fp32", "fp16"), default="fp16",
                   help="decode: model.dtype (fp16 autocast on CUDA, as the paper)")
    args = p.parse_args(argv)
    if args.probe == "transport":
        result = transport_probe(args.model, args.device, args.repeats)
    else:
        result = decode_probe(args.model, args.device, args.batches, args.steps, args.dtype)
    atomic_write_json(args.out, result)
    print(json.dumps(result, indent=1))
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
