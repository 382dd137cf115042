"""The device probes of tools/gpu_check.py stage 3 (rlcore/measure/device_probe.py), on CPU:
what CPU allows (the host transport; the hf and static decoders), their dry run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlcore.measure import device_probe
from rlcore.measure.device_probe import decode_probe, transport_probe


def test_the_transport_probe_times_host_slots_bit_for_bit_on_cpu(tiny_model_dir: Path):
    result = transport_probe(str(tiny_model_dir), "cpu", repeats=2)
    assert set(result["transports"]) == {"host"}
    host = result["transports"]["host"]
    assert host["bit_for_bit"] and len(host["writes_s"]) == 2
    assert host["per_version_s"] > 0 and result["state_bytes"] > 0 and result["errors"] == {}


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

    def static_fails(policy, kind, batches, steps):
        if kind == "static":
            raise RuntimeError("capture refused")
        return timed(policy, kind, batches, steps)

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
