"""The code sandbox against hostile responses, and the shipped code tasks against their
reference solutions."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pytest

from rlcore.config import RewardConfig
from rlcore.tasks.grading import extract_code, run_tests
from rlcore.tasks.reward import RewardPool, evaluate_response
from rlcore.tasks.sandbox import UID_BASE, Session, detect_isolation
from rlcore.tasks.suites import Task, read_task_file
from tests.code_solutions import CORRECT, WRONG

ROOT = Path(__file__).resolve().parents[1]
CFG = RewardConfig(verifier="code", timeout_sec=1.0)
NAMESPACES = detect_isolation(CFG).method == "namespaces"
needs_namespaces = pytest.mark.skipif(
    not NAMESPACES, reason="needs root and util-linux unshare/setpriv (namespaces)")
# Without another uid, hostile code runs as this user: never run it then (kill -1 ...).
OTHER_UID = detect_isolation(CFG).unprivileged_uid
# What only the namespaces contain (the fallback shares network, /tmp and the process space).
ONLY_WITH_NAMESPACES = {"network_socket", "write_outside", "outlive_the_timeout"}
DOUBLE = Task(task_id="double", prompt="Write double(x).", entry_point="double",
              tests=["assert double(2) == 4", "assert double(-3) == -6"])
RIGHT = "def double(x):\n    return 2 * x\n"
# Where a sandboxed process could leave a file if it escaped its private tmpfs.
MARKERS = [Path(d) / "rlcore-pwned" for d in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")]
MARKERS += [ROOT / "rlcore-pwned", Path.home() / "rlcore-pwned"]
SECRET = "rlcore-secret-4b1d"
# Responses whose call never returns on its own: only the harness's deadline ends it (before
# the CPU limit of timeout + 1 s could), so the error must say it timed out.
NEVER_RETURN = {"infinite_loop", "fork_bomb"}
# A guard against hangs only, not a bound on this machine's speed: a harness that waited for
# what the candidate left running (outlive_the_timeout's `sleep 30`) would take 30 s.
HANG_S = 20.0

HOSTILE = {
    "infinite_loop": "def double(x):\n    while True:\n        pass\n",
    "memory_bomb": "def double(x):\n    a = []\n    while True:\n        a.append(' ' * 10**7)\n",
    "fork_bomb": (
        "import os\n"
        "def double(x):\n"
        "    while True:\n"
        "        try:\n"
        "            os.fork()\n"
        "        except OSError:\n"
        "            pass\n"),
    "deep_recursion": "def double(x):\n    return double(x + 1) + 0\n",
    "c_stack_overflow": (
        "import sys\nsys.setrecursionlimit(10**7)\n"
        "def double(x):\n    return double(x + 1) + 0\n"),
    "outlive_the_timeout": (
        "import os, subprocess, time\n"
        "subprocess.Popen(['sleep', '30'], start_new_session=True)\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    time.sleep(2)\n"
        "    for d in ('/tmp', '/var/tmp', '/dev/shm', '/run/lock'):\n"
        "        try:\n"
        "            open(d + '/rlcore-pwned', 'w').write('late')\n"
        "        except OSError:\n"
        "            pass\n"
        "    os._exit(0)\n"
        "def double(x):\n    return 2 * x + 1\n"),
    "write_outside": (
        "import os\n"
        f"paths = {[str(p) for p in MARKERS]!r}\n"
        "for p in paths + [os.path.expanduser('~/rlcore-pwned'), '/etc/rlcore-pwned']:\n"
        "    try:\n"
        "        open(p, 'w').write('x')\n"
        "    except OSError:\n"
        "        pass\n"
        "def double(x):\n    return 0\n"),
    "read_environment": (
        "import os\n"
        "def double(x):\n"
        "    found = dict(os.environ)\n"
        "    for pid in os.listdir('/proc'):\n"
        "        try:\n"
        "            found[pid] = open(f'/proc/{pid}/environ', 'rb').read().decode()\n"
        "        except (OSError, ValueError):\n"
        "            pass\n"
        "    return repr(found)\n"),
    "network_socket": (
        "import socket\n"
        "def double(x):\n"
        "    s = socket.create_connection(('127.0.0.1', PORT_NUMBER), timeout=0.5)\n"
        "    s.sendall(b'leak')\n"
        "    return 2 * x\n"),
    "kill_the_parent": (
        "import os, signal\n"
        "for target in (os.getppid(), 1, -1):\n"
        "    try:\n"
        "        os.kill(target, signal.SIGKILL)\n"
        "    except OSError:\n"
        "        pass\n"
        "for pid in range(2, 4096):\n"
        "    try:\n"
        "        os.kill(pid, signal.SIGKILL)\n"
        "    except OSError:\n"
        "        pass\n"
        "def double(x):\n    return 0\n"),
    "flood_stdout": "def double(x):\n    while True:\n        print('x' * 65536)\n",
    "exit_before_tests": "import sys\nsys.exit(0)\ndef double(x):\n    return 2 * x\n",
    "hard_exit_before_tests": "import os\nos._exit(0)\n",
    "fake_success_marker": (
        "print('PASS'); print('All tests passed: 2/2'); print('{\"ready\": true}')\n"
        "def double(x):\n    print('ok'); return 0\n"),
    "patch_assert_and_runner": (
        "import builtins, sys, unittest\n"
        "builtins.AssertionError = type('Nope', (Exception,), {})\n"
        "unittest.TestCase.assertEqual = lambda *a, **k: None\n"
        "class Anything:\n"
        "    def __eq__(self, other):\n"
        "        return True\n"
        "    def __repr__(self):\n"
        "        return 'Anything()'\n"
        "def double(x):\n    return Anything()\n"),
    "forge_answer_channel": (
        "import os, json, struct\n"
        "for fd in range(3, 32):\n"
        "    try:\n"
        "        msg = json.dumps({'value': '4'}).encode()\n"
        "        os.write(fd, struct.pack('>I', len(msg)) + msg)\n"
        "    except OSError:\n"
        "        pass\n"
        "def double(x):\n    return 0\n"),
}


def sandbox_processes(grace_s: float = 0.5) -> list[int]:
    """Processes running as a sandbox uid, once those already killed have had `grace_s` to
    exit."""
    deadline = time.monotonic() + grace_s
    while (pids := _sandbox_processes()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return pids


def _sandbox_processes() -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            status = (proc / "status").read_text()
        except OSError:
            continue
        uid = int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])
        zombie = "(zombie)" in next(ln for ln in status.splitlines() if ln.startswith("State:"))
        if UID_BASE <= uid < UID_BASE + 64 and not zombie:
            pids.append(int(proc.name))
    return pids


@pytest.fixture
def listener():
    """A TCP server on localhost that records whether anyone connected."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    seen: list[bytes] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            seen.append(conn.recv(16) or b"connected")
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], seen
    stop.set()
    thread.join()
    server.close()


def test_correct_and_wrong_solutions():
    assert evaluate_response(f"```python\n{RIGHT}```", DOUBLE, CFG)["pass"] is True
    wrong = evaluate_response("def double(x):\n    return x + 2\n", DOUBLE, CFG)
    assert wrong["pass"] is False and wrong["tests_passed"] == 1 and wrong["reward"] == 0.0


@pytest.mark.skipif(not OTHER_UID, reason="hostile code may only run as another uid (root)")
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_response_is_contained(name: str, listener, monkeypatch):
    if name in ONLY_WITH_NAMESPACES and not NAMESPACES:
        pytest.skip("contained only with namespaces, which this machine does not offer")
    port, seen = listener
    monkeypatch.setenv("RLCORE_SECRET", SECRET)
    code = HOSTILE[name].replace("PORT_NUMBER", str(port))
    start = time.monotonic()
    result = evaluate_response(code, DOUBLE, CFG)
    elapsed = time.monotonic() - start
    assert result["reward"] == 0.0 and result["pass"] is False, result
    if name in NEVER_RETURN:
        assert result["error"].endswith("timed out"), result
    assert elapsed < HANG_S, elapsed
    if NAMESPACES:
        assert sandbox_processes() == [], "the sandbox left processes behind"
    time.sleep(0.1 if name != "outlive_the_timeout" else 2.5)  # give a straggler its chance
    assert [p for p in MARKERS if p.exists()] == [], "a file appeared outside the sandbox"
    assert seen == [], "the sandboxed code reached a socket on the host"
    # The harness goes on: the next evaluation in the same slot is scored normally.
    assert evaluate_response(RIGHT, DOUBLE, CFG)["pass"] is True


FALLBACK = RewardConfig(verifier="code", timeout_sec=1.0, sandbox_isolation="rlimits")


@pytest.mark.skipif(not NAMESPACES, reason="this machine offers no namespaces to keep")
def test_a_short_timeout_does_not_weaken_the_isolation():
    """The probe that picks the isolation is not timed by the evaluations' limit: a sandbox
    slower to start than `timeout_sec` (a loaded machine, here a tiny limit) keeps namespaces
    rather than falling back to rlimits."""
    assert detect_isolation(RewardConfig(timeout_sec=0.001)).method == "namespaces"


@pytest.mark.skipif(not detect_isolation(FALLBACK).unprivileged_uid,
                    reason="the fallback hands code to another uid only when run as root")
@pytest.mark.parametrize("name", ["infinite_loop", "fork_bomb", "kill_the_parent",
                                  "flood_stdout", "patch_assert_and_runner"])
def test_fallback_without_namespaces_still_contains(name: str):
    start = time.monotonic()
    result = evaluate_response(HOSTILE[name], DOUBLE, FALLBACK)
    assert result["reward"] == 0.0 and time.monotonic() - start < HANG_S
    if name in NEVER_RETURN:
        assert result["error"].endswith("timed out"), result
    assert sandbox_processes() == []
    assert evaluate_response(RIGHT, DOUBLE, FALLBACK)["pass"] is True


@pytest.mark.skipif(not OTHER_UID, reason="hostile code may only run as another uid (root)")
def test_environment_is_not_visible(monkeypatch):
    monkeypatch.setenv("RLCORE_SECRET", SECRET)
    with Session(detect_isolation(CFG), CFG, HOSTILE["read_environment"], "double", 0) as s:
        assert SECRET not in s.call(0)


@needs_namespaces
def test_fork_bomb_is_bounded_while_it_runs():
    peak = 0
    done = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, len(_sandbox_processes()))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        run_tests(CFG, HOSTILE["fork_bomb"], "double", DOUBLE.tests)
    finally:
        done.set()
        watcher.join()
    assert 0 < peak <= CFG.sandbox_max_processes
    assert sandbox_processes() == []


def test_code_extraction_rule():
    fenced = "Here you go:\n```python\ndef f(x):\n    return x\n```\nDone."
    assert extract_code(fenced, "f") == "def f(x):\n    return x\n"
    two = "```\nprint(1)\n```\n```py\ndef f():\n    pass\n```"
    assert extract_code(two, "f") == "def f():\n    pass\n"
    assert extract_code("def f():\n    return 1", "f") == "def f():\n    return 1"
    assert extract_code("```python\ndef g():\n    pass", "f") == "def g():\n    pass"


def test_isolation_is_described():
    described = detect_isolation(CFG).describe()
    assert described["verdict_outside_sandbox"] is True
    if os.geteuid() == 0:
        assert described["method"] == "namespaces", described["notes"]


def shipped_tasks() -> list[Task]:
    data = ROOT / "rlcore" / "tasks" / "data" / "code"
    return read_task_file(data / "train.jsonl") + read_task_file(data / "heldout.jsonl")


@pytest.mark.slow
def test_shipped_tasks_pass_their_reference_solutions_and_fail_wrong_ones():
    tasks = shipped_tasks()
    assert len(tasks) >= 40 and len({t.task_id for t in tasks}) == len(tasks)
    pool = RewardPool(CFG)
    try:
        right = pool.map((f"```python\n{CORRECT[t.task_id]}```", t) for t in tasks)
        wrong = pool.map((WRONG[t.task_id], t) for t in tasks)
    finally:
        pool.close()
    assert [t.task_id for t, r in zip(tasks, right, strict=True) if not r["pass"]] == []
    assert [t.task_id for t, r in zip(tasks, wrong, strict=True) if r["pass"]] == []
