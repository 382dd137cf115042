"""The reward harness: one function, `evaluate_response`, shared by every runner.

Answer tasks are scored by exact match of the parsed answer. For an integer reference answer
the rule is: the last integer in the response (optionally signed, commas allowed as thousands
separators) is the answer; a response without an integer fails. Taking the last number lets
instruct models show their working ("3+4 is 7, so the answer is 7") while a bare "7" from the
tiny model is the same. A non-numeric reference must equal the whole stripped response.
Code tasks need the sandbox of a later issue and are refused clearly until then.
"""

from __future__ import annotations

import re
import time
from typing import Any

from rlcore.tasks import Task

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


def evaluate_response(response_text: str, task: Task, timeout_sec: float) -> dict[str, Any]:
    """Score one response: {'reward': float, 'pass': bool, 'parsed': str|None, 'eval_s': float}."""
    start = time.perf_counter()
    if task.kind == "code":
        raise NotImplementedError(
            f"task '{task.task_id}' is a code task; sandboxed code evaluation is not built yet"
        )
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
