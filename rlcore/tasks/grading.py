"""Grading a code task: the code a response holds, and the task's tests run against it.

The verdict never comes from the sandbox. The tests (trusted, from the task file) run in
*this* process against a proxy of the entry point: each call sends its arguments to the
child as a Python literal and gets the return value back as a literal (`ast.literal_eval`,
size-capped). So printing "PASS", exiting early, patching `assert` or the test runner, or
returning an object that claims to equal anything, cannot make a test pass; only returning
the right plain values can. A test may pass only literal values (numbers, strings, bytes,
tuples, lists, dicts, sets, booleans, None) to the entry point.
"""

from __future__ import annotations

import builtins
import re
from typing import Any

from rlcore.config import RewardConfig
from rlcore.tasks.sandbox import CallFailed, Session, detect_isolation


def extract_code(response: str, entry_point: str) -> str:
    """The code in a response: the first fenced block defining the entry point, else the
    last fenced block, else the whole response (bare code)."""
    blocks = re.findall(r"```[ \t]*[\w+-]*[ \t]*\n(.*?)(?:```|\Z)", response, re.DOTALL)
    for block in blocks:
        if re.search(rf"\bdef\s+{re.escape(entry_point)}\s*\(", block):
            return block
    return blocks[-1] if blocks else response


def run_tests(cfg: RewardConfig, code: str, entry_point: str, tests: list[str],
              slot: int = 0) -> dict[str, Any]:
    """Run a task's assertion tests here, against the solution running in the sandbox."""
    passed, error = 0, None
    try:
        with Session(detect_isolation(cfg), cfg, code, entry_point, slot) as s:
            for test in tests:
                try:
                    exec(test, {"__builtins__": _TEST_BUILTINS, entry_point: s.call})
                    passed += 1
                except AssertionError:
                    error = error or f"failed: {test}"
                except CallFailed as e:
                    error = error or f"{test}: {e}"
                except Exception as e:  # noqa: BLE001 - a test tripping on a wrong answer
                    # (`inc(1) + 1` on a returned string) judged it: a failed test, not a
                    # broken harness
                    error = error or f"{test}: {type(e).__name__}: {e}"
                if s.dead:
                    break
    except CallFailed as e:
        error = str(e)
    return {"tests_passed": passed, "tests_total": len(tests), "error": error,
            "pass": bool(tests) and passed == len(tests)}


# The tests are trusted, and need no more than comparisons and a few builtins.
_TEST_BUILTINS = {name: getattr(builtins, name) for name in (
    "abs", "all", "any", "bool", "dict", "float", "frozenset", "int", "isinstance", "len",
    "list", "max", "min", "range", "round", "set", "sorted", "str", "sum", "tuple",
    "AssertionError")}
