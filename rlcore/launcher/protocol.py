"""What the warm launcher's client and server agree on: where the server lives, which server
may run a client's command (its key), and the messages between them.

Messages are one JSON object per line over a Unix stream socket. A client opens one
connection per request:

  {"op": "ping"}                         -> {"key": K, "pid": P}
  {"op": "stop"}                         -> {"stopped": P}: the server stops listening and
                                            exits once its running jobs have ended
  {"op": "run", "key": K, "argv": [...], -> {"pid": JOB} or {"error": "key", "key": K'}
   "cwd", "env", "started", "umask",        or {"error": "..."}; later {"exit": CODE} or
   "cpus", "ignored"} + stdin, stdout,      {"signal": N} when the job ends. Meanwhile the
   stderr as SCM_RIGHTS                     client may send {"signal": N} (forwarded to the
                                            job); closing the connection kills the job.

Nothing here imports torch: the client imports this module.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import rlcore
from rlcore.algo.registry import OBJECTIVES
from rlcore.code_digest import digest, launcher_files, plugin_digest
from rlcore.tasks.registry import SUITES

# The environment variables the launcher reads.
MODE_VAR = "RLCORE_LAUNCHER"  # warm (the default) | cold
DIR_VAR = "RLCORE_LAUNCHER_DIR"  # where the socket, the start lock and the server's log live
IDLE_VAR = "RLCORE_LAUNCHER_IDLE_S"  # a server with no job for this long exits (default 300)
START_VAR = "RLCORE_LAUNCHER_START_S"  # how long a client waits for a server it started

SOCKET, LOG, LOCK = "server.sock", "server.log", "start.lock"
IDLE_S = 300.0
START_S = 60.0
# sun_path holds 108 bytes on Linux, 104 on the BSDs: stay under both
MAX_SOCKET_PATH = 100

# Environment variables read while the server starts (by the interpreter, by the libraries
# when they are loaded, or at import time) rather than when a job runs: a server serves only
# clients whose values of these equal its own.
STARTUP_VARS = ("PYTHON", "LD_", "OMP_", "KMP_", "GOMP_", "MKL_", "ATEN_", "ONEDNN_", "DNNL_",
                "OPENBLAS_", "BLIS_",
                "NUMEXPR_", "NPY_", "MALLOC_", "TORCH", "PYTORCH_", "CUDA_", "CUBLAS_",
                "NVIDIA_", "HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TOKENIZERS_")


class LauncherUnavailable(Exception):
    """The warm launcher cannot run this command; the message says why."""


def source_root() -> Path:
    """The source tree this rlcore was imported from."""
    return Path(rlcore.__file__).resolve().parent.parent


def server_key(env: Mapping[str, str]) -> str:
    """What a server must share with a client to run its command as the client would: the
    code (the runtime part, the launcher and every installed plugin, which a job may import
    in the server's process), the interpreter and its start-up variables."""
    root = source_root()
    plugins = plugin_digest(ep.module for registry in (OBJECTIVES, SUITES)
                            for ep in entry_points(group=registry.group))
    h = hashlib.sha256()
    for part in (digest(root, launcher_files(root)), plugins, str(root), sys.executable,
                 sys.version, repr(sys.flags)):
        h.update(part.encode() + b"\0")
    for name in sorted(env):
        if name.startswith(STARTUP_VARS):
            h.update(f"{name}={env[name]}".encode() + b"\0")
    return h.hexdigest()[:16]


def launcher_dir(env: Mapping[str, str]) -> Path:
    """$RLCORE_LAUNCHER_DIR, or a directory per user and source tree in $XDG_RUNTIME_DIR
    (else the temporary directory): short, so that the socket's path fits."""
    if env.get(DIR_VAR):
        return Path(env[DIR_VAR]).absolute()
    base = env.get("XDG_RUNTIME_DIR") or env.get("TMPDIR") or "/tmp"
    tree = hashlib.sha256(str(source_root()).encode()).hexdigest()[:8]
    return Path(base) / f"rlcore-launcher-{os.getuid()}-{tree}"


def prepare_dir(path: Path) -> Path:
    """Create the launcher directory (mode 0700); refuse one another user owns or others
    may write to, since whoever controls the socket runs the commands."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = path.stat()
    except OSError as e:
        raise LauncherUnavailable(f"cannot use the launcher directory {path}: {e}") from e
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise LauncherUnavailable(f"the launcher directory {path} is not this user's alone")
    if not os.access(path, os.W_OK | os.X_OK):
        raise LauncherUnavailable(f"the launcher directory {path} is not writable")
    sock = path / SOCKET
    if len(os.fsencode(sock)) > MAX_SOCKET_PATH:
        raise LauncherUnavailable(f"the socket path {sock} is longer than {MAX_SOCKET_PATH} "
                                  f"bytes; set {DIR_VAR} to a shorter directory")
    return path


class Channel:
    """One connection's messages: JSON lines, file descriptors beside the first bytes."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._buf = b""
        self.eof = False

    def send(self, msg: Mapping[str, Any], fds: Sequence[int] = ()) -> None:
        data = json.dumps(msg, separators=(",", ":")).encode() + b"\n"
        if fds:
            sent = socket.send_fds(self.sock, [data], list(fds))
            data = data[sent:]
        self.sock.sendall(data)

    def _take(self) -> dict[str, Any] | None:
        line, sep, rest = self._buf.partition(b"\n")
        if not sep:
            return None
        self._buf = rest
        msg = json.loads(line)
        if not isinstance(msg, dict):
            raise ValueError(f"not a launcher message: {line[:80]!r}")
        return msg

    def receive(self, timeout: float | None, max_fds: int = 0
                ) -> tuple[dict[str, Any] | None, list[int]]:
        """The next message and the descriptors that came with it; (None, []) at the end of
        the connection. Raises TimeoutError after `timeout` seconds (None: no limit)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        fds: list[int] = []
        while (msg := self._take()) is None:
            if self.eof:
                return None, fds
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                    raise TimeoutError("no answer from the launcher")
            chunk, got, _, _ = socket.recv_fds(self.sock, 1 << 16, max_fds)
            fds += got
            self._buf += chunk
            self.eof = not chunk
        return msg, fds

    def pending(self) -> list[dict[str, Any]]:
        """Read what has arrived without waiting (the socket is readable): its complete
        messages; sets `eof` when the peer has closed."""
        chunk = self.sock.recv(1 << 16)
        self.eof = not chunk
        self._buf += chunk
        out = []
        while (msg := self._take()) is not None:
            out.append(msg)
        return out
