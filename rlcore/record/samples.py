"""A sample of samples.jsonl: open while its fate is undecided, then its one final row.

`RunLedger` (`rlcore/record/ledger.py`) opens and settles samples; this module holds their
shape, the row's fields and their order for every status (docs/metrics.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlcore.policy.sampler import Generation
from rlcore.tasks.prompts import Prompt


@dataclass
class OpenSample:
    """A scored sample whose fate is not decided yet (its row is not written)."""

    prompt: Prompt
    gen: Generation
    scored: dict[str, Any]
    arrival_version: int
    staleness_at_arrival: int
    slot: int
    attempt: int
    worker: str
    t_emit: float


def sample_row(sample_id: int, prompt: Prompt, *, slot: int, attempt: int, worker: str,
               policy_version: int, policy_version_max: int, current_version: int,
               staleness: int | None, staleness_at_arrival: int | None, status: str,
               batch_id: int | None, advantage: float | None, scored: dict[str, Any],
               response_ids: list[int] | None,
               response_tokens: int, finished: bool, logprob_sum: float | None,
               t_emit: float) -> dict[str, Any]:
    """One line of samples.jsonl: its fields and their order, for every status."""
    return {
        "sample_id": sample_id,
        "task_id": prompt.task.task_id,
        # the task's own length, whatever was sampled: the prompt audit's axis (C8)
        "answer_chars": None if prompt.task.answer is None else len(prompt.task.answer),
        "group_id": prompt.group_id,
        "slot": slot,
        "attempt": attempt,
        "worker": worker,
        "policy_version": policy_version,
        "policy_version_max": policy_version_max,
        "current_version": current_version,
        "staleness": staleness,
        "staleness_at_arrival": staleness_at_arrival,
        "status": status,
        "batch_id": batch_id,
        "advantage": advantage,
        "reward": scored["reward"],
        "pass": scored["pass"],
        "response": scored["response"],
        "response_ids": response_ids,
        "response_tokens": response_tokens,
        "finished": finished,
        "logprob_sum": logprob_sum,
        # code tasks: how many tests passed, and the first failure (None when all passed);
        # math: why math-verify reached no verdict (the answer scored 0); any task: what the
        # harness raised instead of judging the response
        **{k: scored[k] for k in ("tests_passed", "error", "verify_error", "harness_error")
           if k in scored},
        "t_emit": t_emit,
    }
