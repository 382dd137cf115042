"""Two probes of a device for `tools/gpu_check.py` (stage 2), each a JSON file:

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
still measured, and the probe exits 1 after writing its file. The file is rewritten after
each transport, decoder and batch, with `finished` false until the end, so a probe stopped
at its time limit or killed keeps what it measured. A host or pinned transport whose slots
/dev/shm cannot hold is recorded under `skipped` with the reason, before any is allocated.
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

from rlcore.config import ConfigError, config_from_dict
from rlcore.kernels import pin
from rlcore.measure.smoke import clean_generate
from rlcore.policy.decoders import Decoders
from rlcore.policy.device import bind, wait_for
from rlcore.policy.hf_policy import HFPolicy
from rlcore.policy.sampler import Draws
from rlcore.record.rundir import atomic_write_json
from rlcore.runners.asynchronous.vehicles import Threads
from rlcore.runners.asynchronous.weight_slots import (
    ParamSpec,
    WeightSlots,
    check_shared_memory,
    shared_memory_free,
    spec_bytes,
    trainable_spec,
)

PROMPT_TOKENS = 40  # about the paper's prompts (config/paper.yaml: arith, chat template)
WARM_STEPS = 8  # tokens sampled before timing: first calls pick kernels, graphs capture
SLOTS = 2  # weight slots a transport's timing allocates (in /dev/shm for host and pinned)

T = TypeVar("T")
Save = Callable[[dict[str, Any]], None]  # takes the result so far


def _attempt(errors: dict[str, str], name: str, fn: Callable[..., T], *args: Any) -> T | None:
    """fn(*args); None, its error recorded under `name`, where it raises: a failing kind
    costs its own figure, not the others' (device time is scarce)."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 (recorded, and the probe then exits 1)
        errors[name] = f"{type(e).__name__}: {e}"
        return None


def _ignore(result: dict[str, Any]) -> None:
    """The default `save`: keep nothing on the way."""


def _sync(device: torch.device) -> None:
    wait_for([device])  # the stream the work went to: never a whole device


def transport_probe(model_dir: str, device: str, repeats: int = 5,
                    save: Save = _ignore) -> dict[str, Any]:
    """Write and read seconds of one version by each transport the device allows; `save`
    gets the result so far after each transport."""
    dev = torch.device(device)
    bind(dev)
    spec = trainable_spec(model_dir)
    g = torch.Generator().manual_seed(0)  # random values: zeros hide unwritten bytes
    src = [torch.randn(shape, generator=g).to(dtype=dtype, device=dev)
           for _, shape, dtype in spec]
    transports = ["host", "pinned", "device"] if dev.type == "cuda" else ["host"]
    # On CUDA a rollout under model.dtype fp16 reads each version into fp16 weights
    # (model.rollout_weights: compute): the same copies, casting.
    reads_into = [None, torch.float16] if dev.type == "cuda" else [None]
    result: dict[str, Any] = {"device": str(dev), "state_bytes": spec_bytes(spec),
                              "repeats": repeats, "transports": {}, "errors": {},
                              "skipped": {}, "finished": False}
    for transport, into in ((t, d) for t in transports for d in reads_into):
        name = transport if into is None else f"{transport}, into fp16"
        try:
            if transport != "device":  # host and pinned slots live in /dev/shm
                check_shared_memory(spec, SLOTS, shared_memory_free())
        except ConfigError as e:  # past /dev/shm's size the copy dies of SIGBUS
            result["skipped"][name] = str(e)
        else:
            timed = _attempt(result["errors"], name, _version_s, spec, src, dev, transport,
                             into, repeats)
            if timed is not None:
                result["transports"][name] = timed
        save(result)
    result["finished"] = True
    save(result)
    return result


def _version_s(spec: ParamSpec, src: list[torch.Tensor], dev: torch.device, transport: str,
               into: torch.dtype | None, repeats: int) -> dict[str, Any]:
    """One transport's write and read seconds, medians of `repeats` versions, each read
    checked against what was written."""
    slots = WeightSlots(spec, SLOTS, Threads().locked_array(2 + SLOTS),
                        shared=transport != "device", transport=transport, device=dev)
    dst = [torch.empty_like(t, dtype=into or t.dtype) for t in src]
    writes, reads, whole = [], [], True
    try:
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
    finally:
        slots.close()  # pinned: unregistered before the next transport's slots
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


def _step_s(policy: HFPolicy, rows: int, steps: int) -> float:
    """Seconds a token of the sampler under the policy's decoder, at `rows` rows."""
    prompts = _prompts(policy.model.config.vocab_size, rows)
    s = policy.sampler(prompts, max_new_tokens=WARM_STEPS + steps, temperature=1.0,
                       draws=Draws(0, [(i, 0) for i in range(rows)]))
    s.step(WARM_STEPS)
    _sync(policy.device)
    t0 = time.perf_counter()
    s.step(steps)
    _sync(policy.device)
    return (time.perf_counter() - t0) / steps


def _generate_tokens_per_s(policy: HFPolicy, rows: int, steps: int) -> float:
    """HF `generate`'s sampled tokens a second on the policy's sampling weights: plain
    sampling at temperature 1, as the sampler's, with none of the model's
    generation_config.json (`clean_generate`)."""
    from transformers import GenerationConfig

    model: Any = policy.decoders.model  # a PreTrainedModel: it has generate
    dev, pad = policy.device, policy.pad_id
    prompts = _prompts(policy.model.config.vocab_size, rows)
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=dev)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=dev)

    def config(tokens: int) -> GenerationConfig:
        # no stop ids: every row samples every step, as the sampler's rows here
        return GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                min_new_tokens=tokens, max_new_tokens=tokens,
                                pad_token_id=pad)

    with torch.no_grad(), policy.autocast():
        clean_generate(model, config(WARM_STEPS), input_ids=ids, attention_mask=mask)
        _sync(dev)
        t0 = time.perf_counter()
        clean_generate(model, config(steps), input_ids=ids, attention_mask=mask)
        _sync(dev)
    return rows * steps / (time.perf_counter() - t0)


def _summarise(result: dict[str, Any], kinds: Sequence[str]) -> None:
    """The best decoder (on the weights runs hold) at the largest batch timed so far, and
    its tokens/s against HF generate's."""
    rows = str(result["batch"])
    timed = [k for k in kinds if rows in result["step_s"].get(k, {})]
    if not timed:
        return
    best = min(timed, key=lambda k: result["step_s"][k][rows])
    result.update(best=best, rollout_tokens_per_s=result["batch"] / result["step_s"][best][rows])
    hf = result["generate_tokens_per_s"].get("hf generate")
    if hf:
        result.update(hf_generate_tokens_per_s=hf,
                      ratio_to_hf_generate=result["rollout_tokens_per_s"] / hf)


def decode_probe(model_dir: str, device: str, batches: Sequence[int], steps: int,
                 dtype: str, save: Save = _ignore) -> dict[str, Any]:
    """Seconds a token of the sampler under each decoder and batch, with the rollout's
    weights held as `model.rollout_weights` says (and, under fp16 on CUDA, in fp32 beside);
    HF generate on the same weights beside. `save` gets the result so far after each
    batch of each decoder and after each HF generate."""
    dev = torch.device(device)
    kinds = ["hf", "static", "graph"] if dev.type == "cuda" else ["hf", "static"]
    held = ["compute", "fp32"] if dtype == "fp16" and dev.type == "cuda" else ["compute"]
    result: dict[str, Any] = {"device": str(dev), "dtype": dtype, "steps": steps,
                              "step_s": {}, "batch": max(batches),
                              "generate_tokens_per_s": {}, "errors": {}, "finished": False}
    errors = result["errors"]
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
            policy.decoders = Decoders(policy.decoders.model, kind, policy.autocast)
            for rows in batches:
                seconds = _attempt(errors, kind + suffix, _step_s, policy, rows, steps)
                if seconds is None:
                    break  # a failing decoder's larger batches would cost time and fail too
                result["step_s"].setdefault(kind + suffix, {})[str(rows)] = seconds
                _summarise(result, kinds)
                save(result)
        tokens_s = _attempt(errors, "hf generate" + suffix, _generate_tokens_per_s, policy,
                            max(batches), steps)
        if tokens_s is not None:
            result["generate_tokens_per_s"]["hf generate" + suffix] = tokens_s
        _summarise(result, kinds)
        save(result)
        del policy
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    result["finished"] = True
    save(result)
    return result


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

    def save(result: dict[str, Any]) -> None:
        atomic_write_json(args.out, result)

    if args.probe == "transport":
        result = transport_probe(args.model, args.device, args.repeats, save)
    else:
        result = decode_probe(args.model, args.device, args.batches, args.steps, args.dtype,
                              save)
    print(json.dumps(result, indent=1))
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
