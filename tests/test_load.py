"""Contention: other processes' CPU time over a run's measured window
(rlcore/record/machine_load.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlcore.config import config_from_dict
from rlcore.record.machine_load import (
    CONTENDED_CORES,
    contention,
    machine_cpu_seconds,
    process_age_s,
)
from rlcore.runners.sync import sync_train
from tests.conftest import small_config


class TestContention:
    def test_other_processes_share(self):
        # the machine was busy 5 s over 4 s of window, the run itself used 3 s: 0.5 cores other
        assert contention(machine_cpu_s=5.0, run_cpu_s=3.0, window_s=4.0) == (0.5, True)

    def test_an_idle_machine_is_not_contended(self):
        other, contended = contention(machine_cpu_s=3.1, run_cpu_s=3.0, window_s=4.0)
        assert other == pytest.approx(0.025) and not contended

    def test_the_run_cannot_use_more_than_the_machine(self):
        # clock ticks are coarser than process_time: never a negative share
        assert contention(2.99, 3.0, 4.0) == (0.0, False)

    def test_the_threshold(self):
        assert contention(CONTENDED_CORES * 4.0 + 1e-9, 0.0, 4.0)[1]
        assert not contention(CONTENDED_CORES * 4.0, 0.0, 4.0)[1]


def test_machine_cpu_reads_busy_ticks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import os

    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal: busy = 100 + 0 + 50 + 7 + 3 + 0
    stat.write_text("cpu  100 0 50 900 40 7 3 0 0 0\ncpu0 1 2 3 4\n")
    monkeypatch.setattr(os, "sysconf", lambda name: 100)
    assert machine_cpu_seconds(stat) == pytest.approx(1.6)
    assert machine_cpu_seconds(tmp_path / "absent") is None


def test_process_age_from_its_start_tick(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import os

    stat, uptime = tmp_path / "stat", tmp_path / "uptime"
    # a command name with a space and a parenthesis; field 22 (starttime) = 1250 ticks
    stat.write_text("42 (a b) c) S 1 " + " ".join(["0"] * 17) + " 1250 99 7\n")
    uptime.write_text("20.00 35.10\n")
    monkeypatch.setattr(os, "sysconf", lambda name: 100)
    assert process_age_s(stat, uptime) == pytest.approx(7.5)  # 20 s up - 12.5 s at start
    assert process_age_s(tmp_path / "absent", uptime) is None


def test_a_new_process_is_as_old_as_what_it_did():
    """What `time.startup_s` reads, in a fresh interpreter that slept 0.5 s."""
    script = ("import time, sys; from rlcore.record.machine_load import process_age_s; "
              "time.sleep(0.5); print(process_age_s())")
    age = float(subprocess.run([sys.executable, "-c", script], capture_output=True,
                               text=True, check=True).stdout)
    assert 0.5 <= age < 60


def test_a_run_beside_a_cpu_burner_is_flagged(tiny_model_dir: Path, tmp_path: Path):
    """A process spinning on a core while a sync run is timed: the summary says so."""
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        cfg = config_from_dict(small_config(tiny_model_dir, train={"updates": 30}))
        sync_train(cfg, tmp_path / "run")
    finally:
        burner.kill()
        burner.wait()
    load = json.loads((tmp_path / "run" / "summary.json").read_text())["load"]
    assert load["run_cpu_s"] > 0 and load["machine_cpu_s"] >= load["run_cpu_s"] - 0.1
    assert load["other_cores"] > 0.5 and load["contended"]
