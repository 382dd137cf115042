"""`rlcore smoke` (rlcore/measure/smoke.py) and the process-tree memory watch it relies on
(rlcore/measure/memory_watch.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rlcore.cli import main
from rlcore.measure import memory_watch
from rlcore.measure.memory_watch import TreeWatch, memory_in_use, status_bytes
from rlcore.measure.smoke import table
from rlcore.policy.stand_in import build_stand_in

ROOT = Path(__file__).resolve().parents[1]
UPDATES = 4  # one more than the batches rollout may start from version 0 (K + 1, K = 2)
# Processes of the AReaL-style run beside its main one; threaded roles are threads of main.
WORKERS = {"forkserver", "param_service", "rollout0", "trainer0"}
# Short-lived helpers a poll may catch: the run's `git rev-parse HEAD` (environment_info), and
# multiprocessing's resource tracker. Neither loads torch: a few MiB.
# A helper may be caught between fork and exec (memory_watch.FORK), e.g. on its way to git.
HELPERS = {"git", "resource_tracker", memory_watch.FORK}
STATUS = """Name:\tpython
VmPeak:\t  123456 kB
VmHWM:\t    2048 kB
VmRSS:\t    1024 kB
Threads:\t4
"""


def test_a_child_not_yet_execd_is_labelled_a_fork_and_an_execd_one_by_its_command():
    forked = subprocess.Popen([sys.executable, "-c", "import os, time\n"
                               "pid = os.fork()\n"
                               "if pid == 0: time.sleep(30)\n"
                               "else: print(pid, flush=True); time.sleep(30)"],
                              stdout=subprocess.PIPE, text=True)
    execd = subprocess.Popen(["sleep", "30"])
    child = 0
    try:
        assert forked.stdout is not None
        child = int(forked.stdout.readline())
        assert memory_watch._label(child) == memory_watch.FORK
        assert memory_watch._label(forked.pid) not in ("", memory_watch.FORK)
        assert memory_watch._label(execd.pid) == "sleep"
    finally:
        if child:  # never 0: that would signal this process group
            os.kill(child, signal.SIGKILL)
        forked.kill()
        execd.kill()
        forked.wait()
        execd.wait()


def test_status_fields_are_read_in_bytes():
    assert status_bytes(STATUS, "VmHWM") == 2048 * 1024
    assert status_bytes(STATUS, "VmRSS") == 1024 * 1024
    assert status_bytes(STATUS, "Threads") == 4
    assert status_bytes(STATUS, "VmSwap") is None  # a kernel thread's status lacks it


def test_machine_memory_in_use_is_total_less_available():
    meminfo = "MemTotal:       1000 kB\nMemFree:         100 kB\nMemAvailable:    600 kB\n"
    assert memory_in_use(meminfo) == 400 * 1024
    with pytest.raises(ValueError, match="MemAvailable"):
        memory_in_use("MemTotal:       1000 kB\n")


def test_the_watch_sees_a_grandchild_peak_after_it_freed_it():
    """A child starts a grandchild that touches 200 MB, frees it and sleeps: the watch names
    both processes and keeps the grandchild's peak, not its resident set at the end."""
    grandchild = ("b = bytearray(200 * 2**20); del b; import time; time.sleep(1.5)")
    child = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {grandchild!r}])"
    proc = subprocess.Popen([sys.executable, "-c", child])
    watch = TreeWatch(proc.pid, interval_s=0.05).start()
    proc.wait()
    watch.stop()
    peaks = sorted(p.peak_rss_bytes for p in watch.processes.values())
    assert len(peaks) == 2 and proc.pid in watch.processes
    assert peaks[-1] > 200 * 2**20 > peaks[0]


def test_the_machine_peak_is_above_the_start(monkeypatch: pytest.MonkeyPatch):
    """Memory in use at the start is the baseline; the peak is the largest rise after it
    (a fall below the start, something else freeing memory, reads as no rise)."""
    readings = iter([5000, 5300, 5900, 5200, 4000])
    monkeypatch.setattr(memory_watch, "_machine_in_use", lambda: next(readings))
    watch = TreeWatch(2**22 + 1)  # no such process: only the machine is looked at
    for _ in range(4):
        watch.poll()
    assert (watch.machine_baseline_bytes, watch.machine_peak_bytes) == (5000, 900)
    assert watch.processes == {}


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("stand-in") / "qwen"
    build_stand_in(out, "tiny")
    return out


@pytest.mark.slow
def test_smoke_runs_the_paper_config_in_every_mode_and_scores_it(qwen_dir: Path,
                                                                 tmp_path: Path, capsys):
    """config/paper.yaml's code path (chat prompts, its batch and K) on the tiny stand-in:
    each mode in its own process, its figures measured, its final policy evaluated.

    With AReaL's admission (`staleness_control: both`, one of paper.yaml's presets) at
    K = 2, rollout may start at most K + 1 = 3 batches from version 0, and 4 updates need a
    4th: the rollout of each asynchronous mode must load a newer version to get there."""
    out = tmp_path / "smoke"
    assert main(["smoke", str(ROOT / "config" / "paper.yaml"), "--model", str(qwen_dir),
                 "--device", "cpu", "--out", str(out), "--updates", str(UPDATES),
                 "--staleness-k", "2", "--set", "staleness.staleness_control=both",
                 "--max-new-tokens", "4", "--eval-tasks", "4"]) == 0
    result = json.loads((out / "smoke.json").read_text())
    assert list(result["modes"]) == ["sync", "async", "areal"]
    slots = result["state"]["areal_weight_slots_bytes"]
    assert slots == 2 * result["state"]["fp32_bytes"] > 0
    assert result["one_copy_device"] == "cpu" and result["one_copy_s"] > 0
    for mode, m in result["modes"].items():
        config = json.loads((out / mode / "config.json").read_text())["config"]
        assert config["model"]["prompt_format"] == "chat" and config["mode"] == mode
        assert m["updates"] == UPDATES and m["s_per_update"] > 0 and m["tokens_per_s"] > 0
        assert m["trained_tokens"] <= UPDATES * 4 * 4  # updates x batch x max_new_tokens
        assert m["trained_tokens_per_s"] * m["wall_s"] == pytest.approx(m["trained_tokens"])
        assert m["eval"]["tasks"] == 4 and m["eval"]["peak_rss_bytes"] > 0
        assert (out / mode / "eval.json").is_file() and (out / f"{mode}.log").is_file()
        peaks = {p["process"]: p["peak_rss_bytes"] for p in m["processes"]}
        roles = {"main", *(WORKERS if mode == "areal" else ())}
        assert set(peaks) - HELPERS == roles, peaks
        # every role's process has loaded torch (hundreds of MiB); a helper need not have
        assert all(peaks[r] > 10 * 2**20 for r in roles), peaks
        assert m["gpu_peak_bytes"] == dict.fromkeys(("rollout", "trainer", "weight_slots"))  # CPU
        if mode == "areal":
            assert m["shm_peak_bytes"] >= slots  # the weight slots live in /dev/shm
        ws = m["weight_sync"]
        if mode != "sync":  # rollout loaded a newer version at least once
            assert ws["reloads"] >= 1
        assert (ws["per_version_vs_one_copy"] is None) == (ws["reloads"] == 0)
        if ws["reloads"]:
            assert ws["per_version_vs_one_copy"] == pytest.approx(
                ws["per_version_s"] / result["one_copy_s"])
    assert result["modes"]["sync"]["weight_sync"]["reloads"] == 0  # updated in place
    gen = result["generate"]  # rollout sampling against HF generate, one training batch
    assert (gen["device"], gen["batch"], gen["max_new_tokens"]) == ("cpu", 4, 4)
    assert all(len(v) == 3 and min(v) > 0 for v in gen["tokens_per_s"].values())
    assert gen["ratio_to_hf_generate"] == pytest.approx(
        gen["rollout_tokens_per_s"] / gen["hf_generate_tokens_per_s"])
    printed = capsys.readouterr().out
    assert "areal: main" in printed and "param_service" in printed
    assert "HF generate" in printed and "peak GPU memory" not in printed
    result["modes"]["areal"]["gpu_peak_bytes"] = {"rollout": 3 * 2**30, "trainer": 2**29}
    assert "  areal: rollout 3.00 GiB, trainer 0.50 GiB" in table(result)


def test_smoke_refuses_an_incomplete_model_directory_before_running(qwen_dir: Path,
                                                                    tmp_path: Path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text((qwen_dir / "config.json").read_text())
    assert main(["smoke", str(ROOT / "config" / "paper.yaml"), "--model", str(model),
                 "--out", str(tmp_path / "smoke")]) == 2
    assert "model.safetensors" in capsys.readouterr().err
    assert not (tmp_path / "smoke").exists()
