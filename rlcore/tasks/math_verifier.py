"""Math answers judged by math-verify, in worker processes with a hard timeout.

math-verify bounds its own parsing and comparison with SIGALRM, which can only be set on a
process's main thread: called from a reward thread it raises, and a harness that swallowed
that would score every answer 0 (verl's MATH rewards, PR #5635). With its timeouts off, a
hostile answer (`9^{9^{9^9}}`, a thousand nested braces) can hang a thread for good. So
rlcore turns math-verify's timeouts off and enforces its own from outside: every check runs
in a worker process, and one that has not answered within `reward.timeout_sec` is killed and
replaced. The answer scores 0 and its result says why (`verify_error`), so a run counts such
answers rather than hiding them. That holds in every mode, from any thread.

A worker parses each gold answer once and keeps it. Of a response, the last `\\boxed{...}`
is judged, as MATH's grading takes it (Hendrycks et al., `last_boxed_only_string`):
math-verify's own pattern reads every box of a response as one set (`\\boxed{3} no,
\\boxed{5}` gives {3, 5}), so rlcore cuts the last box out itself (`judged_text`). A response
with no well-formed box is parsed with math-verify's default extraction (the last LaTeX or
plain expression).
"""

from __future__ import annotations

import atexit
import os
import queue
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from rlcore.config import RewardConfig
from rlcore.tasks.fields import FieldError, boxed_answer

# A worker imports sympy and the LaTeX grammar (~1 s here): generous, as for the sandbox probe.
START_TIMEOUT_S = 120.0
GOLD_CACHE = 1 << 16  # gold answers a worker keeps parsed; GSM8K has 8.8k, MATH 12.5k


@dataclass(frozen=True)
class Verdict:
    """math-verify's judgement of one response: `parsed` is the answer it extracted (None
    when it found none), `error` says why no judgement was reached (the answer then fails)."""

    ok: bool
    parsed: str | None
    error: str | None = None


def gold_as_latex(gold: str) -> str:
    """The text math-verify parses a gold answer from: boxed, so that a bare `1104`, a
    `\\frac{3}{5}` and a `5\\sqrt{2}` are each read as one expression."""
    return "\\boxed{" + gold + "}"


def judged_text(response: str) -> str:
    """What math-verify parses of a response: its last `\\boxed{...}`, boxed again; the whole
    response where it has no well-formed box."""
    try:
        return gold_as_latex(boxed_answer(response))
    except FieldError:
        return response


def serve(conn: Connection, memory_mb: int) -> None:
    """A checker process's loop: answer ('gold', g) and ('check', g, response) until EOF."""
    import logging
    import resource

    # A hostile answer that would allocate without bound (a power tower evaluated exactly)
    # meets MemoryError here, a plain 0, instead of swapping the machine.
    limit = memory_mb << 20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    # math-verify warns on every call made with its timeouts off; ours is enforced outside.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    from math_verify import parse, verify

    golds: dict[str, list[Any]] = {}

    def gold(text: str) -> list[Any]:
        parsed = golds.get(text)
        if parsed is None:
            if len(golds) >= GOLD_CACHE:
                golds.clear()
            parsed = golds[text] = parse(gold_as_latex(text), parsing_timeout=None)
        return parsed

    conn.send("ready")
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        try:
            g = gold(request[1])
            if request[0] == "gold":
                # [expression, text] when it read one; [text] alone when the LaTeX would
                # not convert, which leaves only string comparison: refused for a gold.
                reply: tuple[bool, str | None] = (len(g) > 1, str(g[-1]) if g else None)
            else:
                answer = parse(judged_text(request[2]), parsing_timeout=None)
                ok = bool(g) and bool(answer) and verify(g, answer, timeout_seconds=None)
                reply = (bool(ok), str(answer[-1]) if answer else None)
        except (Exception, MemoryError, RecursionError):  # noqa: BLE001 - judged: unreadable
            reply = (False, None)
        conn.send(reply)


class _Worker:
    """One checker process and this end of the socket it answers on.

    A fresh interpreter (`python -m rlcore.tasks.math_verifier`), not multiprocessing's
    fork or spawn: a fork would copy the caller's threads' locks, and spawn would re-import
    the caller's main module (the launcher's, with torch) into every checker."""

    def __init__(self, memory_mb: int):
        mine, theirs = socket.socketpair()
        # This process's rlcore, whatever the working directory holds: -P keeps the current
        # directory off sys.path (a pipeline's working directory may have an rlcore/ folder
        # of task data, which would shadow the package), PYTHONPATH names where it came from.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH"))
            if p)}
        self.process = subprocess.Popen(
            [sys.executable, "-P", "-m", "rlcore.tasks.math_verifier", str(theirs.fileno()),
             str(memory_mb)], pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env=env)
        theirs.close()  # so that the worker's death reads as EOF here
        self.conn = Connection(mine.detach())
        self.ready = False

    def wait_ready(self) -> None:
        if self.ready:
            return
        if not self.conn.poll(START_TIMEOUT_S) or self.conn.recv() != "ready":
            raise RuntimeError(f"a math-verify worker did not start within {START_TIMEOUT_S:g}"
                               f" s (exit code {self.process.poll()}); is math-verify "
                               "installed (`make setup`)?")
        self.ready = True

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        self.conn.close()


class MathVerifier:
    """`workers` checker processes, shared by any number of threads: `check` takes an idle
    worker (waiting for one if all are busy) and kills it after `timeout_s` without a reply."""

    def __init__(self, workers: int, timeout_s: float, memory_mb: int):
        self.timeout_s, self.memory_mb = timeout_s, memory_mb
        self._idle: queue.SimpleQueue[_Worker] = queue.SimpleQueue()
        self._all: set[_Worker] = set()
        self._lock = threading.Lock()
        self.closed = False
        self._pid = os.getpid()
        for _ in range(workers):
            self._idle.put(self._start())

    def _start(self) -> _Worker:
        worker = _Worker(self.memory_mb)
        with self._lock:
            self._all.add(worker)
        return worker

    def _ask(self, request: tuple[str, ...]) -> tuple[tuple[bool, str | None] | None, str]:
        """The worker's reply, or None and why there is none (the worker is then replaced)."""
        if self.closed:
            raise RuntimeError("the math verifier was closed")
        worker = self._idle.get()
        reply, error = None, ""
        try:
            worker.wait_ready()
            worker.conn.send(request)
            if worker.conn.poll(self.timeout_s):
                reply = worker.conn.recv()
            else:
                error = f"no verdict within reward.timeout_sec={self.timeout_s:g} s"
        except (EOFError, OSError):
            error = f"the checker process died (exit code {worker.process.poll()})"
        finally:
            if reply is None:  # timed out, died, or the caller is unwinding: never reuse it
                worker.kill()
                with self._lock:
                    self._all.discard(worker)
                worker = self._start()
            self._idle.put(worker)
        return reply, error

    def check(self, response: str, gold: str) -> Verdict:
        """Whether `response` states an answer equivalent to `gold`."""
        reply, error = self._ask(("check", gold, response))
        return Verdict(False, None, error) if reply is None else Verdict(*reply)

    def parse_gold(self, gold: str) -> str | None:
        """The expression math-verify reads from a gold answer, or None when it reads none
        it can compare (only text, e.g. from broken LaTeX)."""
        reply, error = self._ask(("gold", gold))
        if reply is None:
            raise ValueError(f"math-verify could not parse the gold answer {gold!r}: {error}")
        return reply[1] if reply[0] else None

    def close(self) -> None:
        """Stop every worker; a later `check` raises. A no-op in a forked child, whose copy
        would otherwise kill its parent's workers at exit."""
        if os.getpid() != self._pid:
            return
        self.closed = True
        with self._lock:
            workers, self._all = list(self._all), set()
        for worker in workers:
            worker.kill()


_shared: dict[tuple[int, int, float, int], MathVerifier] = {}
_shared_lock = threading.Lock()


def shared_verifier(cfg: RewardConfig) -> MathVerifier:
    """This process's verifier for `cfg` (started on first use, stopped at exit), so that a
    runner's reward threads, its eval and its replay share one set of workers."""
    key = (os.getpid(), cfg.workers, cfg.timeout_sec, cfg.verifier_memory_mb)
    with _shared_lock:
        verifier = _shared.get(key)
        if verifier is None:
            verifier = _shared[key] = MathVerifier(cfg.workers, cfg.timeout_sec,
                                                   cfg.verifier_memory_mb)
            atexit.register(verifier.close)
    return verifier


if __name__ == "__main__":
    serve(Connection(int(sys.argv[1])), int(sys.argv[2]))
