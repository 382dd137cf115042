"""The AReaL-style workers' process factory: a fork server that has imported torch once.

Spawning three workers meant three interpreters importing torch and transformers at once,
about 5 s of a 2-core machine per run. Workers are forked instead from one server process
that imported the worker modules before any of them started, and that has run no torch
code, so each worker still builds its own threads and CUDA context. `rlcore run` starts the
server first thing, so its imports overlap the CLI's own. Nothing here imports torch.

A job forked from the warm launcher (`rlcore/launcher/`) has those modules imported already
and has run no torch code either when it asks for the server, so it forks its fork server
from itself (`fork_from_here`) instead of spawning an interpreter that imports them again:
the same server, started in milliseconds instead of seconds.
"""

from __future__ import annotations

import inspect
import multiprocessing
import multiprocessing.forkserver
import os
import socket
import threading
import traceback
from multiprocessing import connection, resource_tracker, spawn, util
from multiprocessing.context import ForkServerContext
from typing import Any, cast

# What every worker imports; the server imports it once, before the first fork.
WORKER_MODULES = [
    "rlcore.runners.asynchronous.forkserver_init",  # first: before the long imports
    "rlcore.runners.asynchronous.vehicles",
    "rlcore.runners.asynchronous.rollout",
    "rlcore.runners.asynchronous.trainer",
    "rlcore.runners.asynchronous.param_service",
]

_fork_from_here = False


def fork_from_here() -> None:
    """Start this process's fork server by forking this process: for a process that has
    imported the worker modules (all but `forkserver_init`) and run no torch code."""
    global _fork_from_here
    _fork_from_here = True


def context() -> ForkServerContext:
    """The `forkserver` context, its server started (once per process) with the workers'
    modules preloaded."""
    ctx = multiprocessing.get_context("forkserver")
    assert isinstance(ctx, ForkServerContext)
    ctx.set_forkserver_preload(WORKER_MODULES)
    if _fork_from_here:
        _start_by_fork()
    multiprocessing.forkserver.ensure_running()  # a no-op when _start_by_fork started it
    return ctx


def _forkable() -> bool:
    """Whether this Python's fork server is the one `_start_by_fork` knows (3.10 to 3.13;
    3.14 adds an authentication key), and this process has no other Python thread."""
    params = list(inspect.signature(multiprocessing.forkserver.main).parameters)
    server = multiprocessing.forkserver._forkserver
    return (params == ["listener_fd", "alive_r", "preload", "main_path", "sys_path"]
            and all(hasattr(server, a) for a in ("_forkserver_address", "_forkserver_alive_fd",
                                                  "_forkserver_pid", "_preload_modules"))
            and threading.active_count() == 1)


def _start_by_fork() -> None:
    """`ForkServer.ensure_running` with os.fork() where it spawns a fresh interpreter.

    The child runs the fork server's own main loop with the same arguments; it imports
    `forkserver_init` there (this process never has), which ties it to this process as a
    spawned server is tied. Where the internals differ, the server is spawned as usual.
    """
    server: Any = multiprocessing.forkserver._forkserver  # its private state, as 3.10-3.13 have it
    if not _forkable():
        return
    with server._lock:
        resource_tracker.ensure_running()
        if server._forkserver_pid is not None:
            return  # started already (ensure_running checks that it still runs)
        preload = list(server._preload_modules)
        data = {k: v for k, v in spawn.get_preparation_data("ignore").items()
                if k in ("main_path", "sys_path")}
        with socket.socket(socket.AF_UNIX) as listener:
            address = cast(Any, connection).arbitrary_address("AF_UNIX")
            listener.bind(address)
            if not util.is_abstract_socket_namespace(address):
                os.chmod(address, 0o600)
            listener.listen()
            alive_r, alive_w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the fork server: it never returns
                _serve(listener.fileno(), alive_r, alive_w, preload, data)
            os.close(alive_r)
        server._forkserver_address = address
        server._forkserver_alive_fd = alive_w
        server._forkserver_pid = pid


def _serve(listener_fd: int, alive_r: int, alive_w: int, preload: list[str],
           data: dict[str, Any]) -> None:
    """The forked fork server's life, ended as a spawned server's interpreter would end."""
    code = 1
    try:
        os.close(alive_w)
        # a spawned server holds no copy of the resource tracker's pipe: its clients hand
        # it over with each request
        tracker: Any = resource_tracker._resource_tracker
        if tracker._fd is not None:
            os.close(tracker._fd)
            tracker._fd = None
        multiprocessing.forkserver.main(listener_fd, alive_r, preload, **data)
        code = 0
    except SystemExit as e:  # how the server's loop ends when the last client has gone
        code = e.code if isinstance(e.code, int) else 0
    except BaseException:  # noqa: BLE001 - report it as the interpreter would, then exit
        traceback.print_exc()
    finally:
        os._exit(code)
