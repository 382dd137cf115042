"""The warm launcher's server: a process that has imported torch, transformers and the
commands' modules once, and forks a job per client request (`job.py`).

It runs no torch code and starts no thread, so every job still builds its own thread pools
and CUDA context after the fork, as a fresh process would: it checks, after its imports, that
it has no second Python thread and has not loaded the CUDA driver, and refuses to serve
otherwise. One thread serves every connection (a selector over the listening socket, each
job's connection and a pidfd per job), so two clients at once get two jobs. A job's status
goes back over its connection; a connection that closes first (the client was killed) takes
the job's process group with it. The server exits after `idle_s` with no job, when asked to
stop (`{"op": "stop"}`: a client whose key differs, `python -m rlcore.launcher --stop`), and
then only once its running jobs have ended.

Started by a client (`client.ensure_server`) as `python -c SERVER_MAIN ROOT --dir D --key K
--idle S` in D, detached: its own session, stdio to D/server.log, rlcore imported from the
client's source tree ROOT.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import selectors
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlcore.kernels import take_intel_mkl_paths
from rlcore.launcher.protocol import SOCKET, Channel, server_key

# What the commands import, at the server's start instead of each job's: the CLI, every
# runner, the replay, the evaluation, and what transformers loads lazily for the Qwen2
# models and sampling. Never `forkserver_init`, whose import ties a process to its parent.
PRELOAD = (
    "rlcore.cli",
    "rlcore.runners",
    "rlcore.runners.sync",
    "rlcore.runners.threaded",
    "rlcore.runners.areal",
    "rlcore.runners.asynchronous.vehicles",
    "rlcore.runners.asynchronous.rollout",
    "rlcore.runners.asynchronous.trainer",
    "rlcore.runners.asynchronous.param_service",
    "rlcore.replay.replayer",
    "rlcore.replay.trainer_process",
    "rlcore.evaluation",
    "rlcore.launcher.job",
    "transformers.models.qwen2.modeling_qwen2",
    "transformers.generation.utils",
    "psutil",
)
NEVER = "rlcore.runners.asynchronous.forkserver_init"


def log(text: str) -> None:
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} [{os.getpid()}] {text}", flush=True)


def preload() -> None:
    for name in PRELOAD:
        importlib.import_module(name)


def fork_safety_problem() -> str | None:
    """Why forking this process would give jobs something a fresh process would not have
    (None when it is safe): a second Python thread, the CUDA driver, the workers' tie."""
    if threading.active_count() > 1:
        return f"{threading.active_count()} Python threads after the imports"
    if NEVER in sys.modules:
        return f"{NEVER} was imported"
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    if "libcuda.so" in maps:
        return "the CUDA driver was loaded by the imports"
    return None


@dataclass
class Job:
    pid: int
    chan: Channel
    pidfd: int
    argv: list[str]
    t0: float
    client_gone: bool = False


class Server:
    def __init__(self, directory: Path, key: str, idle_s: float,
                 imported_env: dict[str, str]):
        self.dir, self.key, self.idle_s = directory, key, idle_s
        self.imported_env = imported_env
        self.path = directory / SOCKET
        self.sel = selectors.DefaultSelector()
        self.jobs: dict[int, Job] = {}  # by pid
        self.listener: socket.socket | None = self._listen()
        self.sel.register(self.listener, selectors.EVENT_READ, "accept")
        self.last_job_end = time.monotonic()

    def _listen(self) -> socket.socket:
        if self.path.exists():  # a dead server's socket (clients start servers under a lock)
            with socket.socket(socket.AF_UNIX) as probe:
                try:
                    probe.connect(str(self.path))
                except OSError:
                    self.path.unlink()
                else:
                    raise RuntimeError(f"another server listens on {self.path}")
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(self.path))
        sock.listen(64)
        self._inode = self.path.stat().st_ino
        return sock

    def serve(self) -> None:
        log(f"serving {self.path} (key {self.key}, idle exit after {self.idle_s:g} s)")
        while True:
            if not self.jobs:
                idle = time.monotonic() - self.last_job_end
                if self.listener is None:
                    log("stopped, and no job is running: exiting")
                    return
                if idle >= self.idle_s:
                    log(f"no job for {idle:.0f} s: exiting")
                    self.stop_listening()
                    return
                timeout: float | None = self.idle_s - idle
            else:
                timeout = None
            for sel_key, _ in self.sel.select(timeout):
                what = sel_key.data
                try:
                    if what == "accept":
                        self._accept()
                    elif what[0] == "conn":
                        self._from_client(self.jobs[what[1]])
                    else:
                        self._reap(self.jobs[what[1]])
                except Exception as e:  # noqa: BLE001 - one bad client must not end the server
                    log(f"error: {e!r}")

    def stop_listening(self) -> None:
        """Take no more requests: close the socket and remove its path, if still ours."""
        if self.listener is None:
            return
        self.sel.unregister(self.listener)
        self.listener.close()
        self.listener = None
        try:
            if self.path.stat().st_ino == self._inode:
                self.path.unlink()
        except OSError:
            pass

    def _accept(self) -> None:
        assert self.listener is not None
        conn, _ = self.listener.accept()
        chan = Channel(conn)
        fds: list[int] = []
        try:
            msg, fds = chan.receive(timeout=5.0, max_fds=3)
            op = msg.get("op") if msg else None
            if op == "ping":
                chan.send({"key": self.key, "pid": os.getpid(), "jobs": len(self.jobs)})
            elif op == "stop":
                log("asked to stop" + (f"; {len(self.jobs)} job(s) still running"
                                       if self.jobs else ""))
                self.stop_listening()
                chan.send({"stopped": os.getpid()})
            elif op == "run" and msg is not None:
                if msg.get("key") != self.key:
                    chan.send({"error": "key", "key": self.key})
                elif len(fds) != 3:
                    chan.send({"error": f"expected 3 file descriptors, got {len(fds)}"})
                else:
                    self._start(msg, fds, chan)
                    fds = []  # closed by _start
                    return  # the connection stays open for the job's life
            else:
                chan.send({"error": f"unknown request {op!r}"})
        finally:
            for fd in fds:
                os.close(fd)
        conn.close()

    def _start(self, request: dict[str, Any], fds: list[int], chan: Channel) -> None:
        for stream in (sys.stdout, sys.stderr):  # nothing of the log's buffer into the job
            stream.flush()
        pid = os.fork()
        if pid == 0:
            from rlcore.launcher.job import become

            env = {**self.imported_env, **request["env"]}
            become({**request, "env": env}, fds, os.getppid(),
                   lambda: self._close_in_child(chan))
        # also here: the group must exist before any killpg (the child may have done it
        # first, or exited already)
        with contextlib.suppress(OSError):
            os.setpgid(pid, pid)
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        job = Job(pid, chan, pidfd, request["argv"], time.monotonic())
        self.jobs[pid] = job
        chan.sock.setblocking(True)
        chan.send({"pid": pid})
        self.sel.register(chan.sock, selectors.EVENT_READ, ("conn", pid))
        self.sel.register(pidfd, selectors.EVENT_READ, ("exit", pid))
        log(f"job {pid}: rlcore {' '.join(request['argv'])} (in {request['cwd']})")

    def _close_in_child(self, chan: Channel) -> None:
        """Close, in a new job, what belongs to the server: the sockets, the selector and
        the other jobs' pidfds; the job's own connection too, so that the client sees the
        end of the server as the end of its connection."""
        if self.listener is not None:
            self.listener.close()
        for job in self.jobs.values():
            job.chan.sock.close()
            os.close(job.pidfd)
        self.sel.close()
        chan.sock.close()

    def _from_client(self, job: Job) -> None:
        try:
            msgs = job.chan.pending()
        except OSError:
            msgs, job.chan.eof = [], True
        for msg in msgs:
            if isinstance(msg.get("signal"), int):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(job.pid, msg["signal"])
        if job.chan.eof:  # the client is gone: so is its job, with everything it started
            self.sel.unregister(job.chan.sock)
            job.client_gone = True
            log(f"job {job.pid}: its client went away; killing its process group")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(job.pid, signal.SIGKILL)

    def _reap(self, job: Job) -> None:
        _, status = os.waitpid(job.pid, 0)
        self.sel.unregister(job.pidfd)
        os.close(job.pidfd)
        del self.jobs[job.pid]
        self.last_job_end = time.monotonic()
        if os.WIFSIGNALED(status):
            result = {"signal": os.WTERMSIG(status)}
        else:
            result = {"exit": os.WEXITSTATUS(status)}
        log(f"job {job.pid}: {result} after {time.monotonic() - job.t0:.1f} s")
        if not job.client_gone:
            with contextlib.suppress(OSError):
                job.chan.send(result)
            self.sel.unregister(job.chan.sock)
        job.chan.sock.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="rlcore-launcher-server")
    p.add_argument("--dir", required=True, type=Path)
    p.add_argument("--key", required=True)
    p.add_argument("--idle", type=float, required=True)
    args = p.parse_args(argv)
    t0 = time.monotonic()
    # The key again, before and after the imports: code edited while the server starts
    # would give jobs a mix of two versions.
    env = dict(os.environ)  # as the client gave it: the imports may set variables
    if (key := server_key(env)) != args.key:
        log(f"refusing to serve: this server's key is {key}, the client's {args.key}")
        sys.exit(3)
    take_intel_mkl_paths()  # before torch: the jobs inherit MKL's vendor answer (kernels.py)
    preload()
    # what the imports set (torch: TORCHINDUCTOR_CACHE_DIR), which a cold job's imports set
    imported_env = {k: v for k, v in os.environ.items() if env.get(k) != v}
    if (key := server_key(env)) != args.key:
        log(f"refusing to serve: the code changed while the server imported it ({key})")
        sys.exit(3)
    if problem := fork_safety_problem():
        log(f"refusing to serve: {problem}")
        sys.exit(3)
    server = Server(args.dir, args.key, args.idle, imported_env)
    log(f"imports done in {time.monotonic() - t0:.1f} s")
    server.serve()
    # skip the interpreter's teardown of torch and transformers (about a second of CPU)
    sys.stdout.flush()
    os._exit(0)
