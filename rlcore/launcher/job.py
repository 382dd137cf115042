"""A job forked from the warm launcher's server: become the process a cold `python -m rlcore
ARGV` would have been, run the command, exit with its status.

What a cold process gets from its parent and its interpreter's start, the job takes from the
client's request: standard streams, directory, environment, umask, CPUs, the signals it
ignores, `sys.argv`, a `__main__` like `python -m rlcore`'s, the job's start time (for
`time.startup_s`) and fresh random state where the interpreter would seed it. What it shares
with the server is what the server's start decided and the client's key covered
(`protocol.server_key`): the code, the interpreter and the variables read at start-up.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import signal
import sys
import threading
import types
from collections.abc import Callable
from typing import Any, NoReturn

# Python's own start leaves these ignored (and SIGINT raising KeyboardInterrupt).
IGNORED_AT_START = (signal.SIGPIPE, signal.SIGXFSZ)


def become(request: dict[str, Any], fds: list[int], server_pid: int,
           close_server: Callable[[], None]) -> NoReturn:
    """In the child of the server's fork: set the process up as the client asked, run the
    command and exit; never returns into the server's loop."""
    code = 70  # EX_SOFTWARE: the job could not be set up
    try:
        os.setpgid(0, 0)  # its own group, which the server kills when the client goes
        from rlcore.runners.asynchronous.health import die_with_parent

        die_with_parent(server_pid)  # no job outlives the server that reports its status
        close_server()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.umask(request["umask"])
        if request.get("cpus"):
            # where this is not allowed, the job keeps the server's CPUs
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, request["cpus"])
        _reset_signals(set(request.get("ignored", [])))
        _reset_process_state()
        # Line-buffered when it is a terminal, as Python decides at start (stderr always is).
        for stream, fd in ((sys.stdout, 1), (sys.stderr, 2)):
            if stream is not None and hasattr(stream, "reconfigure"):
                stream.reconfigure(line_buffering=fd == 2 or os.isatty(fd))
        _main_like_python_m_rlcore()
        sys.argv = [sys.argv[0], *request["argv"]]

        from rlcore.record.machine_load import set_job_start
        from rlcore.runners.asynchronous import forkserver

        set_job_start(request["started"])
        forkserver.fork_from_here()
    except BaseException:  # noqa: BLE001 - say why, then exit: never back into the server
        sys.excepthook(*sys.exc_info())
        _flush()
        os._exit(code)
    _exit(_run(request["argv"]))


def _reset_signals(ignored: set[int]) -> None:
    """The dispositions a fresh interpreter has, with the client's ignored signals kept
    ignored (a command started with SIGINT ignored does not get KeyboardInterrupt)."""
    signal.set_wakeup_fd(-1)
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        handler: Any = signal.SIG_DFL
        if sig in ignored or sig in IGNORED_AT_START:
            handler = signal.SIG_IGN
        elif sig == signal.SIGINT:
            handler = signal.default_int_handler
        # not the signals Python cannot set (the real-time ones libc reserves)
        with contextlib.suppress(OSError, ValueError):
            signal.signal(sig, handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def _reset_process_state() -> None:
    """What the interpreter would have drawn fresh for this process: the multiprocessing
    authentication key and numpy's global random state (Python's `random` reseeds itself
    after a fork; torch's default generator starts from a fixed seed in every process)."""
    import multiprocessing

    multiprocessing.current_process().authkey = os.urandom(32)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()


def _main_like_python_m_rlcore() -> None:
    """`__main__` as `python -m rlcore` has it, so that multiprocessing prepares the job's
    worker processes (from the module's name) exactly as it would for a cold job."""
    spec = importlib.util.find_spec("rlcore.__main__")
    assert spec is not None and spec.origin is not None
    main = types.ModuleType("__main__")
    main.__spec__, main.__file__ = spec, spec.origin
    main.__loader__, main.__package__ = spec.loader, "rlcore"
    sys.modules["__main__"] = main
    sys.argv = [spec.origin]


def _run(argv: list[str]) -> int:
    """`rlcore.cli.main(argv)` with the interpreter's top level around it: SystemExit's
    status, an uncaught exception's traceback and status 1; None for KeyboardInterrupt."""
    from rlcore.cli import main

    try:
        return main(argv)
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        return -signal.SIGINT
    except BaseException:  # noqa: BLE001 - the top level: report it as Python does
        sys.excepthook(*sys.exc_info())
        return 1


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass


def _exit(code: int) -> NoReturn:
    """End as the interpreter ends `rlcore` (cli.entry): wait for the non-daemon threads,
    run the exit handlers, flush, skip the module teardown. A KeyboardInterrupt ends by
    SIGINT, as Python does."""
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    _flush()
    if code == -signal.SIGINT:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        code = 128 + signal.SIGINT
    os._exit(code & 0xFF)
