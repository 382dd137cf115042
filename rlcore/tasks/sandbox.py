"""Run model-written code where it can neither break the harness nor forge its verdict.

Each evaluation starts a fresh interpreter (`python -I -S`) through util-linux:

    prlimit --cpu --as --fsize --nproc --nofile --core
    unshare --mount --net --pid --ipc --uts --fork --kill-child --mount-proc
      mount --all --fstab <private tmpfs table>     (fresh /tmp, /var/tmp, /dev/shm, ...)
      setpriv --reuid U --regid U --clear-groups --no-new-privs --inh-caps=-all
        python -I -S -c <CHILD>

so the code runs as an unprivileged uid of its own (one per pool slot: Linux does not apply
RLIMIT_NPROC to root, and a shared uid would let one fork bomb starve its neighbours), in a
PID namespace (when its first process exits the kernel kills every process it left), with no
network but a downed loopback, an empty private tmpfs as working directory, an empty
environment, and resource limits (CPU seconds, address space, file size, processes, open
files). The parent kills the whole process group at the wall-clock deadline.

Where namespaces are not available (not root, or no util-linux), the fallback is a plain
subprocess with the same resource limits and environment; `detect_isolation` says which
protections hold, and the run records it in config.json.

The sandbox never judges its own code: a task's tests run in this process against a proxy
of the entry point (`grading.py`), which `Session.call` provides.
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import functools
import json
import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from rlcore.config import ConfigError, RewardConfig

# The trusted half inside the sandbox: load the candidate, then answer calls. Requests arrive
# on stdin, answers leave on the descriptor named by argv[1]; stdout and stderr belong to the
# candidate.
CHILD = r"""
import ast, json, os, struct, sys
ANSWERS = int(sys.argv[1])
def read(f):
    head = f.read(4)
    if len(head) < 4:
        return None
    return f.read(struct.unpack(">I", head)[0])
def write(data):
    data = struct.pack(">I", len(data)) + data.encode()
    while data:
        data = data[os.write(ANSWERS, data):]
inbox = sys.stdin.buffer
hello = json.loads(read(inbox))
space = {"__name__": "__solution__", "__builtins__": __builtins__}
try:
    exec(compile(hello["code"], "<solution>", "exec"), space)
    fn = space[hello["entry_point"]]
    write(json.dumps({"ready": True}))
except BaseException as e:
    write(json.dumps({"ready": False, "error": f"{type(e).__name__}: {e}"[:300]}))
    raise SystemExit(0)
while (msg := read(inbox)) is not None:
    try:
        args, kwargs = ast.literal_eval(msg.decode())
        answer = {"value": repr(fn(*args, **kwargs))}
    except BaseException as e:
        answer = {"error": f"{type(e).__name__}: {e}"[:300]}
    write(json.dumps(answer))
"""

# World-writable places a sandboxed process could otherwise leave files in; each gets a
# private tmpfs inside the mount namespace.
WRITABLE_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/dev/mqueue")
UID_BASE = 61000  # sandbox slot k runs as uid/gid UID_BASE + k
MAX_ANSWER_BYTES = 1 << 16


class SandboxError(ConfigError):
    """No sandbox can run here as configured (not a verdict on the code); says what to fix."""


@dataclass(frozen=True)
class Isolation:
    """What the sandbox can enforce on this machine, found by `detect_isolation`."""

    method: str  # "namespaces" or "rlimits"
    python: str
    network: bool = False
    pid_namespace: bool = False
    private_tmp: bool = False
    unprivileged_uid: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)

    def describe(self) -> dict[str, Any]:
        """JSON-friendly summary for the run's config.json."""
        return {**asdict(self), "notes": list(self.notes), "resource_limits": True,
                "minimal_environment": True, "verdict_outside_sandbox": True}


def _limits(cfg: RewardConfig) -> list[str]:
    """prlimit's options: inherited through exec by everything the sandbox starts."""
    return ["prlimit", f"--cpu={int(cfg.timeout_sec) + 1}",
            f"--as={cfg.sandbox_memory_mb << 20}", f"--fsize={cfg.sandbox_file_size_kb << 10}",
            f"--nproc={cfg.sandbox_max_processes}", f"--nofile={cfg.sandbox_open_files}",
            "--core=0", "--"]


@functools.cache
def _fstab() -> str:
    """A mount table giving each world-writable directory a private tmpfs (read by `mount`
    inside the sandbox's mount namespace)."""
    directory = tempfile.mkdtemp(prefix="rlcore-sandbox-")
    atexit.register(shutil.rmtree, directory, True)
    path = os.path.join(directory, "fstab")
    with open(path, "w") as f:
        for d in WRITABLE_DIRS:
            if os.path.isdir(d):
                f.write(f"rlcore-sandbox {d} tmpfs rw,nosuid,nodev,size=16m,mode=1777 0 0\n")
    return path


def _command(iso: Isolation, cfg: RewardConfig, uid: int, answers_fd: int) -> list[str]:
    child = [iso.python, "-I", "-S", "-c", CHILD, str(answers_fd)]
    if iso.unprivileged_uid:
        child = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                 "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all", *child]
    if iso.method != "namespaces":
        return [*_limits(cfg), *child]
    return [*_limits(cfg), "unshare", "--mount", "--net", "--pid", "--ipc", "--uts", "--fork",
            "--kill-child", "--mount-proc", "sh", "-c",
            f'mount --all --fstab "{_fstab()}" && cd /tmp && exec "$@"', "sandbox", *child]


PROBE_TIMEOUT_S = 60.0


def _probe(iso: Isolation, cfg: RewardConfig) -> str | None:
    """Run a trivial solution through the sandbox; None when it works, else why not.

    The probe asks what works here, not how fast: it gets its own generous deadline, so that
    a loaded machine, slow to start the sandbox, is not mistaken for one that cannot isolate
    (a timed-out probe would fall back to weaker isolation for the whole run)."""
    cfg = replace(cfg, timeout_sec=max(cfg.timeout_sec, PROBE_TIMEOUT_S))
    try:
        with Session(iso, cfg, "def f(x):\n    return x + 1\n", "f", slot=0) as s:
            return None if s.call(1) == 2 else "the probe returned a wrong value"
    except (OSError, CallFailed) as e:
        return str(e) or type(e).__name__


@functools.cache
def detect_isolation(cfg: RewardConfig) -> Isolation:
    """The strongest isolation that works here, checked by running a probe through it."""
    if not shutil.which("prlimit"):
        raise SandboxError("the code sandbox needs util-linux (prlimit, unshare, setpriv); "
                           "install it (Debian: apt-get install util-linux)")
    pythons = list(dict.fromkeys(p for p in (
        cfg.sandbox_python, sys.executable,
        shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")) if p))
    notes = []
    if cfg.sandbox_isolation == "rlimits":
        notes.append("reward.sandbox_isolation is 'rlimits': namespaces not used")
    elif os.geteuid() != 0:
        notes.append("not root: no namespaces or uid change; the code runs as this user, "
                     "sharing its network, processes and files: run code tasks in a "
                     "disposable container or VM")
    elif not (shutil.which("unshare") and shutil.which("setpriv")):
        notes.append("util-linux unshare/setpriv not found: no namespaces")
    else:
        for python in pythons:
            iso = Isolation("namespaces", python, network=True, pid_namespace=True,
                            private_tmp=True, unprivileged_uid=True)
            why = _probe(iso, cfg)
            if why is None:
                return iso
            notes.append(f"namespaces with {python}: {why}")
    if cfg.sandbox_isolation == "namespaces":
        raise SandboxError("reward.sandbox_isolation is 'namespaces' but they do not work here: "
                           + "; ".join(notes))
    # Without namespaces, root still hands the code to an unprivileged uid when it can, so
    # that it cannot signal or write over anything of ours.
    drop = os.geteuid() == 0 and shutil.which("setpriv") is not None
    for python in pythons:
        iso = Isolation("rlimits", python, unprivileged_uid=drop, notes=tuple(notes))
        why = _probe(iso, cfg)
        if why is None:
            return iso
        notes.append(f"rlimits with {python}: {why}")
    raise SandboxError("no interpreter runs in the code sandbox: " + "; ".join(notes)
                       + " (set reward.sandbox_python to one the sandbox user can run)")


class CallFailed(Exception):
    """A call into the sandboxed code did not return a value (error, timeout, garbage)."""


class Session:
    """One sandboxed interpreter holding one candidate solution, called through a proxy."""

    def __init__(self, iso: Isolation, cfg: RewardConfig, code: str, entry_point: str,
                 slot: int):
        self.deadline = time.monotonic() + cfg.timeout_sec
        self.namespaced = iso.method == "namespaces"
        self.output_left = cfg.sandbox_output_kb << 10  # bytes of stdout+stderr still read
        answers_r, answers_w = os.pipe()
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
        try:
            self.proc = subprocess.Popen(
                _command(iso, cfg, UID_BASE + slot, answers_w), stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, pass_fds=(answers_w,),
                env=env, cwd="/", start_new_session=True)
        finally:
            os.close(answers_w)
        self.answers = answers_r
        assert self.proc.stdin is not None and self.proc.stdout is not None  # both piped
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        self.out = self.stdout.fileno()  # -1 once the output is cut off
        self.buffer = b""
        self.dead = False
        try:
            self._send({"code": code, "entry_point": entry_point})
            hello = self._receive()
        except CallFailed:
            self.close()
            raise
        if not hello.get("ready"):
            self.close()
            raise CallFailed(f"solution did not load: {hello.get('error', '?')}")

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, message: Any) -> None:
        data = (message if isinstance(message, str) else json.dumps(message)).encode()
        try:
            self.stdin.write(struct.pack(">I", len(data)) + data)
            self.stdin.flush()
        except OSError as e:
            raise CallFailed(f"the sandboxed process is gone ({e.__class__.__name__})") from e

    def _receive(self) -> dict[str, Any]:
        """The next answer frame, reading (and capping) the candidate's output meanwhile."""
        while True:
            if len(self.buffer) >= 4:
                n = struct.unpack(">I", self.buffer[:4])[0]
                if n > MAX_ANSWER_BYTES:
                    raise CallFailed("answer larger than the cap")
                if len(self.buffer) >= 4 + n:
                    frame, self.buffer = self.buffer[4:4 + n], self.buffer[4 + n:]
                    try:
                        return json.loads(frame)
                    except ValueError as e:
                        raise CallFailed("a malformed answer") from e
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise CallFailed("timed out")
            watch = [self.answers] + ([self.out] if self.out >= 0 else [])
            ready, _, _ = select.select(watch, [], [], left)
            if self.out >= 0 and self.out in ready:
                # The candidate's output is drained (never parsed) up to the cap; past it, the
                # pipe is closed and a flood dies of EPIPE.
                chunk = os.read(self.out, 65536)
                self.output_left -= len(chunk)
                if not chunk or self.output_left < 0:
                    self.stdout.close()
                    self.out = -1
            if self.answers in ready:
                chunk = os.read(self.answers, 65536)
                if not chunk:
                    raise CallFailed("the sandboxed process exited")
                self.buffer += chunk

    def call(self, *args: Any, **kwargs: Any) -> Any:
        """Call the entry point in the sandbox; its return value comes back as a literal."""
        if self.dead:
            raise CallFailed("the sandboxed process is gone")
        try:
            self._send(repr((args, kwargs)))
            answer = self._receive()
        except CallFailed:
            self.dead = True
            raise
        if "value" not in answer:
            raise CallFailed(str(answer.get("error", "no value")))
        try:
            return ast.literal_eval(answer["value"])
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as e:
            raise CallFailed("the return value is not a plain literal") from e

    def close(self) -> None:
        """End the sandbox and everything the candidate started, and release the pipes.

        The harness exits at the end of its input; otherwise its first process is killed.
        Either way the kernel then kills the rest of its PID namespace, and `unshare` returns
        only once that is done. The process group is killed last, for the fallback without
        namespaces.
        """
        with contextlib.suppress(OSError):
            self.stdin.close()
        try:
            self.proc.wait(timeout=0.05)
        except subprocess.TimeoutExpired:
            for pid in _children(self.proc.pid) if self.namespaced else []:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=1.0 if self.namespaced else 0)
        # Without a PID namespace a fork can race the signal: repeat until the group is empty.
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                break
            if self.namespaced or self.proc.poll() is not None and not _group_alive(self.proc.pid):
                break
            time.sleep(0.005)
        self.proc.wait()
        with contextlib.suppress(OSError):
            self.stdout.close()
        os.close(self.answers)


def _group_alive(pgid: int) -> bool:
    """Whether a process of the group is still running (zombies do not count)."""
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []
