"""The run config's sections on what a run learns from and how it is scored: the task suite
(`TaskConfig`), the reward (`RewardConfig`) and the held-out evaluation (`EvalConfig`).
`RunConfig` (`run.py`) holds them beside the model, sampling, training and runtime sections."""

from __future__ import annotations

import dataclasses
from typing import Literal

from rlcore.config.schema import field as _f
from rlcore.tasks.registry import SUITES


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    suite: str = _f(
        "arith", lambda: f"Task suite: {SUITES.described()}.", enum=SUITES.names,
    )
    split_seed: int = _f(
        1234, "Seed of task generation and of the train/held-out split (shared by all runs).",
        minimum=0,
    )
    max_operand: int = _f(
        29, "arith, chain: operands are drawn from 0..max_operand.", minimum=1, maximum=10**6
    )
    operators: tuple[Literal["+", "-", "*"], ...] = _f(
        ("+",), "arith: operators to use; '-' keeps results non-negative.", minItems=1,
        uniqueItems=True,
    )
    heldout_size: int = _f(
        300, "arith, chain: number of distinct problems held out from training.", minimum=1
    )
    min_terms: int = _f(2, "chain: fewest operands in a problem.", minimum=2, maximum=20)
    max_terms: int = _f(
        5, "chain: most operands; the count is uniform in [min_terms, max_terms].",
        minimum=2, maximum=20,
    )
    train_size: int = _f(
        3000, "chain: number of distinct training problems (generated from split_seed).",
        minimum=1,
    )
    arith_form: Literal["symbolic", "words"] = _f(
        "symbolic", "arith: prompts as '3+4=' (symbolic, for the tiny model) or as a question "
        "in words (for instruct models)."
    )
    train_path: str | None = _f(
        None, "jsonl: file of training tasks, one JSON object a line, or Parquet if the name "
        "ends in .parquet."
    )
    heldout_path: str | None = _f(
        None, "jsonl: file of held-out tasks, one JSON object a line, or Parquet if the name "
        "ends in .parquet."
    )
    fields: Literal["rlcore", "gsm8k", "math"] = _f(
        "rlcore", "jsonl: which columns hold the prompt and the answer (docs/tasks.md): rlcore "
        "(prompt, answer or code-task fields), gsm8k (question; answer's '#### N' tail), "
        "math (problem; the last \\boxed{...} of solution)."
    )
    prompt_template: str = _f(
        "{prompt}", "jsonl: the prompt each task is given, a format string whose one field is "
        "{prompt}, the file's prompt; write literal braces as {{ }}.", minLength=1,
    )
    system_prompt: str | None = _f(
        None, "jsonl, model.prompt_format chat: a system message before every prompt; null: "
        "none (the chat template's own default, if it has one).", minLength=1,
    )


# How a response is judged (rlcore.tasks.reward.evaluate_response).
Verifier = Literal["last_integer", "stated", "exact", "math", "code"]


@dataclasses.dataclass(frozen=True)
class RewardConfig:
    verifier: Verifier = _f(
        "last_integer", "How a response is judged (docs/tasks.md): last_integer (the last "
        "integer in it equals the answer; a non-integer answer must equal the whole response), "
        "stated (the integer it states as its answer, alone or right after its first '=', "
        "'equals' or 'answer is', equals the answer), "
        "exact (the stripped response equals the answer), math (math-verify: the response's "
        "boxed or last answer is equivalent to the answer; in worker processes), code (the "
        "task's tests against the response's code, in the sandbox).",
    )
    timeout_sec: float = _f(
        5.0, "Wall-clock limit of one reward evaluation (code and math): past it the response "
        "scores 0 and is counted.", exclusiveMinimum=0,
    )
    workers: int = _f(
        2, "Code and math: evaluations running at once (sandboxes, or math-verify worker "
        "processes), off the controller's path.", minimum=1, maximum=64,
    )
    verifier_memory_mb: int = _f(
        2048, "math: address-space limit of a math-verify worker; an answer that needs more "
        "scores 0.", minimum=256,
    )
    sandbox_isolation: Literal["auto", "namespaces", "rlimits"] = _f(
        "auto", "Code tasks: namespaces (fail if unavailable), rlimits (resource limits "
        "only), or auto (the strongest that works here; recorded in config.json).",
    )
    sandbox_python: str | None = _f(
        None, "Code tasks: interpreter for the sandbox (default: this one, else the system "
        "python3 when the sandbox user cannot run this one)."
    )
    sandbox_memory_mb: int = _f(256, "Code tasks: address-space limit.", minimum=32)
    sandbox_max_processes: int = _f(
        16, "Code tasks: processes the sandbox user may have (bounds fork bombs).", minimum=1
    )
    sandbox_file_size_kb: int = _f(1024, "Code tasks: largest file it may write.", minimum=0)
    sandbox_open_files: int = _f(32, "Code tasks: open file descriptors.", minimum=8)
    sandbox_output_kb: int = _f(
        64, "Code tasks: stdout+stderr read; a response printing more is cut off.", minimum=1
    )
    max_harness_errors: int = _f(
        0, "Harness failures (the harness raising, e.g. a sandbox that cannot start; not a "
        "response failing its tests) tolerated, each sample scored 0; one more stops the run. "
        "0: the first stops it.", minimum=0,
    )


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    heldout_tasks: int = _f(
        300, "Held-out tasks scored by `rlcore eval` (all of the split if it is smaller).",
        minimum=1,
    )
    samples_per_task: int = _f(
        4, "Sampled responses per held-out task for the sampled pass rate.", minimum=1
    )
    batch_size: int = _f(64, "Prompts per generation batch during evaluation.", minimum=1)
    threshold: float = _f(
        0.5, "Pass-rate level for time-to-threshold (paper Figure 3).", minimum=0, maximum=1
    )
    window: int = _f(
        5, "Updates in the moving average of the training pass rate.", minimum=1
    )
