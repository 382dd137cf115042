"""The reward harness: one function, `evaluate_response`, shared by every runner.

Answer tasks are scored by exact match of the parsed answer; code tasks by running their tests
against the response's code in the sandbox (`rlcore.tasks.sandbox`): the reward is 1 when every test
passes, else 0. For an integer reference answer
the rule is: the last integer in the response (optionally signed, commas allowed as thousands
separators) is the answer; a response without an integer fails. Taking the last number lets
instruct models show their working ("3+4 is 7, so the answer is 7") while a bare "7" from the
tiny model is the same. A non-numeric reference must equal the whole stripped response.

`RewardPool` takes scoring off the caller's path: code evaluations run in a few threads, each
with a sandbox slot of its own, and report back through a callback, so a slow or hostile
response never stalls the controller.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rlcore.config import RewardConfig
from rlcore.tasks.sandbox import extract_code, run_tests
from rlcore.tasks.suites import Task

_INT = re.compile(r"-?\d[\d,]*")


def parse_answer(response_text: str) -> str | None:
    """The last integer in the text, normalised (no commas, no leading zeros), or None."""
    found = _INT.findall(response_text)
    if not found:
        return None
    digits = found[-1].replace(",", "")
    try:
        return str(int(digits))
    except ValueError:
        return None


def evaluate_response(response_text: str, task: Task, cfg: RewardConfig, slot: int = 0
                      ) -> dict[str, Any]:
    """Score one response: {'reward': float, 'pass': bool, 'parsed': str|None, 'eval_s': float},
    plus the test counts and first error for a code task (run in sandbox slot `slot`)."""
    start = time.perf_counter()
    if task.kind == "code":
        code = extract_code(response_text, task.entry_point or "")
        verdict = run_tests(cfg, code, task.entry_point or "", task.tests or [], slot)
        return {"reward": 1.0 if verdict["pass"] else 0.0, "pass": verdict["pass"],
                "parsed": code, "eval_s": time.perf_counter() - start,
                "tests_passed": verdict["tests_passed"], "tests_total": verdict["tests_total"],
                "error": verdict["error"]}
    reference = (task.answer or "").strip()
    if _INT.fullmatch(reference):
        parsed = parse_answer(response_text)
        ok = parsed is not None and parsed == parse_answer(reference)
    else:  # a non-numeric reference answer: the whole stripped response must equal it
        parsed = response_text.strip()
        ok = parsed == reference
    return {
        "reward": 1.0 if ok else 0.0,
        "pass": ok,
        "parsed": parsed,
        "eval_s": time.perf_counter() - start,
    }


class RewardPool:
    """Scores responses off the caller's path.

    Answer tasks take microseconds and are scored at once, in the caller (`submit` returns
    the result); code tasks go to `cfg.workers` threads (the sandbox is a subprocess, so
    threads overlap), each thread with its own sandbox slot (its own unprivileged uid), and
    their results reach `done(key, result)`, called from that thread.
    """

    def __init__(self, cfg: RewardConfig,
                 done: Callable[[Any, dict[str, Any]], None] | None = None):
        self.cfg, self.done = cfg, done
        slots = itertools.count()
        self._slot = threading.local()

        def name_slot() -> None:
            self._slot.index = next(slots)

        self._pool = ThreadPoolExecutor(cfg.workers, thread_name_prefix="reward",
                                        initializer=name_slot)

    def submit(self, key: Any, response_text: str, task: Task) -> dict[str, Any] | None:
        """Score a response: the result now (answer tasks), or None and `done` later."""
        if task.kind != "code":
            return evaluate_response(response_text, task, self.cfg)
        self._pool.submit(self._score, key, response_text, task)
        return None

    def _score(self, key: Any, response_text: str, task: Task) -> None:
        try:
            result = evaluate_response(response_text, task, self.cfg, self._slot.index)
        except Exception as e:  # noqa: BLE001 - a harness failure scores 0, and says why
            result = {"reward": 0.0, "pass": False, "parsed": None, "eval_s": 0.0,
                      "error": f"harness: {type(e).__name__}: {e}"}
        if self.done is not None:
            self.done(key, result)

    def map(self, items: Iterable[tuple[str, Task]]) -> list[dict[str, Any]]:
        """Score (response, task) pairs concurrently and return the results in order."""
        items = list(items)
        if not any(task.kind == "code" for _, task in items):  # microseconds each: inline
            return [evaluate_response(text, task, self.cfg) for text, task in items]
        return list(self._pool.map(
            lambda item: evaluate_response(item[0], item[1], self.cfg, self._slot.index),
            items))

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
