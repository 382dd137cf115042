"""The runtime's CUDA path: each mode with both roles on cuda:0, fp16 autocast and fp16
sampling weights, weight slots holding device tensors, the decoders against each other (the
captured step within a stated tolerance), the held-out eval and a replay with a tolerance,
on a GPU.

Every test here is marked `cuda` and skips, with its reason, where torch sees no GPU (CI and
the 2-core development machine). Run them on a GPU machine with `pytest -m cuda`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from rlcore.config import config_from_dict
from rlcore.evaluation import evaluate_run
from rlcore.policy.hf_policy import HFPolicy
from rlcore.policy.sampler import FINISH_LAG, Generation
from rlcore.policy.train_batch import TrainBatch
from rlcore.record.rundir import read_jsonl, validate_summary
from rlcore.replay.replayer import replay_run
from rlcore.runners import run_mode
from rlcore.runners.asynchronous.vehicles import Processes
from rlcore.runners.asynchronous.weight_slots import WeightSlots
from tests.conftest import small_config

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="needs a CUDA GPU: torch.cuda.is_available() is False here"),
]

GPU = "cuda:0"


def gpu_config(model_dir: Path, mode: str, **sections: object) -> dict:
    """A short run with both roles on the one GPU (the device tool lends a single H100)."""
    model = {"rollout_device": GPU, "trainer_device": GPU, **sections.pop("model", {})}
    staleness = {} if mode == "sync" else {"staleness_k": 2, "interrupt": "continue"}
    return small_config(
        model_dir, mode=mode, model=model, staleness=staleness,
        train={"updates": 4, "update_batch_size": 8},
        rollout={"max_new_tokens": 5, "chunk_tokens": 1, "group_size": 4}, **sections)


@pytest.mark.parametrize("mode", ["sync", "async", "areal"])
def test_each_mode_runs_and_evaluates_on_the_gpu(tiny_model_dir: Path, tmp_path: Path,
                                                 mode: str):
    out = tmp_path / mode
    summary = run_mode(config_from_dict(gpu_config(tiny_model_dir, mode)), out)
    validate_summary(summary)
    assert summary["reproducibility"]["environment"]["devices"] == {"rollout": GPU,
                                                                 "trainer": GPU}
    assert summary["samples"]["accepted"] > 0
    peaks = summary["gpu_peak_bytes"]
    assert peaks["rollout"] > 0 and peaks["trainer"] > 0
    # AReaL-style's slots live on the GPU in the main process (the device transport)
    assert (peaks.get("weight_slots") or 0) > 0 if mode == "areal" else not peaks.get(
        "weight_slots")
    losses = [u["loss"] for u in read_jsonl(out / "updates.jsonl")]
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses)
    result, path = evaluate_run(out)
    assert path == out / "eval.json" and json.loads(path.read_text()) == result
    assert 0.0 <= result["sampled_pass_rate"] <= 1.0


def test_fp16_autocast_samples_in_half_and_keeps_fp32_weights(tiny_model_dir: Path):
    cfg = config_from_dict(gpu_config(tiny_model_dir, "sync", model={"dtype": "fp16"}))
    policy = HFPolicy(cfg.model, cfg.train, role="trainer")
    assert policy.use_fp16 and policy.scaler is not None
    ids = torch.tensor([policy.encode_prompt("3+4=")], device=policy.device)
    with torch.no_grad(), policy.autocast():
        logits = policy.model(ids).logits
    assert logits.dtype == torch.float16
    assert all(p.dtype == torch.float32 for p in policy.model.parameters())


@pytest.mark.parametrize("mode", ["sync", "areal"])
def test_an_fp16_run_trains_with_finite_losses_and_samples_from_fp16_weights(
        tiny_model_dir: Path, tmp_path: Path, mode: str):
    cfg = config_from_dict(gpu_config(tiny_model_dir, mode, model={"dtype": "fp16"}))
    summary = run_mode(cfg, tmp_path / "run")
    validate_summary(summary)
    assert summary["scheduling"]["weight_sync"]["rollout_dtype"] == "fp16"
    losses = [u["loss"] for u in read_jsonl(tmp_path / "run" / "updates.jsonl")]
    assert losses and all(math.isfinite(x) for x in losses)


def _greedy(policy: HFPolicy, prompts: tuple[str, ...] = ("1+2=", "13+27=", "9+9=")
            ) -> list[Generation]:
    ids = [policy.encode_prompt(p) for p in prompts]
    s = policy.sampler(ids, max_new_tokens=8, temperature=1.0, draws=None)
    while not s.done:
        s.step(3)
    return s.gens


def _max_logprob_gap(a: list[Generation], b: list[Generation]) -> float:
    """Largest difference of two decoders' log-probs; they must pick the same tokens."""
    gap = 0.0
    for x, y in zip(a, b, strict=True):
        assert x.response_ids == y.response_ids
        gap = max(gap, *(abs(p - q) for p, q in zip(x.logprobs, y.logprobs, strict=True)))
    return gap


def test_an_fp16_rollout_holds_fp16_weights_and_samples_as_autocast_does(
        tiny_model_dir: Path):
    """Held in fp16 the residual stream is fp16 too, where autocast keeps it fp32: the same
    greedy tokens, log-probs within 2e-2 (fp16 keeps about 3 decimal digits)."""
    outs = []
    for weights in ("compute", "fp32"):
        cfg = config_from_dict(gpu_config(tiny_model_dir, "areal", model={
            "dtype": "fp16", "rollout_weights": weights}))
        policy = HFPolicy(cfg.model, cfg.train, role="rollout")
        held = torch.float16 if weights == "compute" else torch.float32
        assert all(p.dtype == held for p in policy.model.parameters())
        outs.append(_greedy(policy))
    assert _max_logprob_gap(*outs) < 2e-2


def test_a_sync_policy_samples_from_an_fp16_copy_that_follows_each_update(
        tiny_model_dir: Path):
    cfg = config_from_dict(gpu_config(tiny_model_dir, "sync", model={"dtype": "fp16"}))
    policy = HFPolicy(cfg.model, cfg.train, role="trainer")
    gens = _greedy(policy, ("1+2=", "13+27=", "9+9=", "4+5="))
    copy = policy.sampling_copy
    assert copy is not None and all(p.dtype == torch.float16 for p in copy.model.parameters())
    batch = TrainBatch([policy.encode_prompt(p) for p in ("1+2=", "13+27=", "9+9=", "4+5=")],
                       [g.response_ids for g in gens], [g.logprobs for g in gens],
                       [[0] * len(g.response_ids) for g in gens], [1.0, -1.0, 0.5, -0.5])
    policy.update(batch, temperature=1.0, current_version=0)
    assert all(p.dtype == torch.float32 for p in policy.model.parameters())
    for mine, theirs in zip(policy.model.parameters(), copy.model.parameters(), strict=True):
        assert torch.equal(theirs.detach(), mine.detach().half())


@pytest.mark.parametrize(("dtype", "weights", "tolerance"), [
    ("fp32", "compute", 1e-4), ("fp16", "compute", 2e-2), ("fp16", "fp32", 2e-2)])
def test_the_captured_step_samples_as_the_eager_step_does(tiny_model_dir: Path, dtype: str,
                                                          weights: str, tolerance: float):
    """`graph` attends to a bucket's every column under a mask, `static` to the written ones:
    their rounding differs, within the stated tolerance, and greedy picks the same tokens;
    also under autocast over fp32 weights, where keys and values differ in dtype."""
    outs = []
    for decode in ("static", "graph"):
        cfg = config_from_dict(gpu_config(tiny_model_dir, "areal", model={
            "dtype": dtype, "decode": decode, "rollout_weights": weights}))
        outs.append(_greedy(HFPolicy(cfg.model, cfg.train, role="rollout")))
    assert _max_logprob_gap(*outs) < tolerance


def test_weight_slots_take_and_give_device_tensors(tiny_model_dir: Path):
    """A trainer publishes its GPU parameters through the (host, shared) slots and a rollout
    worker loads them back onto the GPU, bit for bit."""
    cfg = config_from_dict(gpu_config(tiny_model_dir, "areal"))
    trainer = HFPolicy(cfg.model, cfg.train, role="trainer")
    rollout = HFPolicy(cfg.model, cfg.train, role="rollout")
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(0.5)
    spec = [(n, tuple(p.shape), p.dtype) for n, p in trainer.model.named_parameters()]
    slots = WeightSlots(spec, 2, Processes().locked_array(4), shared=True)
    slots.write(1, slots.ordered(dict(trainer.model.named_parameters())))
    slots.publish(1, 1)
    assert slots.read_into(slots.ordered(dict(rollout.model.named_parameters()))) == 1
    assert rollout.state_digest() == trainer.state_digest()
    assert next(rollout.model.parameters()).device == torch.device(GPU)


def test_a_gpu_run_replays_within_a_tolerance(tiny_model_dir: Path, tmp_path: Path):
    run = tmp_path / "run"
    run_mode(config_from_dict(gpu_config(tiny_model_dir, "areal")), run)
    summary = replay_run(run, tmp_path / "replay", tolerance=1e-3)
    divergence = summary["reproducibility"]["replay"]["max_divergence"]
    assert set(divergence) == {"logprob_sum", "loss", "token_mismatches"}
    # same GPU, same kernels: any difference is float reordering, far below the tolerance
    assert divergence["logprob_sum"] < 1e-3 and divergence["loss"] < 1e-3


SLOT_SPEC = [(f"t{i}", (3, i % 5 + 1), torch.float32 if i % 3 else torch.float16)
             for i in range(40)]


def _gpu_values(seed: int) -> list[torch.Tensor]:
    g = torch.Generator(device=GPU).manual_seed(seed)
    return [torch.randn(shape, generator=g, device=GPU).to(dtype)
            for _, shape, dtype in SLOT_SPEC]


def _read_add_one_publish(slots: WeightSlots) -> None:
    """In a spawned worker: read the current state onto the GPU, publish it plus one."""
    got = [torch.empty(shape, dtype=dtype, device=GPU) for _, shape, dtype in SLOT_SPEC]
    assert slots.read_into(got) == 0
    slots.write(1, [t + 1 for t in got])
    slots.publish(1, 1)


@pytest.mark.parametrize("transport", ["host", "pinned", "device"])
def test_each_weight_transport_crosses_processes_bit_for_bit(transport: str):
    """The parent writes GPU tensors, a spawned worker reads them onto its GPU and writes them
    back plus one, the parent reads that: by host memory, page-locked memory or CUDA IPC."""
    vehicle = Processes()
    slots = WeightSlots(SLOT_SPEC, 2, vehicle.locked_array(4), shared=True,
                        transport=transport, device=torch.device(GPU))
    assert all(b.is_cuda == (transport == "device")
               for buffers in slots._buffers for b in buffers.values())
    values = _gpu_values(0)
    slots.write(0, values)
    slots.publish(0, 0)
    worker = vehicle.mp.Process(target=_read_add_one_publish, args=(slots,))
    worker.start()
    worker.join(120)
    assert worker.exitcode == 0
    got = [torch.empty_like(v) for v in values]
    assert slots.read_into(got) == 1
    assert all(torch.equal(g, v + 1) for g, v in zip(got, values, strict=True))


@pytest.mark.parametrize("transport", ["pinned", "device"])
def test_an_areal_run_moves_weights_by_the_transport_it_names(tiny_model_dir: Path,
                                                               tmp_path: Path, transport: str):
    cfg = config_from_dict(gpu_config(tiny_model_dir, "areal",
                                      runtime={"weight_transport": transport}))
    summary = run_mode(cfg, tmp_path / "run")
    validate_summary(summary)
    sync = summary["scheduling"]["weight_sync"]
    assert sync["transport"] == transport and sync["reloads"] > 0


def test_the_static_decoder_samples_as_transformers_does_on_the_gpu(tiny_model_dir: Path):
    """On a GPU the two decoders' kernels may round differently: the same prompts, greedy,
    give the same tokens, and their log-probs agree within 1e-4."""
    outs = []
    for decode in ("hf", "static"):
        cfg = config_from_dict(gpu_config(tiny_model_dir, "sync", model={"decode": decode}))
        outs.append(_greedy(HFPolicy(cfg.model, cfg.train, role="rollout")))
    assert _max_logprob_gap(*outs) < 1e-4


@pytest.mark.parametrize("decode", ["static", "graph"])
def test_a_finish_read_late_on_the_gpu_records_what_reading_it_at_once_does(
        tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, decode: str):
    """The finish flag copied back without a stall and read two steps late (the default on
    CUDA) against read at once, in one chunk of 8 that the rows finish inside: the same
    tokens, log-probs and versions, bit for bit, and the same steps."""
    cfg = config_from_dict(gpu_config(tiny_model_dir, "sync", model={"decode": decode}))
    policy = HFPolicy(cfg.model, cfg.train, role="rollout")
    ids = [policy.encode_prompt(p) for p in ("1+2=", "13+27=", "9+9=")]
    outs = []
    for lag in (FINISH_LAG["cuda"], 0):
        monkeypatch.setitem(FINISH_LAG, "cuda", lag)
        s = policy.sampler(ids, max_new_tokens=8, temperature=1.0, draws=None)
        s.step(8)
        outs.append(([(g.response_ids, g.logprobs, g.versions, g.finished) for g in s.gens],
                     s.steps))
    assert outs[0] == outs[1] and all(f for *_, f in outs[0][0]) and outs[0][1] < 8


def test_auto_decodes_through_captured_graphs_on_the_gpu(tiny_model_dir: Path):
    cfg = config_from_dict(gpu_config(tiny_model_dir, "sync"))
    assert HFPolicy(cfg.model, cfg.train, role="rollout").decoders.kind == "graph"


TWO_GPUS = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")


@TWO_GPUS
@pytest.mark.parametrize("decode", ["static", "graph"])
def test_a_policy_on_the_second_gpu_samples_there_as_on_the_first(
        tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, decode: str):
    """config/paper.yaml's sync runs and replays sample on cuda:1: a policy there, built and
    run from a thread whose current device is cuda:0, captures, replays and reads its finish
    flag on cuda:1, and samples what the same policy on cuda:0 samples."""
    outs = []
    for device in ("cuda:0", "cuda:1"):
        torch.cuda.set_device(0)
        cfg = config_from_dict(gpu_config(tiny_model_dir, "sync", model={
            "decode": decode, "rollout_device": device, "trainer_device": device}))
        policy = HFPolicy(cfg.model, cfg.train, role="rollout")
        torch.cuda.set_device(0)  # as a thread that never bound cuda:1 would have it
        ids = [policy.encode_prompt(p) for p in ("1+2=", "13+27=", "9+9=")]
        s = policy.sampler(ids, max_new_tokens=8, temperature=1.0, draws=None)
        s.step(8)
        outs.append(([(g.response_ids, g.finished) for g in s.gens], s.steps))
    assert outs[0] == outs[1]


@TWO_GPUS
def test_the_paper_placement_runs_sync_and_areal_on_two_gpus(tiny_model_dir: Path,
                                                             tmp_path: Path):
    """Rollout on cuda:0, trainer on cuda:1 (the paper's placement): both modes run, and
    sync, whose one process holds both roles, samples on cuda:1."""
    for mode in ("sync", "areal"):
        cfg = config_from_dict(gpu_config(tiny_model_dir, mode, model={
            "rollout_device": "cuda:0", "trainer_device": "cuda:1"}))
        summary = run_mode(cfg, tmp_path / mode)
        assert summary["samples"]["accepted"] > 0
