"""tools/gpu_check.py's parsing helpers (the script itself needs a GPU: `make gpu-check`)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from tests.tool_module import load_tool


def gpu_check() -> ModuleType:
    return load_tool("gpu_check")


def test_a_profile_is_named_after_the_card():
    g = gpu_check()
    assert g.card_name({"gpu": "NVIDIA H200"}) == "h200"
    assert g.card_name({"gpu": "NVIDIA H100 80GB HBM3"}) == "h100"
    assert g.card_name({"gpu": "Tesla V100-SXM2-32GB"}) == "v100"
    assert g.card_name({"device": "cpu"}) == "cpu"


def test_pytest_counts_read_the_summary_line(tmp_path: Path):
    g = gpu_check()
    log = tmp_path / "pytest.log"
    log.write_text("....s.F\n1 failed, 5 passed, 1 skipped, 2 errors in 41.10s\n")
    assert g.pytest_counts(log) == {"passed": 5, "failed": 1, "skipped": 1, "error": 2,
                                    "deselected": 0}
    assert g.pytest_counts(tmp_path / "absent.log")["passed"] == 0


def test_a_profile_beside_itself_has_every_ratio_one():
    g = gpu_check()
    table = g.compare("v100x2-qwen0.5b-fp16", "v100x2-qwen0.5b-fp16").splitlines()
    ratios = [row.rsplit("|", 2)[1].strip() for row in table[2:] if "**" not in row]
    assert "| update, 4 rows of 136 | 0.08798 | 0.08798 | 1.00 |" in table
    assert ratios and set(ratios) <= {"1.00", "="}


def test_the_overlay_falls_back_to_the_static_step_only_where_the_graph_failed():
    g = gpu_check()
    tiny = g.sizes("tiny")["overlay"]
    assert g.overlay_config(tiny, {}) == tiny
    assert g.overlay_config(tiny, {"static": "RuntimeError: x"}) == tiny
    fell_back = g.overlay_config(tiny, {"graph, fp32 weights": "RuntimeError: capture"})
    assert fell_back["run"]["model"] == {**tiny["run"]["model"], "decode": "static"}
    assert fell_back["run"]["train"] == tiny["run"]["train"]
    assert g.overlay_config({}, {"graph": "x"}) == {"run": {"model": {"decode": "static"}}}
