"""The device probes of tools/gpu_check.py stage 3 (rlcore/measure/device_probe.py), on CPU:
what CPU allows (the host transport; the hf and static decoders), their dry run."""

from __future__ import annotations

from pathlib import Path

from rlcore.measure.device_probe import decode_probe, transport_probe


def test_the_transport_probe_times_host_slots_bit_for_bit_on_cpu(tiny_model_dir: Path):
    result = transport_probe(str(tiny_model_dir), "cpu", repeats=2)
    assert set(result["transports"]) == {"host"}
    host = result["transports"]["host"]
    assert host["bit_for_bit"] and len(host["writes_s"]) == 2
    assert host["per_version_s"] > 0 and result["state_bytes"] > 0


def test_the_decode_probe_times_each_cpu_decoder_and_hf_generate(tiny_model_dir: Path):
    result = decode_probe(str(tiny_model_dir), "cpu", [4, 8], 3, "fp32")
    assert set(result["step_s"]) == {"hf", "static"}
    assert all(set(by_rows) == {"4", "8"} and min(by_rows.values()) > 0
               for by_rows in result["step_s"].values())
    assert result["best"] in result["step_s"] and result["batch"] == 8
    assert set(result["generate_tokens_per_s"]) == {"hf generate"}
    assert result["ratio_to_hf_generate"] > 0
