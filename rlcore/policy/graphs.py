"""`model.decode: graph`: the static decoder's step at fixed shapes, captured as CUDA graphs.

A decode step of a small model on a GPU is launch-bound: dozens of kernels of a few
microseconds each, every one launched from Python. Captured once as a CUDA graph (as gpt-fast
and transformers' static cache with `torch.compile(mode="reduce-overhead")` do), a step is
one launch. A graph replays fixed addresses and shapes, so what a step reads and writes lives
in buffers that outlive batches, one set per bucket: the batch padded to a power of two rows,
the KV cache to a multiple of `SPAN_STEP` columns. A step attends to every column under a
mask that hides those not yet written (`decode_step.py::decode_step` with a tensor column), so
its rounding differs from the eager step's; tests/test_cuda.py bounds the difference.

The prompt's forward (`refill`) stays eager, as transformers' own.

Captures keep PyTorch's and CUDA's rules for a process whose threads share a GPU, as vLLM's
and SGLang's graph runners do: a role captures the buckets its batches will use before the
run starts (`GraphPool.prepare`, before the ready barrier), largest first, into one memory
pool; a bucket first needed later is captured then. Every capture holds `CAPTURE_LOCK`
(`rlcore/policy/device.py`), so no two run at once and no thread waits on the device
meanwhile, and names its device, so a policy on cuda:1 captures on cuda:1 whatever device is
current in the calling thread.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch
from transformers import DynamicCache

from rlcore.policy.decode_step import Tokens, Weights, decode_step, prefill
from rlcore.policy.device import CAPTURE_LOCK

SPAN_STEP = 128  # the KV cache's columns are a multiple of this: batches share a bucket
WARMUP = 3  # eager runs on the capture stream before a capture (CUDA's lazy initialisation)
# The prompt widths whose spans a run captures ahead, as quantiles of its training prompts'
# widths: a batch attends over the narrowest span that holds it, so a long tail of prompts
# costs only the batches that meet it (gpt-fast sizes its static cache per call likewise).
SPAN_QUANTILES = (0.5, 0.9, 1.0)


def rows_bucket(rows: int) -> int:
    """The batch's rows rounded up to a power of two."""
    return 1 << max(0, rows - 1).bit_length()


def span_bucket(columns: int) -> int:
    """The KV cache's columns rounded up to a multiple of `SPAN_STEP`."""
    return -(-columns // SPAN_STEP) * SPAN_STEP


def captured_work(rows: int, columns: int) -> tuple[int, int]:
    """The rows a captured step computes for a batch of `rows` rows whose prompt and
    response take `columns` columns, and the columns each attends to: its bucket's (a
    narrower span than its own is never captured, a wider one may be)."""
    return rows_bucket(rows), span_bucket(columns)


def prepared_spans(widths: Sequence[int], max_new_tokens: int) -> list[int]:
    """The KV spans a run captures ahead, widest first: those of its prompts' widths at
    SPAN_QUANTILES (nearest rank) with `max_new_tokens` on top."""
    ws = sorted(widths) or [1]
    picks = {ws[max(0, math.ceil(q * len(ws)) - 1)] for q in SPAN_QUANTILES}
    return sorted({span_bucket(w + max_new_tokens) for w in picks}, reverse=True)


class Bucket:
    """One bucket's buffers and its captured step (`capture`), or none (run eagerly)."""

    def __init__(self, w: Weights, rows: int, span: int, device: torch.device,
                 dtype: torch.dtype):
        self.w, self.rows, self.span, self.device = w, rows, span, device
        shape = (rows, w.kv_heads, span, w.head_dim)
        # zeros, not empty: a hidden column still meets the values (0 * NaN would be NaN)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in w.layers]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in w.layers]
        self.mask = torch.zeros(rows, span, dtype=torch.bool, device=device)
        self.tok = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.pos = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.col = torch.zeros(1, dtype=torch.long, device=device)
        self.graph: Any = None
        self.logits = torch.empty(0)

    def step(self) -> torch.Tensor:
        """The step on the buffers as they are: logits [rows, 1, V]."""
        return decode_step(self.w, self.tok, self.pos, self.keys, self.values, self.col,
                           self.mask[:, None, None, :])

    def capture(self, autocast: Callable[[], AbstractContextManager[Any]], pool: Any) -> None:
        """Record the step as a CUDA graph into the memory pool `pool`, on this bucket's
        device (the buffers' contents do not matter yet, but for no row being fully masked)."""
        with CAPTURE_LOCK, torch.cuda.device(self.device):
            current = torch.cuda.current_stream(self.device)
            stream = torch.cuda.Stream(self.device)
            # every row attends to column 0, which the step itself writes: a fully masked row
            # is NaN under some kernels, and NaN left in keys a later row attends past (even
            # masked) would poison it. Every batch's refill resets the mask.
            self.mask[:, 0] = True
            stream.wait_stream(current)
            # the warm-up runs on the stream that captures, so its cuBLAS workspace is set up
            with torch.cuda.stream(stream), torch.no_grad(), autocast():
                for _ in range(WARMUP):
                    self.step()
            current.wait_stream(stream)
            self.graph = torch.cuda.CUDAGraph()
            # thread_local: the threaded runner's trainer may allocate from its own thread
            # meanwhile, which the default (global) mode would refuse
            with (torch.cuda.graph(self.graph, pool=pool, stream=stream,
                                   capture_error_mode="thread_local"),
                  torch.no_grad(), autocast()):
                self.logits = self.step()

    def run(self, autocast: Callable[[], AbstractContextManager[Any]]) -> torch.Tensor:
        """One step: the graph replayed (on this device's current stream), or (uncaptured)
        the step run eagerly."""
        if self.graph is not None:
            with torch.cuda.device(self.device):
                self.graph.replay()
            return self.logits
        with torch.no_grad(), autocast():
            return self.step()


def graph_autocast(autocast: Callable[[], AbstractContextManager[Any]]
                   ) -> Callable[[], AbstractContextManager[Any]]:
    """The policy's autocast without its cast cache, which a captured graph must not use."""
    probe = autocast()
    if not isinstance(probe, torch.autocast):
        return autocast
    return lambda: torch.autocast(probe.device, dtype=probe.fast_dtype, cache_enabled=False)


class GraphPool:
    """A model's buckets, captured into one memory pool by `prepare` or on first use (or run
    eagerly: `capture=False`, the CPU tests' way to check the fixed-shape arithmetic)."""

    def __init__(self, model: torch.nn.Module, autocast: Callable[[], AbstractContextManager[Any]],
                 cache_kw: str, capture: bool = True):
        self.model, self.cache_kw, self.capture = model, cache_kw, capture
        self.autocast = graph_autocast(autocast)
        self.w = Weights.of(model)
        self.device = self.w.embed.device
        self.buckets: dict[tuple[int, int], Bucket] = {}
        self.pool: Any = None  # the graphs' shared memory pool, made at the first capture

    def kv_dtype(self) -> torch.dtype:
        """The dtype of the KV cache the model's own prefill writes (a one-token prefill)."""
        ids = torch.zeros(1, 1, dtype=torch.long, device=self.device)
        cache = DynamicCache()
        prefill(self.model, ids, torch.ones_like(ids), cache, self.autocast, self.cache_kw)
        return cache.layers[0].keys.dtype

    def prepare(self, rows: Iterable[int], spans: Iterable[int]) -> None:
        """Capture, largest first, a bucket for batches of each of `rows` rows at each of
        `spans` columns: before the run, so none captures in it."""
        dtype = self.kv_dtype()
        widths = sorted({span_bucket(s) for s in spans}, reverse=True)
        for r in sorted({rows_bucket(r) for r in rows}, reverse=True):
            for span in widths:
                if (r, span) not in self.buckets:
                    self._new(r, span, dtype)

    def bucket(self, rows: int, columns: int, dtype: torch.dtype) -> Bucket:
        """The bucket for a batch of `rows` rows and `columns` columns: the narrowest one
        made that holds it, else a new one, captured now."""
        r, span = rows_bucket(rows), span_bucket(columns)
        fits = [s for (br, s) in self.buckets if br == r and s >= span]
        if fits:
            return self.buckets[(r, min(fits))]
        return self._new(r, span, dtype)

    def _new(self, rows: int, span: int, dtype: torch.dtype) -> Bucket:
        """A bucket of exactly `rows` rows and `span` columns, captured now."""
        b = Bucket(self.w, rows, span, self.device, dtype)
        if self.capture:
            with CAPTURE_LOCK:
                if self.pool is None:
                    self.pool = torch.cuda.graph_pool_handle()
                b.capture(self.autocast, self.pool)
        self.buckets[(rows, span)] = b
        return b


class GraphDecoder(Tokens):
    """A batch on a bucket: the prompt's forward eager, each next token the bucket's step."""

    def __init__(self, pool: GraphPool, ids: torch.Tensor, mask: torch.Tensor, cache_kw: str,
                 max_new_tokens: int):
        super().__init__(ids, mask, max_new_tokens)
        self.pool, self.cache_kw = pool, cache_kw
        self.bucket: Bucket | None = None

    def refill(self) -> torch.Tensor:
        b = self.ids.shape[0]
        logits, cache = self.prefill_all(self.pool.model, self.pool.autocast, self.cache_kw)
        if self.bucket is None:
            self.bucket = self.pool.bucket(b, self.ids.shape[1], cache.layers[0].keys.dtype)
        bk = self.bucket
        for i, layer in enumerate(cache.layers):
            bk.keys[i][:b, :, :self.t] = layer.keys
            bk.values[i][:b, :, :self.t] = layer.values
        bk.mask.zero_()
        bk.mask[:b, :self.t] = self.mask[:, :self.t].bool()
        bk.mask[b:, 0] = True  # rows beyond the batch attend to one column: no empty softmax
        return logits

    def work(self) -> tuple[int, int]:
        """A captured step computes every row of its bucket over every column of its span,
        whatever the batch's own rows and context."""
        assert self.bucket is not None, "refill comes first"
        return self.bucket.rows, self.bucket.span

    def forward(self) -> torch.Tensor:
        assert self.bucket is not None, "refill comes first"
        b, t, bk = self.ids.shape[0], self.t - 1, self.bucket
        bk.tok[:b] = self.ids[:, t:t + 1]
        bk.pos[:b] = self.ones - 1
        bk.col.fill_(t)
        bk.mask[:, t] = True
        logits = bk.run(self.pool.autocast)
        # one copy, in float32: the bucket's buffer is rewritten by the next step
        return logits[:b, -1].to(torch.float32, copy=True)
