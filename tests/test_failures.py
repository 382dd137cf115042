"""Failure handling of the asynchronous runtime: a worker that dies or raises stops the run at
once, leaves no process behind and never makes a failed run look complete."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml

from rlcore.config import config_from_dict
from rlcore.errors import WorkerFailed
from rlcore.runners.asynchronous.runtime import run_async
from rlcore.runners.asynchronous.vehicles import Processes, Threads
from tests.conftest import small_config

REPO = Path(__file__).resolve().parent.parent
WORKERS = ("param_service", "rollout0", "trainer0")
# Runs far longer than any test: it only ends because a test kills part of it.
ENDLESS = {"train": {"updates": 100000, "update_batch_size": 8},
           "staleness": {"staleness_k": 2}}
START_TIMEOUT_S = 120  # imports, three workers loading the model, a first commit
EXIT_TIMEOUT_S = 30  # from the kill to the exit of the main process
GONE_TIMEOUT_S = 5  # from the exit (or kill) of the main process to the end of every worker


# --- processes ------------------------------------------------------------------------------
class Stat(NamedTuple):
    state: str  # R, S, D, Z, ...
    ppid: int
    cpu: int  # user + system time, clock ticks
    start: int  # start time after boot, clock ticks: with the pid, names one process


def proc_stat(pid: int) -> Stat | None:
    """What /proc/<pid>/stat says of a process; None if there is none."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    f = text[text.rindex(")") + 2:].split()  # the command name may hold spaces
    return Stat(f[0], int(f[1]), int(f[11]) + int(f[12]), int(f[19]))


def descendants(pid: int) -> list[int]:
    """Every live descendant of a process, from the parent pids in /proc/*/stat."""
    parent = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := proc_stat(int(entry.name))) is not None:
            parent[int(entry.name)] = stat.ppid
    out, frontier = [], {pid}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier}
        out += sorted(frontier)
    return out


class Workers:
    """The worker processes of one run, named, each pinned by its start time (no pid reuse)."""

    def __init__(self) -> None:
        self.pids: dict[str, int] = {}
        self.starts: dict[int, int] = {}

    def add(self, name: str, pid: int) -> None:
        stat = proc_stat(pid)
        assert stat is not None, f"{name} (pid {pid}) reported ready but does not exist"
        self.pids[name] = pid
        self.starts[pid] = stat.start

    def add_unnamed(self, pid: int) -> None:
        stat = proc_stat(pid)
        if stat is not None:
            self.starts.setdefault(pid, stat.start)

    def alive(self, pid: int, main_exited: bool) -> bool:
        """Still running: present, the same process, and not a zombie nobody will wait for."""
        stat = proc_stat(pid)
        if stat is None or stat.start != self.starts[pid]:
            return False
        return not (stat.state in "ZX" and main_exited)

    def wait_gone(self, main: subprocess.Popen | None, timeout: float,
                  idle_s: float | None = None) -> list[str]:
        """Names of the workers still alive after `timeout` seconds -- or, with `idle_s`, as
        soon as every one left has used no CPU for that long (blocked for good)."""
        deadline = time.monotonic() + timeout
        busy = {pid: (-1, time.monotonic()) for pid in self.pids.values()}  # cpu, when it moved
        while True:
            now, exited = time.monotonic(), main is None or main.poll() is not None
            left = [name for name, pid in self.pids.items() if self.alive(pid, exited)]
            if not left or now > deadline:
                return left
            for name in left:
                pid = self.pids[name]
                cpu = getattr(proc_stat(pid), "cpu", -1)
                if cpu != busy[pid][0]:
                    busy[pid] = (cpu, now)
            if idle_s is not None and all(now - busy[self.pids[n]][1] > idle_s for n in left):
                return left
            time.sleep(0.05)

    def kill_all(self) -> None:
        for pid in self.starts:
            if self.alive(pid, main_exited=False):
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def write_config(tmp_path: Path, model_dir: Path, **sections: Any) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(small_config(model_dir, **sections)))
    return path


def read_events(out: Path) -> list[dict[str, Any]]:
    """The complete lines of a live run's events.jsonl.partial."""
    try:
        text = (out / "events.jsonl.partial").read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


@contextmanager
def live_run(config: Path, out: Path, log: Path, *extra: str,
             names: tuple[str, ...] = WORKERS) -> Iterator[tuple[subprocess.Popen, Workers]]:
    """`rlcore run` in a subprocess, yielded once every worker is ready and one update has
    been committed; on the way out the run and every process it started are killed."""
    workers = Workers()
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlcore", "run", str(config), "--out", str(out), *extra],
            stdout=subprocess.DEVNULL, stderr=err, cwd=REPO)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            events = read_events(out)
            ready = {e["worker"]: e["pid"] for e in events if e["type"] == "worker_ready"}
            committed = any(e["type"] == "version_change" for e in events)
            if set(ready) == set(names) and committed:
                break
            assert proc.poll() is None, (
                f"the run ended (code {proc.returncode}) before its first commit:\n"
                f"{log.read_text()}")
            assert time.monotonic() < deadline, (
                f"no first commit within {START_TIMEOUT_S} s (ready: {sorted(ready)})")
            time.sleep(0.1)
        for name, pid in ready.items():
            workers.add(name, pid)
        yield proc, workers
    finally:
        if proc.poll() is None:
            for pid in descendants(proc.pid):
                workers.add_unnamed(pid)
            proc.kill()
            proc.wait(timeout=10)
        workers.kill_all()


def kill_and_wait(proc: subprocess.Popen, pid: int) -> None:
    """SIGKILL `pid`, then wait for the main process `proc` to exit (fail after 30 s)."""
    os.kill(pid, signal.SIGKILL)
    try:
        proc.wait(timeout=EXIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the run did not exit within {EXIT_TIMEOUT_S} s of the kill")


def files_of(run_dir: Path) -> dict[str, bytes]:
    """Every finished file of a run directory (policy/ included), by relative path."""
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*"))
            if p.is_file() and not p.name.endswith((".partial", ".tmp"))}


# --- a worker killed, or the main process killed ------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("victim", WORKERS)
def test_killed_worker_stops_the_run(tiny_model_dir: Path, tmp_path: Path, victim: str):
    config = write_config(tmp_path, tiny_model_dir, mode="areal", **ENDLESS)
    out, log = tmp_path / "run", tmp_path / "stderr.txt"
    with live_run(config, out, log) as (proc, workers):
        victim_pid = workers.pids[victim]
        kill_and_wait(proc, victim_pid)
        stderr = log.read_text()
        assert proc.returncode == 1, stderr
        assert f"rlcore: error: worker '{victim}' failed (pid {victim_pid}, killed by signal 9)" \
            in stderr, stderr
        assert "Traceback" not in stderr, stderr  # a clean CLI error, not a crash
        assert not (out / "summary.json").exists()
        assert workers.wait_gone(proc, GONE_TIMEOUT_S) == []
    # what the run did record before the kill is still there to read
    assert any(e["type"] == "version_change" for e in read_events(out))


# A trainer of two ranks beside two rollout workers: a rank, rank 0 or one of the workers
# killed ends the run as any worker does, no rank left waiting at a collective.
SPREAD = ("param_service", "rollout0", "rollout1", "trainer0", "trainer0_rank1")


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["trainer0_rank1", "trainer0", "rollout1"])
def test_killed_rank_or_one_of_several_workers_stops_the_run(tiny_model_dir: Path,
                                                             tmp_path: Path, victim: str):
    config = write_config(tmp_path, tiny_model_dir, mode="areal", **ENDLESS,
                          model={"rollout_device": "cpu", "trainer_device": "cpu"},
                          runtime={"rollout_workers": 2, "trainer_ranks": 2,
                                   "collective_timeout_s": 60})
    out, log = tmp_path / "run", tmp_path / "stderr.txt"
    with live_run(config, out, log, names=SPREAD) as (proc, workers):
        victim_pid = workers.pids[victim]
        t0 = time.monotonic()
        kill_and_wait(proc, victim_pid)
        # far within the collectives' timeout: the watchdog saw the death, not a wait end
        assert time.monotonic() - t0 < 15
        stderr = log.read_text()
        assert proc.returncode == 1, stderr
        assert f"rlcore: error: worker '{victim}' failed (pid {victim_pid}, killed by signal 9)" \
            in stderr, stderr
        assert "Traceback" not in stderr, stderr
        assert not (out / "summary.json").exists()
        assert workers.wait_gone(proc, GONE_TIMEOUT_S) == []
    assert any(e["type"] == "version_change" for e in read_events(out))


@pytest.mark.slow
def test_killed_main_process_takes_its_workers(tiny_model_dir: Path, tmp_path: Path):
    config = write_config(tmp_path, tiny_model_dir, mode="areal", **ENDLESS)
    out, log = tmp_path / "run", tmp_path / "stderr.txt"
    with live_run(config, out, log) as (proc, workers):
        proc.kill()
        proc.wait(timeout=10)
        assert workers.wait_gone(proc, GONE_TIMEOUT_S) == []
        assert not (out / "summary.json").exists()


# A parent that adopts orphans instead of init, as systemd --user (the manager of a desktop
# session's processes), `tini -s` or any PR_SET_CHILD_SUBREAPER process does; it reaps them.
SUBREAPER = """
import ctypes, os, subprocess, sys, time
ctypes.CDLL("libc.so.6", use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
print(subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL).pid, flush=True)
while True:
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(0.05)
"""


def fork_server(main: int) -> int | None:
    """The fork server a main process started (multiprocessing.forkserver), if any."""
    for child in descendants(main):
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"multiprocessing.forkserver" in cmdline and \
                getattr(proc_stat(child), "ppid", None) == main:
            return child
    return None


@pytest.mark.slow
@pytest.mark.parametrize("when", ["server importing", "workers forked"])
def test_main_killed_while_workers_start_under_subreaper(tiny_model_dir: Path,
                                                         tmp_path: Path, when: str):
    """The main process SIGKILLed while the fork server imports torch, or just after it
    forked the workers (before they load): the server and every worker end."""
    config = write_config(tmp_path, tiny_model_dir, mode="areal", **ENDLESS)
    out, workers = tmp_path / "run", Workers()
    with (tmp_path / "stderr.txt").open("w") as err:
        reaper = subprocess.Popen(
            [sys.executable, "-c", SUBREAPER,
             sys.executable, "-m", "rlcore", "run", str(config), "--out", str(out)],
            stdout=subprocess.PIPE, stderr=err, cwd=REPO)
    try:
        main = int(reaper.stdout.readline())
        deadline = time.monotonic() + START_TIMEOUT_S
        wanted = 0 if when == "server importing" else len(WORKERS)
        while (server := fork_server(main)) is None or \
                len(pids := [p for p in descendants(server) if p != server]) < wanted:
            assert proc_stat(main) is not None and time.monotonic() < deadline
            time.sleep(0.01)
        workers.add("fork server", server)
        for pid in pids:
            workers.add(f"worker pid {pid}", pid)
        os.kill(main, signal.SIGKILL)
        assert not [e for e in read_events(out) if e["type"] == "worker_ready"]
        # Each process ends at once; one still alive and idle is stuck for good.
        assert workers.wait_gone(None, timeout=60, idle_s=2) == []
    finally:
        for pid in descendants(reaper.pid):
            workers.add_unnamed(pid)
        reaper.kill()
        reaper.wait(timeout=10)
        reaper.stdout.close()
        workers.kill_all()


def test_shutdown_takes_no_lock_a_killed_worker_may_hold(tiny_model_dir: Path):
    """A worker SIGKILLed inside a queue put or an event check leaves that lock held for
    good; ending the processes must not need it (a put there once hung a failed run)."""
    from rlcore.runners.asynchronous.runtime import Runtime

    cfg = config_from_dict(small_config(tiny_model_dir, mode="areal"))
    runtime = Runtime(cfg, Processes(), [])
    held = [runtime.commit_q._q._wlock, *(q._q._wlock for q in runtime.trainer_qs),
            runtime.stop_evt._cond, runtime.start_evt._cond]
    for lock in held:  # held here, by no one who will ever release them
        assert lock.acquire(timeout=1)
    done = threading.Event()
    threading.Thread(target=lambda: (runtime.shutdown(), done.set()), daemon=True).start()
    try:
        assert done.wait(timeout=10), "shutdown blocked on a lock"
    finally:
        for lock in held:
            lock.release()


def test_two_readers_of_one_queue_never_wait_past_their_timeout():
    """Rollout workers share the prompt queue: when two read at once and one message is
    there, the other gets it or nothing within its timeout (a reader once saw the message,
    lost it to the other and then waited for the next one for good)."""
    import queue

    q = Processes().queue()

    def read(start: threading.Barrier, got: list[Any]) -> None:
        start.wait()
        try:
            got.append(q.get(timeout=0.01))
        except queue.Empty:
            got.append(None)

    for _ in range(200):
        q.put(["prompt"])
        got: list[Any] = []
        start = threading.Barrier(2)
        readers = [threading.Thread(target=read, args=(start, got), daemon=True)
                   for _ in range(2)]
        for r in readers:
            r.start()
        for r in readers:
            r.join(timeout=5)
        if any(r.is_alive() for r in readers):
            q.put(["release"])  # free the stuck reader before failing
            pytest.fail("a reader of the queue waited past its timeout")
        assert sorted(got, key=str) == [None, ["prompt"]]


class FakeRuntime:
    """What the watchdog reads of a runtime whose controller is blocked (health.Watched)."""

    def __init__(self, dead: dict[str, str], stopped: set[str]):
        self._dead, self.stopped = dead, dict.fromkeys(stopped)
        self.ended = threading.Event()

    def dead(self) -> dict[str, str]:
        return self._dead

    def end_all(self) -> None:
        self.ended.set()


def test_watchdog_ends_a_run_whose_controller_is_blocked(capfd: pytest.CaptureFixture):
    from rlcore.runners.asynchronous.health import Watchdog

    runtime = FakeRuntime({"trainer0": "pid 7, killed by signal 9"}, stopped=set())
    exits: list[int] = []
    fired = threading.Event()
    dog = Watchdog(runtime, grace_s=0.2, exit=lambda code: (exits.append(code), fired.set()))
    dog.start()
    assert fired.wait(timeout=5), "the watchdog did not end the run"
    assert exits == [1] and runtime.ended.is_set()  # workers killed before the exit
    assert "rlcore: error: worker 'trainer0' failed (pid 7, killed by signal 9)" \
        in capfd.readouterr().err


@pytest.mark.parametrize("case", ["worker stopped first", "run already ended"])
def test_watchdog_leaves_a_run_that_ended_alone(case: str):
    from rlcore.runners.asynchronous.health import Watchdog

    runtime = FakeRuntime({"rollout0": "pid 8, exit code 0"},
                          stopped={"rollout0"} if case == "worker stopped first" else set())
    exits: list[int] = []
    dog = Watchdog(runtime, grace_s=0.2, exit=exits.append)
    if case == "run already ended":
        dog.done.set()
    dog.start()
    time.sleep(1.0)  # five grace periods
    dog.done.set()
    assert exits == [] and not runtime.ended.is_set()


# --- a worker that raises (threaded runtime, in process) ------------------------------------
@pytest.fixture
def trainer_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """HFPolicy.update raises, but only in a trainer thread."""
    from rlcore.policy.hf_policy import HFPolicy

    update = HFPolicy.update

    def boom(self: HFPolicy, *args: Any, **kwargs: Any) -> dict[str, float]:
        if threading.current_thread().name.startswith("trainer"):
            raise RuntimeError("boom in update")
        return update(self, *args, **kwargs)

    monkeypatch.setattr(HFPolicy, "update", boom)


def async_config(model_dir: Path) -> dict[str, Any]:
    return small_config(model_dir, mode="async", train={"updates": 50, "update_batch_size": 8})


def role_threads() -> list[str]:
    """Role threads of this process still running a moment after a run (they are daemons)."""
    deadline = time.monotonic() + GONE_TIMEOUT_S
    while True:
        left = [t.name for t in threading.enumerate() if t.name in WORKERS]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def test_raising_worker_fails_the_threaded_run(tiny_model_dir: Path, tmp_path: Path,
                                               trainer_raises: None):
    out = tmp_path / "run"
    t0 = time.monotonic()
    with pytest.raises(WorkerFailed) as info:
        run_async(config_from_dict(async_config(tiny_model_dir)), out, force=False,
                  vehicle=Threads())
    assert time.monotonic() - t0 < 30
    assert "worker 'trainer0' failed (it raised)" in str(info.value)
    cause = info.value.__cause__
    assert cause is not None
    assert "Traceback" in str(cause) and "RuntimeError: boom in update" in str(cause)
    assert not (out / "summary.json").exists()
    assert (out / "updates.jsonl.partial").read_text() == ""  # the first update raised
    assert role_threads() == []


def test_raising_worker_cli_exit_code(tiny_model_dir: Path, tmp_path: Path,
                                      trainer_raises: None, capsys: pytest.CaptureFixture):
    from rlcore.cli import main

    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(async_config(tiny_model_dir)))
    out = tmp_path / "run"
    assert main(["run", str(config), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("rlcore: error: worker 'trainer0' failed (it raised)"), err
    assert "Traceback (most recent call last)" in err
    assert "RuntimeError: boom in update" in err
    assert not (out / "summary.json").exists()
    assert role_threads() == []


# --- a failed forced rerun over a complete run ----------------------------------------------
@pytest.mark.slow
def test_failed_forced_rerun_keeps_complete_run(tiny_model_dir: Path, tmp_path: Path):
    out, log = tmp_path / "run", tmp_path / "stderr.txt"
    cfg = small_config(tiny_model_dir, mode="areal", train={"updates": 3, "update_batch_size": 8},
                       staleness={"staleness_k": 2})
    summary = run_async(config_from_dict(cfg), out, force=False, vehicle=Processes())
    assert summary["updates"] == 3
    before = files_of(out)
    assert {"summary.json", "samples.jsonl", "updates.jsonl", "events.jsonl", "staleness.json",
            "config.json", "policy/model.safetensors"} <= set(before)
    assert not list(out.glob("*.partial"))

    config = write_config(tmp_path, tiny_model_dir, mode="areal", **ENDLESS)
    with live_run(config, out, log, "--force") as (proc, workers):
        kill_and_wait(proc, workers.pids["trainer0"])
        assert proc.returncode == 1, log.read_text()
        assert "worker 'trainer0' failed" in log.read_text()
        assert workers.wait_gone(proc, GONE_TIMEOUT_S) == []
    assert files_of(out) == before
    # the rerun did get under way (it wrote its own partial streams beside the old run)
    assert any(e["type"] == "version_change" for e in read_events(out))
