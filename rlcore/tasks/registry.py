"""The task suites by name: each is one registration, and everything else that names suites
(the config's allowed values and its reference, the checks of task files) reads them here.

A suite is a class or function `(TaskConfig) -> TaskSuite` (suites.py holds the built-in
ones), named as "module:attribute" (`rlcore.registry`), so the config can read this module
without importing the suites. Code outside rlcore adds one with `register(Suite(...))` in a
module that a package's `rlcore.suites` entry point names (docs/extending.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlcore.registry import Registry, resolve


@dataclass(frozen=True)
class Suite:
    """A task suite and what it reads."""

    name: str
    help: str  # one line: where its tasks come from
    build: str  # "module:attribute", called with the TaskConfig; returns a TaskSuite
    # Reads task.train_path and task.heldout_path (with task.fields, prompt_template and
    # system_prompt); a generated suite writes its own prompts and refuses those settings.
    reads_files: bool = False

    def load(self, task_cfg: Any) -> Any:
        """The suite itself, built from the config's `task` section."""
        return resolve(self.build)(task_cfg)


SUITES: Registry[Suite] = Registry("task suite", "task.suite", "rlcore.suites")
register = SUITES.register
unregister = SUITES.unregister
names = SUITES.names

register(Suite("arith", "generated arithmetic, 'a+b=' answered by the sum",
               "rlcore.tasks.suites:ArithSuite"))
register(Suite("chain", "sums of several operands answered step by step, 'a+b=c;c+d=e'",
               "rlcore.tasks.suites:ChainSuite"))
register(Suite("jsonl", "a user's task files, JSONL or Parquet (docs/tasks.md)",
               "rlcore.tasks.suites:JsonlSuite", reads_files=True))
SUITES.seal()
