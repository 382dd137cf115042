"""The device probes of tools/gpu_check.py stage 2 (rlcore/measure/device_probe.py), on CPU:
what CPU allows (the host transport; the hf and static decoders), their dry run."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import GenerationMixin

from rlcore.config import config_from_dict
from rlcore.measure import device_probe
from rlcore.measure.device_probe import decode_probe, transport_probe
from rlcore.policy.hf_policy import HFPolicy


def test_the_transport_probe_times_host_slots_bit_for_bit_on_cpu(tiny_model_dir: Path):
    result = transport_probe(str(tiny_model_dir), "cpu", repeats=2)
    assert set(result["transports"]) == {"host"}
    host = result["transports"]["host"]
    assert host["bit_for_bit"] and len(host["writes_s"]) == 2
    assert host["per_version_s"] > 0 and result["state_bytes"] > 0 and result["errors"] == {}
    assert result["skipped"] == {} and result["finished"]


def test_the_decode_probe_times_each_cpu_decoder_and_hf_generate(tiny_model_dir: Path):
    result = decode_probe(str(tiny_model_dir), "cpu", [4, 8], 3, "fp32")
    assert set(result["step_s"]) == {"hf", "static"}
    assert all(set(by_rows) == {"4", "8"} and min(by_rows.values()) > 0
               for by_rows in result["step_s"].values())
    assert result["best"] in result["step_s"] and result["batch"] == 8
    assert set(result["generate_tokens_per_s"]) == {"hf generate"}
    assert result["ratio_to_hf_generate"] > 0 and result["errors"] == {}


def test_a_failing_decoder_is_recorded_and_the_others_still_timed(
        tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """One decoder that raises (as a capture refused on some GPU would) costs its own figure:
    the probe records its error, times the others, writes its file and exits 1."""
    timed = device_probe._step_s

    def static_fails(policy, rows, steps):
        if policy.decoders.kind == "static":
            raise RuntimeError("capture refused")
        return timed(policy, rows, steps)

    monkeypatch.setattr(device_probe, "_step_s", static_fails)
    out = tmp_path / "decode.json"
    code = device_probe.main(["decode", str(tiny_model_dir), "--device", "cpu", "--out",
                              str(out), "--batches", "4", "--steps", "2", "--dtype", "fp32"])
    result = json.loads(out.read_text())
    assert code == 1
    assert result["errors"] == {"static": "RuntimeError: capture refused"}
    assert set(result["step_s"]) == {"hf"} and result["best"] == "hf"
    assert result["ratio_to_hf_generate"] > 0


def test_a_failing_transport_is_recorded(tiny_model_dir: Path,
                                         monkeypatch: pytest.MonkeyPatch):
    def refused(*args):
        raise RuntimeError("cudaHostRegister refused")

    monkeypatch.setattr(device_probe, "_version_s", refused)
    result = transport_probe(str(tiny_model_dir), "cpu", repeats=1)
    assert result["transports"] == {}
    assert result["errors"] == {"host": "RuntimeError: cudaHostRegister refused"}


def test_the_transport_probe_saves_each_transport_as_it_is_measured(tiny_model_dir: Path):
    snapshots: list[dict[str, Any]] = []
    transport_probe(str(tiny_model_dir), "cpu", repeats=1,
                    save=lambda r: snapshots.append(copy.deepcopy(r)))
    assert "host" in snapshots[0]["transports"] and not snapshots[0]["finished"]
    assert snapshots[-1]["finished"]


def test_slots_shared_memory_cannot_hold_are_skipped_before_any_is_made(
        tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch):
    """A /dev/shm too small for two slots: the host transport is recorded as skipped with
    check_shared_memory's reason, not allocated (SIGBUS would end the probe unrecorded)."""
    def no_slots(*args, **kwargs):
        raise AssertionError("slots allocated past /dev/shm's size")

    monkeypatch.setattr(device_probe, "shared_memory_free", lambda: 1024)
    monkeypatch.setattr(device_probe, "WeightSlots", no_slots)
    result = transport_probe(str(tiny_model_dir), "cpu", repeats=1)
    assert result["transports"] == {} and result["errors"] == {}
    assert "/dev/shm" in result["skipped"]["host"] and result["finished"]


def test_a_decode_probe_stopped_midway_keeps_each_batch_it_timed(
        tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The probe killed at HF generate (an interrupt is not a recorded failure): its file
    already holds every decoder's batches, marked unfinished."""
    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(device_probe, "_generate_tokens_per_s", interrupted)
    out = tmp_path / "decode.json"
    with pytest.raises(KeyboardInterrupt):
        device_probe.main(["decode", str(tiny_model_dir), "--device", "cpu", "--out",
                           str(out), "--batches", "2", "4", "--steps", "2", "--dtype", "fp32"])
    result = json.loads(out.read_text())
    assert not result["finished"]
    assert {k: set(v) for k, v in result["step_s"].items()} == {"hf": {"2", "4"},
                                                               "static": {"2", "4"}}
    assert result["best"] in ("hf", "static") and "ratio_to_hf_generate" not in result


def test_hf_generate_samples_without_the_model_s_generation_defaults(
        tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch):
    """The model's generation_config.json asks for a repetition penalty and top-k 20 (as
    Qwen's and the stand-in's do); the baseline samples plainly, as the sampler does."""
    cfg = config_from_dict({"model": {"path": str(tiny_model_dir), "rollout_device": "cpu",
                                      "trainer_device": "cpu"}})
    policy = HFPolicy(cfg.model, cfg.train, role="rollout")
    own = policy.decoders.model.generation_config
    own.repetition_penalty, own.top_k = 1.05, 20
    used = []
    prepare = GenerationMixin._prepare_generation_config

    def spy(self, *args, **kwargs):
        config, model_kwargs = prepare(self, *args, **kwargs)
        used.append(config)
        return config, model_kwargs

    monkeypatch.setattr(GenerationMixin, "_prepare_generation_config", spy)
    assert device_probe._generate_tokens_per_s(policy, 2, 3) > 0
    assert len(used) == 2
    assert all(c.repetition_penalty in (None, 1.0) and c.top_k == 0 and c.eos_token_id is None
               for c in used)
    assert policy.decoders.model.generation_config is own  # given back after each call
    assert torch.is_grad_enabled()
