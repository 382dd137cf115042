"""Two probes of a device for `tools/gpu_check.py` (stage 3), each a JSON file:

  transport  a policy version through the weight slots by each `runtime.weight_transport` the
             device allows (host, pinned, device): a trainer's write and a rollout's read of
             the model's whole trainable state, medians of `repeats`, each read checked bit
             for bit against what was written;
  decode     the sampler's seconds a token under each `model.decode` the device allows (hf,
             static, graph) at each batch size, and at the largest batch the best decoder's
             tokens/s against HF `generate` on the same prompts.

`python -m rlcore.measure.device_probe {transport,decode} MODEL_DIR --device D --out FILE`.
On a CPU both run with what CPU allows (host; hf and static), which is their dry run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from rlcore.config import config_from_dict
from rlcore.kernels import pin
from rlcore.policy.decoders import Decoders
from rlcore.policy.hf_policy import HFPolicy
from rlcore.policy.sampler import Draws
from rlcore.record.rundir import atomic_write_json
from rlcore.runners.asynchronous.vehicles import Threads
from rlcore.runners.asynchronous.weight_slots import WeightSlots, spec_bytes, trainable_spec

PROMPT_TOKENS = 40  # about the paper's prompts (config/paper.yaml: arith, chat template)
WARM_STEPS = 8  # tokens sampled before timing: first calls pick kernels, graphs capture


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
    out: dict[str, Any] = {}
    for transport in transports:
        slots = WeightSlots(spec, 2, Threads().locked_array(4),
                            shared=transport != "device", transport=transport, device=dev)
        dst = [torch.empty_like(t) for t in src]
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
            whole = whole and all(torch.equal(a, b) for a, b in zip(dst, src, strict=True))
            if rep:
                writes.append(t1 - t0)
                reads.append(t2 - t1)
        out[transport] = {
            "write_s": statistics.median(writes), "read_s": statistics.median(reads),
            "per_version_s": statistics.median(w + r for w, r in zip(writes, reads,
                                                                      strict=True)),
            "writes_s": writes, "reads_s": reads, "bit_for_bit": whole}
        del slots
    return {"device": str(dev), "state_bytes": spec_bytes(spec), "repeats": repeats,
            "transports": out}


def _prompts(vocab: int, rows: int) -> list[list[int]]:
    """Rows of random token ids, 30 to 40 long (left padding included)."""
    g = torch.Generator().manual_seed(1)
    return [torch.randint(100, min(vocab, 30000), (PROMPT_TOKENS - i % 11,),
                          generator=g).tolist() for i in range(rows)]


def decode_probe(model_dir: str, device: str, batches: Sequence[int], steps: int,
                 dtype: str) -> dict[str, Any]:
    """Seconds a token of the sampler under each decoder and batch; HF generate beside."""
    cfg = config_from_dict({"model": {"path": model_dir, "dtype": dtype,
                                      "rollout_device": device, "trainer_device": device},
                            "runtime": {"kernels": "native"}})
    pin(cfg)
    policy = HFPolicy(cfg.model, cfg.train, role="rollout")
    policy.stop_ids = set()  # every row samples every step: the steps are the same for all
    dev = policy.device
    kinds = ["hf", "static", "graph"] if dev.type == "cuda" else ["hf", "static"]
    vocab = policy.model.config.vocab_size
    step_s: dict[str, dict[str, float]] = {}
    for kind in kinds:
        policy.decoders = Decoders(policy.model, kind, policy.autocast)
        step_s[kind] = {}
        for rows in batches:
            prompts = _prompts(vocab, rows)
            s = policy.sampler(prompts, max_new_tokens=WARM_STEPS + steps, temperature=1.0,
                               draws=Draws(0, [(i, 0) for i in range(rows)]))
            s.step(WARM_STEPS)
            _sync(dev)
            t0 = time.perf_counter()
            s.step(steps)
            _sync(dev)
            step_s[kind][str(rows)] = (time.perf_counter() - t0) / steps
    rows = max(batches)
    best = min(kinds, key=lambda k: step_s[k][str(rows)])
    prompts = _prompts(vocab, rows)
    width = max(map(len, prompts))
    pad = policy.pad_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=dev)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=dev)
    with torch.no_grad(), policy.autocast():
        kw = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0,
              "min_new_tokens": steps, "max_new_tokens": steps, "pad_token_id": pad}
        policy.model.generate(input_ids=ids, attention_mask=mask, **{**kw, "max_new_tokens":
                                                                     WARM_STEPS,
                                                                     "min_new_tokens": 0})
        _sync(dev)
        t0 = time.perf_counter()
        policy.model.generate(input_ids=ids, attention_mask=mask, **kw)
        _sync(dev)
        hf_s = time.perf_counter() - t0
    ours = rows / step_s[best][str(rows)]
    return {"device": str(dev), "dtype": dtype, "steps": steps, "step_s": step_s,
            "batch": rows, "best": best, "rollout_tokens_per_s": ours,
            "hf_generate_tokens_per_s": rows * steps / hf_s,
            "ratio_to_hf_generate": ours / (rows * steps / hf_s)}


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
    return 0


if __name__ == "__main__":
    sys.exit(main())
