"""An update's optimizer steps, as its statistics count them, and what they decide: whether
its commit applies (`commit_verdict`), in every runner and in a replay alike."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from rlcore.errors import UpdateFailed

# An update's optimizer steps, in its statistics: how many it took and how many of them the
# fp16 loss scaler skipped. The run counts the skipped ones (summary.json); updates.jsonl
# rows leave both out, so that a row has the same fields whatever the dtype.
STEPS, SKIPPED_STEPS = "optim/steps", "optim/skipped_steps"
STEP_KEYS = (STEPS, SKIPPED_STEPS)
# The reason recorded for the commit of an update that applied no optimizer step.
NO_STEP_APPLIED = ("no optimizer step applied: the fp16 loss scaler skipped every one "
                   "(their gradients overflowed)")
# Skipped steps in a row after which the scale is not what overflows: each skip halves it
# (from 2**16), so by then the gradients are not finite at any scale.
MAX_SKIPPED_STEPS = 64


def skipped_steps(stats: Mapping[str, float]) -> int:
    """The optimizer steps of an update that the loss scaler skipped (0 when not counted)."""
    return int(stats.get(SKIPPED_STEPS, 0))


def commit_verdict(stats: Mapping[str, float]) -> str | None:
    """Whether an update commits, from its statistics: None if it applied an optimizer step,
    else why its commit is skipped (the paper's §4.4: no version for an update that applied
    none). Raises UpdateFailed if it applied a step that was not finite. Statistics without
    step counts (the planner's updates, which train nothing) commit."""
    steps = stats.get(STEPS)
    if steps is not None and skipped_steps(stats) >= steps:
        return NO_STEP_APPLIED
    loss, norm = stats.get("loss", 0.0), stats.get("grad_norm", 0.0)
    if not (math.isfinite(loss) and math.isfinite(norm)):
        raise UpdateFailed(
            f"an update applied an optimizer step with a non-finite loss ({loss}) or "
            f"gradient norm ({norm}): the weights and the optimizer's moments are no longer "
            "finite (only the fp16 loss scaler skips such a step); lower train.lr")
    return None


def optimizer_step(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None
                   ) -> bool:
    """The optimizer step on the gradients just computed; False if the scaler skipped it."""
    if scaler is None:
        optimizer.step()
        return True
    scale = scaler.get_scale()
    scaler.step(optimizer)
    scaler.update()
    # update() backs the scale off exactly when step() found inf or NaN and skipped
    return scaler.get_scale() >= scale


def step_means(done: Sequence[tuple[Mapping[str, float], bool]]) -> dict[str, float]:
    """An update's statistics from each step's and whether it applied: their means over the
    steps applied (over every step when none was), and the step counts."""
    # A skipped step's gradient norm is not finite and describes no change to the weights.
    kept = [s for s, applied in done if applied] or [s for s, _ in done]
    totals: dict[str, float] = {}
    for step_stats in kept:
        for k, v in step_stats.items():
            totals[k] = totals.get(k, 0.0) + v / len(kept)
    totals[STEPS] = float(len(done))
    totals[SKIPPED_STEPS] = float(sum(not applied for _, applied in done))
    return totals


def check_skip_streak(in_a_row: int, scaler: torch.amp.GradScaler | None) -> None:
    """Refuse to go on once the scaler has skipped `MAX_SKIPPED_STEPS` steps in a row."""
    if in_a_row < MAX_SKIPPED_STEPS:
        return
    assert scaler is not None, "only the loss scaler skips a step"
    raise UpdateFailed(
        f"the fp16 loss scaler has skipped the last {in_a_row} optimizer steps: their "
        f"gradients are not finite at any scale (it fell to {scaler.get_scale():g}), so no "
        "update can commit; set model.dtype: fp32, or lower train.lr")
