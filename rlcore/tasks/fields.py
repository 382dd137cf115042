"""Field presets: which columns of a task file hold the prompt and the reference answer.

`rlcore` is rlcore's own line shape (`prompt`, `answer` or code-task fields), read by
`rlcore.tasks.suites.read_task_file` against its schema. The other presets read task files as
public datasets ship them: `gsm8k` (`question`, and `answer` ending in a `#### N` line) and
`math` (`problem`, and `solution` whose last `\\boxed{...}` is the answer). The extraction
functions are pure and raise `FieldError` on text they cannot read; the reader adds the file,
line and column to the message.

A preset names columns, not a file format: JSONL lines and Parquet rows share it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass


class FieldError(ValueError):
    """A column's text does not hold what its preset expects."""


# A GSM8K number: optional sign, digits with optional thousands separators, optional decimals.
_GSM8K_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")


def gsm8k_answer(text: str) -> str:
    """The number after the last `####` of a GSM8K answer, thousands separators removed:
    `'...so 1,000 + 234 = 1,234.\\n#### 1,234'` gives `'1234'`."""
    marker = text.rfind("####")
    if marker < 0:
        raise FieldError("no '#### ' line with the final answer (GSM8K ends its answer with "
                         "e.g. '#### 42')")
    tail = text[marker + 4:].strip()
    if not _GSM8K_NUMBER.fullmatch(tail):
        # Refused rather than guessed at: a wrong gold answer would silently score every
        # response of that task 0.
        raise FieldError(f"the answer after '####' must be a number such as 42, -3, 1,234 or "
                         f"2.5, got {tail!r}")
    return tail.replace(",", "")


_BOXED = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")


def boxed_answer(text: str) -> str:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`) in a MATH solution, nested
    braces included: `'... \\boxed{\\frac{1}{2}}.'` gives `'\\frac{1}{2}'`."""
    found = list(_BOXED.finditer(text))
    if not found:
        raise FieldError("no \\boxed{...} (MATH marks the final answer of a solution with "
                         "\\boxed{...})")
    last = found[-1]
    i = last.end()
    while i < len(text) and text[i].isspace():
        i += 1
    if i == len(text) or text[i] != "{":
        raise FieldError(f"the last {last.group()} is not followed by '{{': "
                         f"{text[last.start():][:40]!r}")
    depth, j = 0, i
    while j < len(text):
        c = text[j]
        if c == "\\":
            j += 2  # `\{` and `\}` are literal braces in LaTeX, not grouping
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                content = text[i + 1:j].strip()
                if not content:
                    raise FieldError("the last \\boxed{} is empty")
                return content
        j += 1
    raise FieldError(f"unbalanced braces in the last \\boxed{{...}}: {text[i:][:40]!r} never "
                     "closes")


@dataclass(frozen=True)
class FieldPreset:
    """Where a preset reads a task: the prompt column, the answer column and how the gold
    answer is extracted from the latter."""

    name: str
    prompt: str
    answer: str
    extract: Callable[[str], str]


# `rlcore` is absent: its lines are checked against TASK_LINE_SCHEMA instead (answer or code
# tasks, no extraction). config/run.py's `TaskConfig.fields` names every preset.
PRESETS: dict[str, FieldPreset] = {
    "gsm8k": FieldPreset("gsm8k", prompt="question", answer="answer", extract=gsm8k_answer),
    "math": FieldPreset("math", prompt="problem", answer="solution", extract=boxed_answer),
}


def preset_line_schema(preset: FieldPreset) -> dict[str, object]:
    """JSON Schema of one line of a preset's file: the two columns as non-empty strings, an
    optional `id`; other columns (MATH's `level`, `type`) are allowed and kept as meta."""
    return {
        "type": "object",
        "properties": {
            "id": {"type": ["string", "integer"]},
            preset.prompt: {"type": "string", "minLength": 1},
            preset.answer: {"type": "string", "minLength": 1},
        },
        "required": [preset.prompt, preset.answer],
    }
