"""What the planner's roles send each other (the live roles' messages, reduced to what
scheduling reads), and what a plan counts."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlcore.runners.asynchronous.messages import PromptSlot


@dataclass
class PlanSample:
    """A finished attempt, as a rollout message carries it."""

    slot: PromptSlot
    prompt_tokens: int
    tokens: int
    finished: bool
    version: int  # of its oldest token


@dataclass
class PlanCut:
    """An attempt interrupted by a new version (`interrupt: resubmit`)."""

    slot: PromptSlot
    tokens: int


@dataclass
class PlanBatch:
    samples: list[PlanSample] = field(default_factory=list)
    cuts: list[PlanCut] = field(default_factory=list)


@dataclass
class PlanTrain:
    batch_id: int
    oldest: int  # the oldest version of any sample in the batch
    tokens: int  # rows x padded width, summed over minibatches (`work.py::Update`)
    prefill_tokens: int  # the decoupled objective's proximal recompute (0: none)


@dataclass
class PlanCommit:
    trainer: int
    batch_id: int
    base_version: int


@dataclass
class PlanVerdict:
    trainer: int
    batch_id: int
    applied: bool
    base_version: int
    t: float


@dataclass
class Tally:
    """What a plan counts: the numbers of summary.json that timing decides."""

    accepted: list[int] = field(default_factory=list)  # staleness of each accepted sample
    dropped_stale: int = 0
    dropped_interrupted: int = 0
    resubmissions: int = 0
    skipped_commits: int = 0
    tokens_sampled: int = 0
    tokens_trained: int = 0
    tokens_reprefilled: int = 0
    busy_s: dict[str, float] = field(default_factory=dict)  # priced seconds per role
