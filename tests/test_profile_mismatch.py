"""A virtual run or plan whose config would decode or copy weights otherwise than its hardware
profile priced says so: `profile_mismatch` in its summary.json (or plan) and one warning line.
What the config would take is resolved on the kind of device the profile priced."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlcore.cli import main
from rlcore.clock.profile import HardwareProfile
from rlcore.config import RunConfig, config_from_dict
from rlcore.plan.planner import plan, workload
from rlcore.record.summary import mismatch_warning, profile_mismatch, transport_on
from rlcore.runners import run_mode
from tests.conftest import small_config
from tests.test_virtual_clock import RUN_PROFILE, profile, virtual_config

PAPER = {"decode_path": "hf", "weight_transport": "host"}  # what the shipped profiles price


def priced(device_type: str | None, **labels: str) -> HardwareProfile:
    return dataclasses.replace(profile(), **{**PAPER, "device_type": device_type, **labels})


def config(model: Path, mode: str = "areal", **model_keys: str) -> RunConfig:
    return config_from_dict(small_config(model, mode=mode,
                                         model={"path": str(model), **model_keys}))


class TestWhatTheConfigWouldTake:
    def test_auto_devices_are_those_of_the_profile(self, tiny_model_dir: Path):
        """The emulated 2x V100: `auto` would capture graphs and copy device to device
        there, whatever this machine has; the 2-core CPU's: the static step and host."""
        cfg = config(tiny_model_dir)
        assert profile_mismatch(cfg, priced("cuda")) == {
            "decode_path": {"priced": "hf", "config": "graph"},
            "weight_transport": {"priced": "host", "config": "device"}}
        assert profile_mismatch(cfg, priced("cpu")) == {
            "decode_path": {"priced": "hf", "config": "static"}}

    def test_a_named_device_is_its_own_kind(self, tiny_model_dir: Path):
        cfg = config(tiny_model_dir, rollout_device="cpu")
        assert profile_mismatch(cfg, priced("cuda")) == {
            "decode_path": {"priced": "hf", "config": "static"}}

    def test_the_paths_it_priced_are_no_mismatch(self, tiny_model_dir: Path):
        cfg = config_from_dict(small_config(
            tiny_model_dir, mode="async", model={"path": str(tiny_model_dir), "decode": "hf"},
            runtime={"weight_transport": "host"}))
        assert profile_mismatch(cfg, priced("cuda")) == {}
        # a model the static step cannot mirror decodes hf under auto
        assert profile_mismatch(config(tiny_model_dir, attn_implementation="eager"),
                                priced("cpu")) == {}

    def test_sync_decodes_on_its_trainer_and_copies_no_weights(self, tiny_model_dir: Path):
        cfg = config(tiny_model_dir, "sync", trainer_device="cpu")
        assert profile_mismatch(cfg, priced("cuda")) == {
            "decode_path": {"priced": "hf", "config": "static"}}
        assert profile_mismatch(config(tiny_model_dir, "sync"), priced("cuda", decode_path="graph")
                                ) == {}

    def test_a_setting_refused_there_stays_as_set(self, tiny_model_dir: Path):
        cfg = config(tiny_model_dir, decode="graph")
        assert profile_mismatch(cfg, priced("cpu"))["decode_path"] == {"priced": "hf",
                                                                       "config": "graph"}

    def test_a_profile_that_does_not_say_and_the_wall_clock(self, tiny_model_dir: Path):
        cfg = config(tiny_model_dir)
        assert profile_mismatch(cfg, profile()) == {}
        assert profile_mismatch(cfg, None) is None

    @pytest.mark.parametrize(("setting", "device", "expected"), [
        ("auto", "cuda", "device"), ("auto", "cpu", "host"), ("pinned", "cuda", "pinned"),
        ("pinned", "cpu", "pinned"), ("host", "cuda", "host")])
    def test_a_transport_the_device_refuses_is_compared_as_set(self, setting: str,
                                                               device: str, expected: str):
        assert transport_on(setting, device) == expected

    def test_the_warning_names_both_paths_of_each(self):
        line = mismatch_warning(priced("cuda"), {
            "decode_path": {"priced": "hf", "config": "graph"},
            "weight_transport": {"priced": "host", "config": "device"}})
        assert "\n" not in line and line.startswith("warning: hardware profile test prices ")
        assert ("decode path hf and weight transport host, where this config would take "
                "decode path graph and weight transport device on its cuda devices") in line


def labelled_profile(tmp_path: Path, device_type: str) -> None:
    """virtual_config's profile file, saying it priced the paper's paths on `device_type`."""
    (tmp_path / "test-run.yaml").write_text(yaml.safe_dump(
        {**RUN_PROFILE, **PAPER, "device_type": device_type}))


def warnings_in(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("warning: hardware profile")]


def test_a_virtual_run_records_and_prints_what_its_profile_did_not_price(
        tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    labelled_profile(tmp_path, "cpu")
    summary = run_mode(virtual_config(tiny_model_dir, tmp_path, "sync", 0), tmp_path / "run")
    mismatch = {"decode_path": {"priced": "hf", "config": "static"}}
    assert summary["profile_mismatch"] == mismatch
    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert written["profile_mismatch"] == mismatch
    [line] = warnings_in(capsys.readouterr().err)
    assert "test-run prices decode path hf" in line and "decode path static" in line


def test_a_plan_records_what_its_profile_did_not_price_and_says_it_once(
        tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    labelled_profile(tmp_path, "cuda")
    cfg = virtual_config(tiny_model_dir, tmp_path, "areal", 1)
    expected: dict[str, Any] = {"decode_path": {"priced": "hf", "config": "graph"},
                                "weight_transport": {"priced": "host", "config": "device"}}
    assert plan(cfg, workload(cfg))["profile_mismatch"] == expected
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg.to_dict()))
    out = tmp_path / "plans.json"
    assert main(["plan", str(path), "--sweep", "staleness.staleness_k=1,2", "--mean-tokens",
                 "3", "--out", str(out)]) == 0
    assert [p["profile_mismatch"] for p in json.loads(out.read_text())] == [expected] * 2
    [line] = warnings_in(capsys.readouterr().err)  # the same for both: said once
    assert "decode path graph and weight transport device on its cuda devices" in line
