"""tools/gpu_check.py's plan and helpers, and tools/device_wheels.py's list (the stages
themselves need a GPU: `make gpu-check`; on CPU, their dry run is `--device cpu --size
tiny`)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.tool_module import load_tool


def gpu_check() -> ModuleType:
    return load_tool("gpu_check")


def device_wheels() -> ModuleType:
    return load_tool("device_wheels")


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


def test_every_stage_fits_one_device_command_on_a_bare_machine():
    """Its worst case, the sum of its steps' limits with the wheels' install and the
    stand-in's build beside the machine step, is at most 7 minutes."""
    g = gpu_check()
    assert g.COMMAND_LIMIT_S == 420
    for n, stage in g.STAGES.items():
        b = g.budget(n)
        assert b["total"] <= g.COMMAND_LIMIT_S, g.budget_table()
        assert b["total"] == (g.LIMITS["wheels"] + max(g.LIMITS["machine"],
                                                       g.LIMITS["stand_in"])
                              + sum(g.LIMITS[s] for s in stage.steps) + g.OVERHEAD_S)
    assert g.budget("1", {"pytest_cuda": 400})["total"] > g.COMMAND_LIMIT_S


def test_no_step_runs_in_two_stages_and_every_step_has_a_limit_and_a_command():
    g = gpu_check()
    steps = [s for stage in g.STAGES.values() for s in stage.steps]
    assert len(steps) == len(set(steps)) and not set(steps) & set(g.SETUP)
    args = g.resolve(g.parser().parse_args(["--out", "/tmp/o"]))
    assert set(g.commands(args, {"gpu": "NVIDIA H200"})) == set(g.LIMITS) == {*steps, *g.SETUP}


def test_the_first_stage_runs_the_cuda_checks_for_a_minute():
    g = gpu_check()
    assert g.STAGES["1"].steps[0] == "cuda_checks" and g.LIMITS["cuda_checks"] == 60
    args = g.resolve(g.parser().parse_args(["--out", "/tmp/o", "--work", "/tmp/w"]))
    cmd = g.commands(args, {})["cuda_checks"]
    assert cmd[1:6] == ["-m", "rlcore.measure.cuda_checks", "--out",
                        str(Path("/tmp/o").resolve() / "cuda_checks.json"), "--device"]


def test_every_module_a_step_runs_exists():
    """`python -m X` of each step names a module of this tree or one installed here."""
    g = gpu_check()
    modules = {cmd[2] for cmd in g.step_commands() if cmd[1] == "-m"}
    assert {"rlcore.measure.cuda_checks", "rlcore.measure.device_probe", "pytest",
            "snakemake", "pip"} <= modules
    assert [m for m in modules if importlib.util.find_spec(m) is None] == []


def test_pytest_cuda_collects_the_files_with_cuda_tests():
    g = gpu_check()
    assert "tests/test_cuda.py" in g.cuda_test_files()
    assert "tests/test_gpu_check.py" not in g.cuda_test_files()


def test_every_module_the_stages_import_is_on_the_gpu_machine_or_carried():
    """From the stages' sources and their `python -m` modules, through what each
    distribution needs at the lock's versions: the image's packages or the wheel list."""
    w = device_wheels()
    modules = w.stage_modules()
    assert {"rlcore", "torch", "transformers", "math_verify", "snakemake", "pytest",
            "yaml"} <= set(modules)
    assert w.uncovered(modules) == []
    without = [n for n in w.NEEDED if n not in ("math-verify", "antlr4-python3-runtime")]
    assert w.uncovered(modules, needed=without) == [
        "math-verify is neither in the GPU machine's image nor carried",
        "antlr4-python3-runtime is neither in the GPU machine's image nor carried"]


def test_a_carried_package_needing_another_version_than_the_image_s_is_named(
        monkeypatch: pytest.MonkeyPatch):
    w = device_wheels()
    monkeypatch.setitem(w.IMAGE_VERSIONS, "numpy", "1.0.0")
    problems = w.uncovered({"transformers": {Path("x.py")}})
    assert any(p.startswith("transformers needs numpy") for p in problems), problems


def test_each_carried_wheel_is_in_the_lock():
    w = device_wheels()
    locked = w.pins()
    assert [n for n in w.NEEDED if w.canonical(n) not in locked] == []
    assert len(set(map(w.canonical, w.NEEDED))) == len(w.NEEDED)


def check(tmp_path: Path, limits: dict[str, float]) -> Any:
    g = gpu_check()
    return g.Check(tmp_path / "out", tmp_path / "work", limits)


def test_each_step_s_log_tail_is_under_out_as_it_ends(tmp_path: Path):
    c = check(tmp_path, {"talk": 30})
    assert c.step("talk", [sys.executable, "-c", "for i in range(300): print('line', i)"])
    tails = (tmp_path / "out" / "step_logs.txt").read_text().splitlines()
    assert tails[0] == "==> talk: ok <=="
    assert tails[1:201] == [f"line {i}" for i in range(100, 300)]
    record = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert record["steps"]["talk"]["status"] == "ok"


def test_a_step_past_its_limit_is_killed_and_its_tail_kept(tmp_path: Path):
    c = check(tmp_path, {"hang": 1.5})
    started = c.start("hang", [sys.executable, "-c",
                               "import time; print('before', flush=True); time.sleep(60)"])
    assert not c.finish("hang", started)
    assert c.data["steps"]["hang"]["status"] == "timeout"
    text = (tmp_path / "out" / "step_logs.txt").read_text()
    assert "==> hang: timeout <==\nbefore\n" in text


def test_a_running_step_s_tail_is_refreshed_under_out(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch):
    """So that a command stopped from outside, mid-step, still returns what it printed."""
    g = gpu_check()
    monkeypatch.setattr(g, "TAIL_EVERY_S", 0.2)
    c = g.Check(tmp_path / "out", tmp_path / "work", {"slow": 30})
    seen = []
    save = c.save_tail

    def spy(name):
        save(name)
        seen.append((tmp_path / "out" / "step_logs.txt").read_text())

    c.save_tail = spy
    assert c.step("slow", [sys.executable, "-c",
                           "import time; print('early', flush=True); time.sleep(1.5)"])
    assert any("==> slow: running <==\nearly\n" in text for text in seen[:-1])


def test_the_overlay_decodes_static_where_the_decode_probe_failed_stopped_or_wrote_nothing():
    g = gpu_check()
    fail = g.captured_step_failure
    done = {"errors": {}, "finished": True}
    assert fail(None, None) is None  # no probe on this machine
    assert fail({"status": "ok"}, done) is None
    # another decoder's failure: the graph was measured, the probe finished
    assert fail({"status": "exit 1"}, {"errors": {"static": "x"}, "finished": True}) is None
    assert "graph, fp32 weights failed" in fail(
        {"status": "exit 1"}, {"errors": {"graph, fp32 weights": "RuntimeError: capture"},
                               "finished": True})
    assert "wrote no JSON (exit -7)" in fail({"status": "exit -7"}, None)
    assert "stopped before it finished (timeout)" in fail({"status": "timeout"},
                                                          {"errors": {}, "finished": False})

    tiny = g.sizes("tiny")["overlay"]
    assert g.overlay_config(tiny, None) == tiny
    fell_back = g.overlay_config(tiny, "the decode probe wrote no JSON (timeout)")
    assert fell_back["run"]["model"] == {**tiny["run"]["model"], "decode": "static"}
    assert fell_back["run"]["train"] == tiny["run"]["train"]
    assert g.overlay_config({}, "x") == {"run": {"model": {"decode": "static"}}}


def test_the_machine_is_described_with_its_shared_memory():
    env = gpu_check().environment("cpu")
    assert env["device"] == "cpu" and env["cpu_count"] >= 1
    assert "dev_shm_free_bytes" in env and "torch" in env


def test_docs_state_each_stage_s_worst_case_as_the_script_budgets_it():
    g = gpu_check()
    text = (Path(__file__).resolve().parents[1] / "docs" / "setup.md").read_text()
    rows = dict(re.findall(r"^\| (\d) [^|]+\|.*\| (\d+) s \|$", text, re.M))
    assert rows == {n: f"{g.budget(n)['total']:g}" for n in g.STAGES}
