"""Time one static decode step at Qwen2.5-0.5B's shapes (random weights, fp32, on this CPU),
without adapters (what a merged rollout ran) and with LoRA applied unmerged on every target:

    python tools/bench_lora_decode.py [--rows 4 32] [--rank 8] [--context 256] [--steps 20]

Prints the median seconds a step of each, per batch size, and the ratio.
"""

from __future__ import annotations

import rlcore.kernels  # noqa: I001 (MKL's code path is chosen before torch loads)

rlcore.kernels.take_intel_mkl_paths()

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from rlcore.config import LoraConfig  # noqa: E402
from rlcore.policy import lora  # noqa: E402
from rlcore.policy.decode_step import Weights, decode_step  # noqa: E402
from rlcore.policy.stand_in import QWEN25_05B  # noqa: E402


def time_steps(ws: list[Weights], rows: int, context: int, steps: int) -> list[float]:
    """Median seconds of `decode_step` over each of `ws` at `rows` rows attending to
    `context` columns, their steps interleaved (so a busy host slows each alike)."""
    w = ws[0]
    shape = (rows, w.kv_heads, context + 1, w.head_dim)
    keys = [torch.randn(shape) for _ in w.layers]
    values = [torch.randn(shape) for _ in w.layers]
    tok = torch.randint(0, w.embed.shape[0], (rows, 1))
    pos = torch.full((rows, 1), context)
    times: list[list[float]] = [[] for _ in ws]
    with torch.no_grad():
        for i in range(steps + 2):
            for j, wj in enumerate(ws):
                t0 = time.perf_counter()
                decode_step(wj, tok, pos, keys, values, context, None)
                if i >= 2:  # after a few untimed ones
                    times[j].append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[4, 32])
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**QWEN25_05B, pad_token_id=0)).eval()
    model.name_or_path = "qwen2.5-0.5b-stand-in"
    plain = Weights.of(model)  # the targets' weights alone: what a merged rollout read
    cfg = LoraConfig(rank=args.rank)
    adapter = lora.rollout_wrap(model, cfg, lora.targets(model, cfg), torch.float32)
    with torch.no_grad():  # a trained B: a zero one would cost the same, but say what runs
        for name, t in adapter.items():
            if ".lora_B." in name:
                t.normal_(0, 1e-3)
    adapted = Weights.of(model)
    both = {r: time_steps([plain, adapted], r, args.context, args.steps) for r in args.rows}
    print(f"decode step, Qwen2.5-0.5B shapes, fp32 on CPU, {torch.get_num_threads()} "
          f"threads, context {args.context}, LoRA rank {args.rank} on {len(adapter) // 2} "
          "targets")
    for r in args.rows:
        merged, unmerged = both[r]
        print(f"  rows {r:3d}: merged (no adapters) {merged * 1e3:8.1f} ms, unmerged "
              f"{unmerged * 1e3:8.1f} ms, x{unmerged / merged:.3f}")


if __name__ == "__main__":
    main()
