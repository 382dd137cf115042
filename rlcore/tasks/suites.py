"""Task suites: where prompts and their reference answers come from.

A suite has two disjoint splits, `train` and `heldout`. `arith` and `chain` generate their
problems deterministically from a seed; `jsonl` reads a user's files (one JSON object a line,
or a Parquet table's rows if the name ends in `.parquet`), checks each row against a schema and
reports bad lines or rows by number.

A jsonl line (or Parquet row) is, under `task.fields: rlcore`, an answer task (`prompt`,
`answer`) or a code task (`prompt`, `entry_point`, `tests`): each test is a one-line assertion
on the entry point, e.g. `"assert clamp(5, 0, 3) == 3"`, or an input/output pair
`{"args": [5, 0, 3], "expected": 3}`. Arguments must be Python literals (the sandbox passes
them as such). The shipped code tasks are `rlcore/tasks/data/code/{train,heldout}.jsonl`.
Under the `gsm8k` and `math` presets a line is a row as those datasets ship it
(`rlcore.tasks.fields`); samples are in `rlcore/tasks/data/{gsm8k,math}/`. A file suite's
prompts pass through `task.prompt_template`, and carry `task.system_prompt` to the chat
template.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import jsonschema

from rlcore.config import ConfigError, TaskConfig
from rlcore.tasks.chain import chain_problems, chain_prompt, worked_chain
from rlcore.tasks.fields import PRESETS, FieldError, FieldPreset, preset_line_schema
from rlcore.tasks.registry import SUITES


@dataclass(frozen=True)
class Task:
    """One prompt with what a correct response must contain."""

    task_id: str
    prompt: str
    answer: str | None = None
    # Code tasks carry assertion tests on `entry_point` instead (rlcore.tasks.sandbox runs them).
    tests: list[str] | None = None
    entry_point: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    # A chat model's system message (task.system_prompt): part of what the policy encodes, so
    # it travels with the task to every runner, eval and replay.
    system: str | None = None

    @property
    def kind(self) -> str:
        return "code" if self.tests else "answer"


class TaskSuite(Protocol):
    """A source of tasks with a disjoint train and held-out split."""

    name: str

    def split(self, name: str) -> list[Task]: ...


class TaskFileError(ConfigError):
    """A task file the user must fix; the message names the file and the line or row."""


_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
_WORDS = {"+": "plus", "-": "minus", "*": "times"}


def arith_prompt(a: int, op: str, b: int, form: str) -> str:
    """'3+4=' or, for instruct models, 'What is 3 plus 4? Answer with a single number.'"""
    if form == "words":
        return f"What is {a} {_WORDS[op]} {b}? Answer with a single number."
    return f"{a}{op}{b}="


class ArithSuite:
    """Arithmetic problems `a+b=` over operands 0..max_operand, split by a seeded shuffle."""

    name = "arith"

    def __init__(self, cfg: TaskConfig):
        problems = []
        for op in cfg.operators:
            for a in range(cfg.max_operand + 1):
                for b in range(cfg.max_operand + 1):
                    if op == "-" and b > a:  # keep answers non-negative
                        continue
                    problems.append((a, op, b))
        if cfg.heldout_size >= len(problems):
            raise ConfigError(
                f"task.heldout_size ({cfg.heldout_size}) must be smaller than the "
                f"{len(problems)} distinct problems of this arith setting"
            )
        random.Random(cfg.split_seed).shuffle(problems)
        tasks = [
            Task(task_id=f"{a}{op}{b}", prompt=arith_prompt(a, op, b, cfg.arith_form),
                 answer=str(_OPS[op](a, b)))
            for a, op, b in problems
        ]
        self._splits = {"heldout": tasks[: cfg.heldout_size], "train": tasks[cfg.heldout_size :]}

    def split(self, name: str) -> list[Task]:
        return self._splits[name]


class ChainSuite:
    """Sums of min_terms..max_terms operands, answered step by step (`rlcore.tasks.chain`):
    train_size + heldout_size distinct problems drawn from split_seed, the first held out."""

    name = "chain"

    def __init__(self, cfg: TaskConfig):
        try:
            problems = chain_problems(random.Random(cfg.split_seed),
                                      cfg.train_size + cfg.heldout_size, cfg.min_terms,
                                      cfg.max_terms, cfg.max_operand)
        except ValueError as e:
            raise ConfigError(f"task.train_size + task.heldout_size: {e}; lower them or "
                              "raise task.max_operand or task.max_terms") from e
        tasks = [Task(task_id="+".join(map(str, ops)), prompt=chain_prompt(ops),
                      answer=worked_chain(ops), meta={"terms": len(ops)})
                 for ops in problems]
        self._splits = {"heldout": tasks[: cfg.heldout_size], "train": tasks[cfg.heldout_size :]}

    def split(self, name: str) -> list[Task]:
        return self._splits[name]


TASK_LINE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": ["string", "integer"]},
        "prompt": {"type": "string", "minLength": 1},
        "answer": {"type": ["string", "number"]},
        "tests": {
            "type": "array",
            "minItems": 1,
            "items": {
                "oneOf": [
                    {"type": "string", "minLength": 1},
                    {
                        "type": "object",
                        "properties": {"args": {"type": "array"}, "expected": {}},
                        "required": ["args", "expected"],
                        "additionalProperties": False,
                    },
                ]
            },
        },
        "entry_point": {"type": "string", "minLength": 1},
        "meta": {"type": "object"},
    },
    "required": ["prompt"],
    "oneOf": [{"required": ["answer"]}, {"required": ["tests"]}],
    "additionalProperties": False,
}


def io_assertion(entry_point: str, pair: dict[str, Any]) -> str:
    """An input/output test as the assertion it stands for."""
    args = ", ".join(repr(a) for a in pair["args"])
    return f"assert {entry_point}({args}) == {pair['expected']!r}"


@dataclass(frozen=True)
class _Row:
    """One row of a task file as read, before any check."""

    number: int  # the line number (JSONL) or the 1-based row number (Parquet)
    where: str  # how errors name it: 'train.jsonl:4' or 'train.parquet: row 4'
    value: Any  # the parsed row, a dict unless the line is malformed
    # Parquet columns null in this row, left out of `value` (Parquet has no absent cell).
    nulls: tuple[str, ...] = ()


def _jsonl_rows(p: Path) -> Iterator[_Row]:
    """The non-blank lines of a JSONL file, parsed one by one, so an unparseable line is
    reported only after the lines before it have been checked."""
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        # Most likely a binary file, such as a Parquet file under another name.
        raise TaskFileError(f"{p}: not UTF-8 text ({e.reason} at byte {e.start}), so not "
                            "JSONL; a Parquet file's name must end in '.parquet'") from e
    # split("\n"), not splitlines(): U+2028 and friends are legal inside JSON strings.
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as e:
            raise TaskFileError(f"{p}:{lineno}: not valid JSON ({e.msg})") from e
        yield _Row(lineno, f"{p}:{lineno}", value)


def _parquet_rows(p: Path) -> Iterator[_Row]:
    """The rows of a Parquet file as plain Python dicts; a null cell is left out, so a row of a
    table with both `answer` and `tests` columns is the task its non-null cells describe."""
    # Imported here: pyarrow is slow to import, and JSONL suites never need it.
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        # A file object, not the path: pyarrow would read a str as a URI or a dataset directory.
        with p.open("rb") as f:
            rows = pq.read_table(f).to_pylist()  # Python objects, not numpy or Arrow scalars
    except (pa.ArrowException, OSError) as e:
        reason = re.sub(r"^Could not open Parquet input source '[^']*': ", "", str(e))
        raise TaskFileError(f"{p}: not a readable Parquet file ({reason})") from e
    for n, row in enumerate(rows, start=1):
        yield _Row(n, f"{p}: row {n}", {k: v for k, v in row.items() if v is not None},
                   tuple(k for k, v in row.items() if v is None))


def read_task_file(path: str | Path, fields: str = "rlcore") -> list[Task]:
    """Read a task file, Parquet if its name ends in `.parquet`, else JSONL, whose rows follow
    preset `fields` (`rlcore.tasks.fields`); the first malformed row raises TaskFileError
    naming the file, the line (JSONL) or row (Parquet) and the column."""
    p = Path(path)
    if not p.is_file():
        raise TaskFileError(f"task file '{p}' does not exist")
    preset = PRESETS[fields] if fields != "rlcore" else None
    validator = jsonschema.Draft202012Validator(
        TASK_LINE_SCHEMA if preset is None else preset_line_schema(preset))
    tasks: list[Task] = []
    seen: set[str] = set()
    rows = _parquet_rows(p) if p.suffix.lower() == ".parquet" else _jsonl_rows(p)
    for r in rows:
        row = r.value
        err = next(iter(validator.iter_errors(row)), None)
        if err is not None:
            missing = ([c for c in err.validator_value if c not in row]
                       if err.validator == "required" else [])
            if missing and missing[0] in r.nulls:
                msg = f"{missing[0]}: null, a missing value"
            elif err.validator == "oneOf":
                msg = "a task needs exactly one of 'answer' or 'tests'"
            else:
                # A whole-row error (a missing column, an extra one) has no column path.
                column = ".".join(map(str, err.absolute_path))
                msg = f"{column}: {err.message}" if column else err.message
                if preset is not None and err.validator == "required":
                    # The likeliest cause is a file of another shape: say what this preset
                    # reads.
                    msg += (f" (task.fields '{preset.name}' reads the prompt from "
                            f"'{preset.prompt}' and the answer from '{preset.answer}')")
            raise TaskFileError(f"{r.where}: {msg}")
        task_id = str(row.get("id", f"{p.stem}-{r.number}"))
        if task_id in seen:
            raise TaskFileError(f"{r.where}: duplicate task id '{task_id}'")
        seen.add(task_id)
        if preset is None:
            tasks.append(_rlcore_task(r.where, row, task_id))
        else:
            tasks.append(_preset_task(r.where, row, task_id, preset))
    if not tasks:
        raise TaskFileError(f"task file '{p}' holds no tasks")
    return tasks


def _rlcore_task(where: str, row: dict[str, Any], task_id: str) -> Task:
    """A schema-valid row of rlcore's own shape as a Task."""
    answer = row.get("answer")
    tests = row.get("tests")
    if tests is not None:
        if "entry_point" not in row:
            raise TaskFileError(f"{where}: a code task (one with 'tests') needs "
                                "'entry_point', the name of the function to test")
        tests = [t if isinstance(t, str) else io_assertion(row["entry_point"], t)
                 for t in tests]
    return Task(
        task_id=task_id,
        prompt=row["prompt"],
        answer=None if answer is None else str(answer),
        tests=tests,
        entry_point=row.get("entry_point"),
        meta=row.get("meta", {}),
    )


def _preset_task(where: str, row: dict[str, Any], task_id: str, preset: FieldPreset) -> Task:
    """A schema-valid row of a dataset preset as an answer Task; its other columns are meta."""
    try:
        answer = preset.extract(row[preset.answer])
    except FieldError as e:
        raise TaskFileError(f"{where}: {preset.answer}: {e}") from e
    meta = {k: v for k, v in row.items() if k not in ("id", preset.prompt, preset.answer)}
    return Task(task_id=task_id, prompt=row[preset.prompt], answer=answer, meta=meta)


def file_tasks(path: str | Path, cfg: TaskConfig) -> list[Task]:
    """A task file read with `task.fields`, each prompt put through `task.prompt_template`
    and given `task.system_prompt`: the tasks every runner, eval and replay see."""
    return [dataclasses.replace(t, prompt=cfg.prompt_template.format(prompt=t.prompt),
                                system=cfg.system_prompt)
            for t in read_task_file(path, cfg.fields)]


class JsonlSuite:
    """A user's tasks: one file for training, one for held-out evaluation."""

    name = "jsonl"

    def __init__(self, cfg: TaskConfig):
        assert cfg.train_path and cfg.heldout_path  # checked by config validation
        self._splits = {
            "train": file_tasks(cfg.train_path, cfg),
            "heldout": file_tasks(cfg.heldout_path, cfg),
        }
        overlap = {t.prompt for t in self._splits["train"]} & {
            t.prompt for t in self._splits["heldout"]
        }
        if overlap:
            raise TaskFileError(
                f"{len(overlap)} prompt(s) appear in both task.train_path and "
                f"task.heldout_path, e.g. {sorted(overlap)[0]!r}; the splits must be disjoint"
            )

    def split(self, name: str) -> list[Task]:
        return self._splits[name]


def load_suite(cfg: TaskConfig) -> TaskSuite:
    """The task suite named by the config (`rlcore.tasks.registry`); a split without tasks
    is refused here, not met as a prompt stream that never yields."""
    built: TaskSuite = SUITES.get(cfg.suite).load(cfg)
    for name in ("train", "heldout"):
        if not built.split(name):
            raise ConfigError(f"task.suite '{cfg.suite}' has no {name} tasks with these task "
                              "settings")
    return built
