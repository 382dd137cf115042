"""The warm launcher's client: `python -m rlcore.launcher ARGV` does what `rlcore ARGV` does,
in a job forked from a server that has imported torch and transformers already.

It imports no torch: it hashes the code (`protocol.server_key`), connects to the server's
socket and hands it the command, its directory, environment and start time and its standard
streams (SCM_RIGHTS), then waits and exits with the job's status, or dies by the job's
signal. SIGTERM, SIGINT, SIGHUP and SIGQUIT are passed on to the job; if the client itself
is killed, its connection closes and the server kills the job's process group. With
`--exit-with-parent` in ARGV the client dies with its parent, as `rlcore` would, and so the
job with it.

No server, or one with another key (the code or the interpreter changed): the client takes
the start lock, asks the old server to stop (it finishes its running jobs), starts a new one
detached (its own session, stdio to the launcher directory's server.log) and waits for it.
Anything that goes wrong on the way runs the command cold instead (`python -m rlcore
ARGV`, exec'd in this process), after one line on stderr saying why: a launcher problem
never fails a job. `RLCORE_LAUNCHER=cold` runs it cold without a word, and so does a client
inside a Slurm job (SLURM_JOB_ID set), where each job is its own allocation and a server
would run jobs in another job's.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from rlcore.launcher.protocol import (
    IDLE_S,
    IDLE_VAR,
    LOCK,
    LOG,
    MODE_VAR,
    SOCKET,
    START_S,
    START_VAR,
    Channel,
    LauncherUnavailable,
    launcher_dir,
    prepare_dir,
    server_key,
    source_root,
)
from rlcore.record.machine_load import process_age_s

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
ACK_S = 10.0  # a server answers a request at once; a longer silence is a broken server
LOG_MAX_BYTES = 1 << 20  # then server.log is moved to server.log.1 when a server starts
SERVER_MAIN = ("import sys; sys.path.insert(0, sys.argv.pop(1)); "
               "from rlcore.launcher.server import main; main()")


def say(text: str) -> None:
    print(f"rlcore launcher: {text}", file=sys.stderr, flush=True)


def launch(argv: list[str]) -> int:
    """Run `rlcore ARGV` warm, or cold where warm cannot be had; the command's status."""
    started = time.time() - (process_age_s() or 0.0)
    if os.environ.get(MODE_VAR, "warm") == "cold" or os.environ.get("SLURM_JOB_ID"):
        cold(argv)
    if "--exit-with-parent" in argv:
        die_with_parent()
    try:
        chan, pid = request_job(argv, started)
    except (LauncherUnavailable, OSError, ValueError) as e:
        say(f"{e}; running the command cold")
        cold(argv)
    return relay(chan, pid, argv)


def die_with_parent() -> None:
    """SIGKILL this process when its parent dies (as `rlcore --exit-with-parent` does, without
    importing the runners' package)."""
    parent = os.getppid()
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # it died before the call
            os._exit(1)


def cold(argv: list[str]) -> NoReturn:
    """Replace this process with `python -m rlcore ARGV`."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "rlcore", *argv])


def request_job(argv: list[str], started: float) -> tuple[Channel, int]:
    """Have a server with this client's key start the job: (its connection, its pid)."""
    env = dict(os.environ)
    key = server_key(env)
    directory = prepare_dir(launcher_dir(env))
    request = {"op": "run", "key": key, "argv": argv, "cwd": os.getcwd(), "env": env,
               "started": started, "umask": _umask(), "cpus": sorted(os.sched_getaffinity(0)),
               "ignored": [int(s) for s in FORWARDED if signal.getsignal(s) == signal.SIG_IGN]}
    for attempt in (1, 2):
        chan = _connect(directory)
        if chan is not None:
            try:
                with _stdio() as fds:
                    chan.send(request, fds)
                reply, _ = chan.receive(timeout=ACK_S)
            except OSError:  # a server that was exiting as it was reached (its idle end)
                reply = None
            if reply is not None and isinstance(reply.get("pid"), int):
                return chan, reply["pid"]
            chan.sock.close()
            if reply is not None and reply.get("error") != "key":
                raise LauncherUnavailable(f"the server refused the job: {reply.get('error')}")
        if attempt == 2:
            raise LauncherUnavailable("the server it started does not take the job")
        t0 = time.time()
        ensure_server(directory, key, env)
        # The server's start is the grid's cost, once, not this job's: the first job of a
        # grid would otherwise report seconds of start-up that no other job has.
        request["started"] = started + (time.time() - t0)
    raise AssertionError("unreachable")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def _stdio() -> Iterator[list[int]]:
    """This process's stdin, stdout and stderr (/dev/null for one that is closed)."""
    opened = []
    fds = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            fds.append(fd)
        except OSError:
            opened.append(os.open(os.devnull, os.O_RDWR))
            fds.append(opened[-1])
    try:
        yield fds
    finally:
        for fd in opened:
            os.close(fd)


def _connect(directory: Path) -> Channel | None:
    """A connection to the server listening in `directory`; None if none listens."""
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.connect(str(directory / SOCKET))
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    return Channel(sock)


def _ask(directory: Path, op: str) -> dict[str, Any] | None:
    """The server's reply to a one-message request `op`, or None if no server answers."""
    chan = _connect(directory)
    if chan is None:
        return None
    with chan.sock:
        try:
            chan.send({"op": op})
            reply, _ = chan.receive(timeout=ACK_S)
        except (OSError, TimeoutError):
            return None
    return reply


def ping(directory: Path) -> dict[str, Any] | None:
    """The server's key and pid, or None if no server answers."""
    return _ask(directory, "ping")


def stop(directory: Path) -> int | None:
    """Ask the server in `directory` to stop (it finishes its running jobs); its pid, or
    None if none answered."""
    reply = _ask(directory, "stop")
    return reply.get("stopped") if reply else None


@contextlib.contextmanager
def _locked(directory: Path, timeout: float) -> Iterator[None]:
    """The start lock: one client at a time replaces or starts the server."""
    with open(directory / LOCK, "a") as f:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise LauncherUnavailable("another client has held the start lock for "
                                              f"{timeout:g} s") from None
                time.sleep(0.02)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_server(directory: Path, key: str, env: dict[str, str]) -> None:
    """Under the start lock: leave a server with `key` be; stop one with another key; start
    one and wait until it answers."""
    start_s = float(env.get(START_VAR, START_S))
    with _locked(directory, timeout=start_s + 5):
        info = ping(directory)
        if info is not None and info.get("key") == key:
            return  # another client started it meanwhile
        if info is not None:
            stop(directory)
        log = directory / LOG
        if log.exists() and log.stat().st_size > LOG_MAX_BYTES:
            log.replace(log.with_name(LOG + ".1"))
        # In the launcher directory, not this one (nothing of a job's directory stays in
        # use), importing rlcore from where this client did.
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-c", SERVER_MAIN, str(source_root()), "--dir", str(directory),
                 "--key", key, "--idle", env.get(IDLE_VAR, str(IDLE_S))],
                stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
                cwd=directory, env=env)
        deadline = time.monotonic() + start_s
        while (info := ping(directory)) is None or info.get("key") != key:
            if proc.poll() is not None:
                raise LauncherUnavailable(f"the server exited at its start (status "
                                          f"{proc.returncode}; see {log})")
            if time.monotonic() > deadline:
                raise LauncherUnavailable(f"the server did not start within {start_s:g} s "
                                          f"(see {log})")
            time.sleep(0.02)


def relay(chan: Channel, pid: int, argv: list[str]) -> int:
    """Wait for the job's end, passing the signals this process gets on to it; return its
    exit status, or die by its signal."""
    def forward(sig: int, _frame: FrameType | None) -> None:
        with contextlib.suppress(OSError):
            chan.send({"signal": sig})

    for sig in FORWARDED:
        if signal.getsignal(sig) != signal.SIG_IGN:
            signal.signal(sig, forward)
    while True:
        try:
            msg, _ = chan.receive(timeout=None)
        except OSError:
            msg = None
        if msg is None:
            # The server died and took the job with it (the job dies with the server).
            say(f"the server ended during the job (pid {pid}); running the command cold")
            cold(argv)
        if isinstance(msg.get("exit"), int):
            return int(msg["exit"])
        if isinstance(msg.get("signal"), int):
            die_by(msg["signal"])


def die_by(sig: int) -> NoReturn:
    """End as the job ended: killed by `sig`."""
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)
