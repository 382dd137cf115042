"""A verification replay's checks: every replayed value against the original run's.

Without a tolerance the first difference stops the replay (`Divergence`, naming the sample
or update and both values); with one, differences are measured instead (`max_divergence`).
"""

from __future__ import annotations

from typing import Any

from rlcore.policy.optim_steps import NO_STEP_APPLIED, UpdateFailed, commit_verdict
from rlcore.policy.sampler import Generation
from rlcore.record.schedule import Commit, Divergence, GenerationRecord, ScheduleError
from rlcore.replay.inputs import Original


class Verifier:
    """Compares a replay with the run it replays, as the replay computes."""

    def __init__(self, original: Original, tolerance: float | None):
        self.original, self.tolerance = original, tolerance
        self.max_divergence: dict[str, float] = {"logprob_sum": 0.0, "loss": 0.0,
                                                 "token_mismatches": 0.0}

    def _diverged(self, event: str, recorded: Any, replayed: Any) -> None:
        raise Divergence(f"replay diverged at {event}: recorded {recorded}, replayed {replayed}")

    def _compare(self, event: str, quantity: str, recorded: float, replayed: float) -> None:
        if recorded == replayed:
            return
        if self.tolerance is None:
            self._diverged(event, repr(recorded), repr(replayed))
        self.max_divergence[quantity] = max(self.max_divergence[quantity],
                                            abs(recorded - replayed))

    def chunks(self, rec: GenerationRecord, ran: int) -> None:
        """A generation batch ran as many chunks as the run's did."""
        if ran != rec.chunks:
            self._diverged(f"generation (record {rec.seq}) ran {ran} chunks",
                           f"{rec.chunks} chunks", f"{ran} chunks")

    def sample(self, key: tuple[int, int], g: Generation, result: dict[str, Any]) -> None:
        """An emitted sample's tokens, versions, log-probability sum and reward."""
        fate = self.original.schedule.sample(*key)
        assert fate is not None
        row = self.original.samples[fate.sample_id]
        event = f"sample {fate.sample_id} (slot {key[0]}, attempt {key[1]})"
        if row["response_ids"] != g.response_ids:
            if self.tolerance is None:
                self._diverged(f"{event} tokens", row["response_ids"], g.response_ids)
            self.max_divergence["token_mismatches"] += 1
            return
        versions = (min(g.versions), max(g.versions)) if g.versions else None
        if g.versions and versions != (row["policy_version"], row["policy_version_max"]):
            self._diverged(f"{event} policy versions", (row["policy_version"],
                                                        row["policy_version_max"]), versions)
        self._compare(f"{event} logprob_sum", "logprob_sum", row["logprob_sum"],
                      sum(g.logprobs))
        if (row["reward"], row["pass"]) != (result["reward"], result["pass"]):
            why = "a code test at its time limit?"
            if "harness_error" in row:
                why = f"the run's harness failed: {row['harness_error']}"
            elif "harness_error" in result:
                why = f"the harness failed here: {result['harness_error']}"
            self._diverged(f"{event} reward ({why})",
                           (row["reward"], row["pass"]), (result["reward"], result["pass"]))

    def loss(self, commit: Commit, loss: float) -> None:
        """An applied update's loss."""
        recorded = self.original.updates[commit.version]["loss"]
        self._compare(f"update {commit.version} (batch {commit.batch_id}) loss", "loss",
                      recorded, loss)


def check_held(commit: Commit, stats: dict[str, float]) -> None:
    """The replay's own update of a batch agrees with the schedule's verdict on it wherever
    that verdict was the update's (applied, or skipped for applying no optimizer step); a
    ScheduleError otherwise, since the versions the schedule names would not be these."""
    batch = f"batch {commit.batch_id}"
    try:
        skip = commit_verdict(stats)
    except UpdateFailed as e:
        raise ScheduleError(f"the update of {batch} is not finite here, so the run would have "
                            f"stopped at it: the schedule cannot be held (choose gentler "
                            f"train settings): {e}") from None
    if commit.outcome == "applied" and skip is not None:
        raise ScheduleError(f"the run applied the update of {batch} (making version "
                            f"{commit.version}), but here it applied none of its optimizer "
                            f"steps ({skip}): the schedule cannot be held")
    if commit.outcome == "skipped" and commit.reason == NO_STEP_APPLIED and skip is None:
        raise ScheduleError(f"the run skipped the commit of {batch} ({NO_STEP_APPLIED}), but "
                            "here its update applied an optimizer step: the schedule cannot "
                            "be held (the run's loss scaler decided it: replay it with its "
                            "model.dtype on its device, under its train settings)")
