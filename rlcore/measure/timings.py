"""Each cost term of the virtual clock timed through the code that charges it, and fit.

Every term is timed through the code that charges it (`rlcore/clock/work.py`): a sampler's
prefill and chunks, `HFPolicy.update`, the weight slots' write and read, the reward
harness, the controller's message handling and the parameter service's commit. A
`StampClock` stands in for the wall clock and stamps each piece of work as it is charged, so
the sizes the fit sees are exactly those a virtual run will be charged for. Each term is fit
by least squares with non-negative coefficients over a few sizes and repetitions, with its
relative residual (`rlcore calibrate`, `calibrate.py`).

The decode path and the weight transport timed are those the config resolves to on this
machine (`model.decode`, `runtime.weight_transport`), and the profile records them. On a GPU
the device's queued work is waited for before every stamp, on the streams this thread
queued it on (`rlcore.policy.device.wait_for`), so a stamp holds the work's device time.
"""

from __future__ import annotations

import dataclasses
import pickle
import queue
import random
import statistics
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

import numpy as np
import torch

from rlcore.clock.clock import WallClock
from rlcore.clock.work import Decode, Prefill, Update, Work
from rlcore.config import LoraConfig, RunConfig
from rlcore.policy.decode_step import Adapter, adapter_product
from rlcore.policy.device import resolve_device, wait_for
from rlcore.policy.hf_policy import HFPolicy
from rlcore.policy.sampler import Draws
from rlcore.policy.train_batch import TrainBatch
from rlcore.record.ledger import IN_PLACE_COMMIT, RunLedger
from rlcore.record.schedule import GenerationRecord
from rlcore.runners.asynchronous.controller import Controller
from rlcore.runners.asynchronous.messages import (
    CommitRequest,
    Event,
    RolloutBatch,
    SampleMsg,
    UpdateDone,
)
from rlcore.runners.asynchronous.param_service import ParamService
from rlcore.runners.asynchronous.vehicles import Threads
from rlcore.runners.asynchronous.weight_slots import (
    WeightSlots,
    trainable_spec,
)
from rlcore.runners.common import preflight
from rlcore.tasks.reward import evaluate_response

BATCHES = (1, 4, 8, 16)
PROMPTS = (4, 16, 48)  # prompt widths in tokens
# A captured step computes its bucket (rows to a power of two, columns to a span of 128):
# its fit needs batches between the powers and prompts wide enough for spans of 256 and 512,
# or its row and column terms cannot be told apart.
GRAPH_BATCHES = (1, 3, 4, 12, 16)
GRAPH_PROMPTS = (4, 16, 48, 200, 400)
STEPS = 24  # decode steps per sampler, in chunks of CHUNK
CHUNK = 4
ADAPTER_ROWS = (1, 4, 16, 32)  # rows of a decode step whose adapter products are timed


class StampClock(WallClock):
    """The wall clock, stamping each charged piece of work with the seconds since the last
    stamp (or `mark`); with CUDA `devices`, once the work queued on them has run (a kernel
    launch returns before its kernel ends)."""

    def __init__(self, devices: Iterable[torch.device] = ()) -> None:
        super().__init__()
        self.devices = tuple(devices)
        self.stamps: list[tuple[Work, float]] = []
        self._t = self._stamp()

    def _stamp(self) -> float:
        wait_for(self.devices)
        return time.perf_counter()

    def mark(self) -> None:
        self._t = self._stamp()

    def charge(self, work: Work) -> None:
        t = self._stamp()
        self.stamps.append((work, t - self._t))
        self._t = t

    def take(self) -> list[tuple[Work, float]]:
        out, self.stamps = self.stamps, []
        return out


@dataclasses.dataclass(frozen=True)
class Fit:
    """Coefficients of one term, and how well they explain what was timed."""

    coef: tuple[float, ...]
    residual: float  # root-mean-square error over the mean time: 0.05 is 5 %
    n: int


def nonneg_lstsq(x: Sequence[Sequence[float]], y: Sequence[float]) -> Fit:
    """Least squares with coefficients >= 0: refit without the most negative one until none
    is left (an active-set method small enough for three features)."""
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    active = list(range(a.shape[1]))
    coef = np.zeros(a.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(a[:, active], b, rcond=None)
        if (sol >= 0).all():
            coef[:] = 0
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))
    rms = float(np.sqrt(np.mean((a @ coef - b) ** 2)))
    return Fit(tuple(float(c) for c in coef), rms / float(np.mean(b)), len(b))


def random_ids(policy: HFPolicy, n: int, rng: random.Random) -> list[int]:
    """n token ids that are not stop tokens (a sampler's cost does not depend on them)."""
    vocab = policy.model.config.vocab_size
    ids = [i for i in range(vocab) if i not in policy.stop_ids and i != policy.pad_id]
    return [rng.choice(ids) for _ in range(n)]


def sampling_grid(decode: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The batch sizes and prompt widths the sampling fit is timed at, for a decode path."""
    return (GRAPH_BATCHES, GRAPH_PROMPTS) if decode == "graph" else (BATCHES, PROMPTS)


def time_sampling(cfg: RunConfig, reps: int) -> tuple[Fit, Fit, str]:
    """Decode (steps, rows, row x context) and prefill (calls, tokens) on the rollout device,
    and the decode path they are of (`model.decode` resolved there)."""
    device = resolve_device(cfg.model.rollout_device, "rollout")
    clock = StampClock([device])
    policy = HFPolicy(cfg.model, cfg.train, role="rollout", device=device, clock=clock)
    policy.stop_ids = set()  # every row decodes every step: contexts up to the longest
    rng = random.Random(0)
    decode: list[tuple[Decode, float]] = []
    prefill: list[tuple[Prefill, float]] = []
    batches, widths = sampling_grid(policy.decoders.kind)
    for rep in range(reps + 1):  # the first pass warms up and is not fit
        for b in batches:
            for width in widths:
                prompts = [random_ids(policy, width, rng) for _ in range(b)]
                clock.mark()
                s = policy.sampler(prompts, max_new_tokens=STEPS, temperature=1.0,
                                   draws=Draws(rep, [(i, 0) for i in range(b)]))
                while not s.done:
                    s.step(CHUNK)
                if rep:
                    for work, sec in clock.take():
                        if isinstance(work, Decode) and work.steps:
                            decode.append((work, sec))
                        elif isinstance(work, Prefill):
                            prefill.append((work, sec))
                clock.take()
    return (nonneg_lstsq([[w.steps, w.rows, w.row_context] for w, _ in decode],
                         [s for _, s in decode]),
            nonneg_lstsq([[w.calls, w.tokens] for w, _ in prefill], [s for _, s in prefill]),
            policy.decoders.kind)


def random_batch(policy: HFPolicy, rows: int, prompt: int, response: int,
                 rng: random.Random) -> TrainBatch:
    """A batch of `rows` random prompts and responses of the given lengths."""
    return TrainBatch(
        prompt_ids=[random_ids(policy, prompt, rng) for _ in range(rows)],
        response_ids=[random_ids(policy, response, rng) for _ in range(rows)],
        behav_logprobs=[[-1.0] * response for _ in range(rows)],
        versions=[[0] * response for _ in range(rows)],
        advantages=[rng.uniform(-1, 1) for _ in range(rows)])


def lora_of(cfg: RunConfig) -> RunConfig:
    """`cfg` training adapters: its own train.lora, or the default one."""
    if cfg.train.lora is not None:
        return cfg
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, lora=LoraConfig()))


def time_updates(cfg: RunConfig, reps: int) -> Fit:
    """An update (calls, padded tokens) on the trainer device, at a few batch shapes: of
    every weight, or under cfg's train.lora of its adapters."""
    device = resolve_device(cfg.model.trainer_device, "trainer")
    clock = StampClock([device])
    policy = HFPolicy(cfg.model, cfg.train, role="trainer", device=device, clock=clock)
    rng = random.Random(1)
    m = cfg.train.minibatches
    shapes = [(rows, p, r) for rows in (max(m, 4), max(m, 16), max(m, 32))
              for p, r in ((6, 3), (16, 16), (32, 48))]
    points: list[tuple[Update, float]] = []
    for rep in range(reps + 1):
        for rows, p, r in shapes:
            batch = random_batch(policy, rows, p, r, rng)
            clock.mark()
            policy.update(batch, temperature=1.0, current_version=0)
            stamps = clock.take()
            if rep:  # the update alone, not the recompute before it
                points += [(w, s) for w, s in stamps if isinstance(w, Update)]
    return nonneg_lstsq([[1.0, w.tokens] for w, _ in points], [s for _, s in points])


def time_adapters(cfg: RunConfig, reps: int) -> Fit:
    """A LoRA decode step's adapter products (`decode_step.py::adapter_product` on every
    target, one token per row: steps, rows x adapter elements) on the rollout device, at a
    few row counts; cfg's train.lora, else the default one, gives the rank and targets."""
    lora_cfg = lora_of(cfg)
    device = resolve_device(cfg.model.rollout_device, "rollout")
    policy = HFPolicy(lora_cfg.model, lora_cfg.train, role="rollout", device=device)
    adapters = [a for a in map(Adapter.of, policy.model.modules()) if a is not None]
    dtype = policy.sampling_dtype
    points: list[tuple[int, float]] = []
    with torch.no_grad(), policy.autocast():
        for rep in range(3 * reps + 1):  # the first pass warms up and is not fit
            for rows in ADAPTER_ROWS:
                hs = [torch.randn(rows, 1, a.a.shape[1], dtype=dtype, device=device)
                      for a in adapters]
                wait_for([device])
                t0 = time.perf_counter()
                for h, a in zip(hs, adapters, strict=True):
                    adapter_product(h, a)
                wait_for([device])
                if rep:
                    points.append((rows * policy.adapter_elements, time.perf_counter() - t0))
    return nonneg_lstsq([[1.0, n] for n, _ in points], [s for _, s in points])


def time_rewards(cfg: RunConfig, n: int,
                 verifier: Literal["last_integer", "math"] = "last_integer") -> float:
    """Seconds to score one answer with `verifier` (the median of n, over the training
    tasks, after a few untimed ones: math-verify's workers start on first use)."""
    tasks = [t for t in preflight(cfg) if t.kind != "code"]
    if not tasks:
        return 0.0
    reward_cfg = dataclasses.replace(cfg.reward, verifier=verifier)
    times = []
    for i in range(-min(n, 8), n):
        task = tasks[i % len(tasks)]
        t0 = time.perf_counter()
        evaluate_response(f"the answer is {i}", task, reward_cfg)
        if i >= 0:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


class _PicklingQueue(queue.Queue[Any]):
    """An in-process queue that pickles what is put, as the process vehicle's pipes do."""

    def put(self, obj: Any, block: bool = True, timeout: float | None = None) -> None:
        super().put(pickle.loads(pickle.dumps(obj)), block, timeout)


def time_controller(cfg: RunConfig, reps: int, answer_s: float) -> Fit:
    """What the controller's process spends per message as a run drives it: unpickling a
    message, handling it and the dispatch that follows (prompts to rollout, batches to the
    trainer, pickled), for rollout messages of a quarter, half and a whole batch of samples
    of realistic lengths, and the update reports the batches bring back; less `answer_s`
    per sample, since rewards are their own term."""
    # no staleness drop, no throttle, and never done: every message is handled in full
    cfg = dataclasses.replace(
        cfg, staleness=dataclasses.replace(cfg.staleness, staleness_k=10**6,
                                           staleness_control="filter"),
        train=dataclasses.replace(cfg.train, updates=10**9))
    clock = StampClock()
    b, rng = cfg.train.update_batch_size, random.Random(4)
    prompt = [1] * 8
    response = max(1, cfg.rollout.max_new_tokens // 2)
    channels = SimpleNamespace(inbox=queue.Queue(), prompt_q=_PicklingQueue(),
                               trainer_qs=[_PicklingQueue()], counters=[0, 0])
    points: list[tuple[int, float]] = []

    def timed(msg: Any, samples: int, keep: bool) -> None:
        blob = pickle.dumps(msg)
        clock.take()
        t0 = time.perf_counter()
        ctl.on_message(pickle.loads(blob))
        ctl.pump()
        elapsed = time.perf_counter() - t0
        if keep:
            points.append((samples, elapsed - samples * answer_s))

    with tempfile.TemporaryDirectory() as tmp:
        ledger = RunLedger(cfg, Path(tmp) / "run", clock=clock)
        try:
            ctl = Controller(cfg, preflight(cfg), ledger, channels, 1)
            ledger.start_clock()
            ctl.pump()
            held: list[Any] = []
            for rep in range(reps + 1):
                for size in (b // 4, b // 2, b):
                    while len(held) < size:
                        ctl.pump()
                        while not channels.prompt_q.empty():
                            held += channels.prompt_q.get_nowait()
                    slots, held = held[:size], held[size:]
                    msg = RolloutBatch("rollout0", samples=[SampleMsg(
                        s, prompt, [rng.randrange(2, 20) for _ in range(response)],
                        [-1.0] * response, [ctl.core.applied] * response, True, "7",
                        "rollout0", clock.now()) for s in slots])
                    # what a rollout message also carries: its schedule record and busy span
                    msg.generation = GenerationRecord(
                        "rollout0", [(s.slot_id, s.attempt, s.group_id) for s in slots],
                        ctl.core.applied)
                    msg.generation.chunks = max(1, response // cfg.rollout.chunk_tokens)
                    msg.events.append(Event("span", clock.now(), {
                        "worker": "rollout0", "role": "rollout", "start": clock.now(),
                        "end": clock.now(), "samples": size, "work": {}}))
                    timed(msg, size, keep=rep > 0)
                    while not channels.trainer_qs[0].empty():
                        req = channels.trainer_qs[0].get_nowait()
                        now = clock.now()
                        timed(UpdateDone(0, req.batch_id, True, ctl.core.applied + 1,
                                         req.base_version, "", dict(IN_PLACE_COMMIT), now, now,
                                         0.0), 0, keep=rep > 0)
        finally:
            ledger.close()
    return nonneg_lstsq([[1.0, n] for n, _ in points], [s for _, s in points])


def time_commit(cfg: RunConfig, n: int) -> float:
    """The parameter service deciding a commit (the median of n)."""
    spec = trainable_spec(cfg.model.path)
    slots = WeightSlots(spec, 2, Threads().locked_array(4), shared=False)
    slots.publish(0, 0)
    service = ParamService(slots, StampClock())
    times = []
    for i in range(n):
        req = CommitRequest(0, i, 1 - i % 2, i, True, {}, 0.0, 0.0, ())
        t0 = time.perf_counter()
        service.commit(req)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
