"""The reward harness: one function, `evaluate_response`, shared by every runner.

`reward.verifier` says how a response is judged:
- `last_integer` (the default): for an integer reference, the last integer in the response
  (optionally signed, commas allowed as thousands separators) is the answer; a response
  without one fails. Taking the last number lets instruct models show their working ("3+4 is
  7, so the answer is 7") while a bare "7" from the tiny model is the same. A non-integer
  reference must equal the whole stripped response.
- `stated`: for an integer reference, the integer the response states as its answer, as a
  person reads it: the response alone (a number, maybe bold, with a closing period), else the
  number right after its first `=`, `equals`, `is equal to` or `answer is`. A response that
  states none fails, so a truncated or rambling one is not credited for a number it passes.
- `exact`: the stripped response equals the stripped reference.
- `math`: math-verify judges the response's boxed or last answer equivalent to the reference
  (`1/2`, `0.5` and `\\frac{1}{2}` alike), in worker processes under `reward.timeout_sec`
  (`rlcore.tasks.math_verifier`); an answer that outlasts it scores 0 with `verify_error`.
- `code`: the task's tests run against the response's code in the sandbox
  (`rlcore.tasks.grading`): 1 when every test passes, else 0.
`check_tasks` refuses, before a run, tasks the verifier cannot judge.

`RewardPool` takes the slow verifiers (`code`, `math`) off the caller's path: they run in a
few threads, each with a sandbox slot of its own, and report back through a callback, so a
slow or hostile response never stalls the controller.

A *harness failure* is `evaluate_response` raising (a sandbox that cannot start, a broken
task): the response was never judged. A response whose tests fail, crash or time out has
been judged, and scores an ordinary 0. Every runner and the replay score through
`RewardPool`, which turns a harness failure into reward 0 with `harness_error` set and, once
the runner knows the sample (`admit`), stops the run when there are more failures than
`reward.max_harness_errors`.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rlcore.clock import WALL, Clock
from rlcore.clock.work import Reward
from rlcore.config import ConfigError, RewardConfig, TaskConfig
from rlcore.errors import HarnessFailed
from rlcore.tasks.grading import extract_code, run_tests
from rlcore.tasks.math_verifier import shared_verifier
from rlcore.tasks.prompts import Prompt
from rlcore.tasks.registry import SUITES
from rlcore.tasks.suites import Task, TaskSuite, load_suite

SLOW_VERIFIERS = ("code", "math")  # scored off the caller's path, in RewardPool's threads
_INT = re.compile(r"-?\d[\d,]*")
_ALONE = re.compile(r"\s*[*$]*\s*(-?\d[\d,]*)\s*[*$]*\s*\.?\s*[*$]*\s*")
_STATES = re.compile(r"=|\bequals\b|\bis equal to\b|\banswer is\b", re.IGNORECASE)
_STATED = re.compile(r"\s*:?\s*[*$]*\s*(-?\d[\d,]*)")


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


def stated_answer(response_text: str) -> str | None:
    """The integer a response states as its answer (its whole text, or the number right after
    its first '=', 'equals', 'is equal to' or 'answer is'), normalised, or None."""
    alone = _ALONE.fullmatch(response_text)
    if alone is None:
        marker = _STATES.search(response_text)
        alone = _STATED.match(response_text, marker.end()) if marker else None
    return parse_answer(alone.group(1)) if alone else None


def evaluate_response(response_text: str, task: Task, cfg: RewardConfig, slot: int = 0
                      ) -> dict[str, Any]:
    """Score one response with `cfg.verifier`: {'reward', 'pass', 'parsed', 'eval_s'}, plus
    the test counts and first error for a code task (run in sandbox slot `slot`), and
    `verify_error` for a math answer that got no verdict."""
    start = time.perf_counter()
    if (why := mismatch(task, cfg.verifier)) is not None:
        raise ConfigError(why)
    if cfg.verifier == "code":
        code = extract_code(response_text, task.entry_point or "")
        verdict = run_tests(cfg, code, task.entry_point or "", task.tests or [], slot)
        return {"reward": 1.0 if verdict["pass"] else 0.0, "pass": verdict["pass"],
                "parsed": code, "eval_s": time.perf_counter() - start,
                "tests_passed": verdict["tests_passed"], "tests_total": verdict["tests_total"],
                "error": verdict["error"]}
    reference = (task.answer or "").strip()
    extra: dict[str, Any] = {}
    if cfg.verifier == "math":
        verdict_m = shared_verifier(cfg).check(response_text, reference)
        ok, parsed = verdict_m.ok, verdict_m.parsed
        if verdict_m.error is not None:
            extra["verify_error"] = verdict_m.error
    elif cfg.verifier == "last_integer" and _INT.fullmatch(reference):
        parsed = parse_answer(response_text)
        ok = parsed is not None and parsed == parse_answer(reference)
    elif cfg.verifier == "stated" and _INT.fullmatch(reference):
        parsed = stated_answer(response_text)
        ok = parsed is not None and parsed == parse_answer(reference)
    else:  # exact, or last_integer or stated with a non-integer reference: the whole response
        parsed = response_text.strip()
        ok = parsed == reference
    return {
        "reward": 1.0 if ok else 0.0,
        "pass": ok,
        "parsed": parsed,
        "eval_s": time.perf_counter() - start,
        **extra,
    }


def mismatch(task: Task, verifier: str) -> str | None:
    """Why `verifier` cannot judge `task` (a code task needs `code`, and only it), or None."""
    if (task.kind == "code") == (verifier == "code"):
        return None
    if task.kind == "code":
        return (f"task '{task.task_id}' is a code task (it has tests): set reward.verifier "
                f"to 'code' (it is '{verifier}')")
    return (f"task '{task.task_id}' is an answer task: reward.verifier 'code' runs code tasks' "
            "tests; set it to last_integer, stated, exact or math")


def check_suite(task_cfg: TaskConfig, cfg: RewardConfig, *, golds: bool = True) -> TaskSuite:
    """The configured suite, both splits checked by `check_tasks` (so a held-out gold the
    verifier cannot read stops a run before it trains, not at its eval)."""
    suite = load_suite(task_cfg)
    for split, path in (("train", task_cfg.train_path), ("heldout", task_cfg.heldout_path)):
        source = (path if SUITES.get(task_cfg.suite).reads_files
                  else f"task.suite '{task_cfg.suite}' ({split})")
        check_tasks(suite.split(split), cfg, str(source), golds=golds)
    return suite


def check_tasks(tasks: Iterable[Task], cfg: RewardConfig, source: str, *,
                golds: bool = True) -> None:
    """Refuse, naming `source` and the task, tasks `cfg.verifier` cannot judge: a code task
    outside `code` or the reverse, or under `math` a gold answer math-verify reads nothing
    from (no response could pass it; `golds=False` leaves that out, and with it the
    math-verify worker processes it starts)."""
    tasks = list(tasks)
    for task in tasks:
        if (why := mismatch(task, cfg.verifier)) is not None:
            raise ConfigError(f"{source}: {why}")
    if cfg.verifier != "math" or not golds:
        return
    verifier = shared_verifier(cfg)
    first: dict[str, Task] = {}  # each distinct gold, with the first task that has it
    for task in tasks:
        first.setdefault((task.answer or "").strip(), task)
    # one gold per worker at a time: a GSM8K split is thousands of them
    with ThreadPoolExecutor(cfg.workers) as threads:
        parsed_golds = threads.map(verifier.parse_gold, first)  # in order, errors included
        for gold, task in first.items():
            try:
                parsed = next(parsed_golds)
            except ValueError as e:
                raise ConfigError(f"{source}: task '{task.task_id}': {e}") from e
            if parsed is None:
                raise ConfigError(
                    f"{source}: task '{task.task_id}': math-verify reads no mathematical "
                    f"expression from the gold answer {gold!r}, so it could only compare "
                    "text: fix the answer in the file, or set reward.verifier to exact")


class RewardPool:
    """Scores responses off the caller's path, and applies the harness-failure rule.

    `last_integer` and `exact` take microseconds and are scored at once, in the caller
    (`submit` returns the result); `code` and `math` go to `cfg.workers` threads (the sandbox
    and math-verify's workers are processes, so threads overlap), each thread with its own
    sandbox slot (its own unprivileged uid), and their results reach `done(key, result)`,
    called from that thread. Under a virtual clock
    every task is scored in the caller, one at a time, and charged to it: a thread outside the
    clock's schedule would make the run's order depend on this machine again.
    """

    def __init__(self, cfg: RewardConfig,
                 done: Callable[[Any, dict[str, Any]], None] | None = None,
                 clock: Clock = WALL):
        self.cfg, self.done, self.clock = cfg, done, clock
        self.harness_errors = 0  # admitted so far
        slots = itertools.count()
        self._slot = threading.local()

        def name_slot() -> None:
            self._slot.index = next(slots)

        # Under a virtual clock every response is scored in the caller (see above).
        self.off_path = cfg.verifier in SLOW_VERIFIERS and not clock.virtual
        self._pool = ThreadPoolExecutor(cfg.workers, thread_name_prefix="reward",
                                        initializer=name_slot)

    def submit(self, key: Any, response_text: str, task: Task) -> dict[str, Any] | None:
        """Score a response: the result now (answer tasks), or None and `done` later."""
        if not self.off_path:
            return self._evaluate(response_text, task)
        self._pool.submit(self._score, key, response_text, task)
        return None

    def _score(self, key: Any, response_text: str, task: Task) -> None:
        result = self._evaluate(response_text, task, self._slot.index)
        if self.done is not None:
            self.done(key, result)

    def _evaluate(self, response_text: str, task: Task, slot: int = 0) -> dict[str, Any]:
        try:
            return evaluate_response(response_text, task, self.cfg, slot)
        except Exception as e:  # noqa: BLE001 - the harness failed; `admit` judges the run
            # No reward was computed: 0 keeps the sample's place in its group and batch.
            return {"reward": 0.0, "pass": False, "parsed": None, "eval_s": 0.0,
                    "harness_error": f"{type(e).__name__}: {e}"}
        finally:
            self.clock.charge(Reward(kind=self.cfg.verifier))

    def map(self, items: Iterable[tuple[str, Task]]) -> list[dict[str, Any]]:
        """Score (response, task) pairs concurrently and return the results in order."""
        items = list(items)
        if not self.off_path:
            return [self._evaluate(text, task) for text, task in items]
        return list(self._pool.map(
            lambda item: self._evaluate(item[0], item[1], self._slot.index), items))

    def admit(self, sample_id: int, prompt: Prompt, result: dict[str, Any]) -> None:
        """Count `result` if the harness failed on it; raise HarnessFailed, naming the sample,
        once that makes more failures than `reward.max_harness_errors`."""
        if "harness_error" not in result:
            return
        self.harness_errors += 1
        n, limit = self.harness_errors, self.cfg.max_harness_errors
        if n > limit:
            raise HarnessFailed(
                f"reward harness failed on sample {sample_id} (task {prompt.task.task_id}, "
                f"group {prompt.group_id}): {result['harness_error']}; that is {n} harness "
                f"failure{'s' if n > 1 else ''}, more than reward.max_harness_errors={limit} "
                "allows. The run was stopped and no summary.json was written: fix the harness "
                "(e.g. the sandbox) or raise reward.max_harness_errors to score such samples 0 "
                "and go on")

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
