"""Messages between the roles of the asynchronous runtime.

Plain picklable dataclasses: the same messages travel through `multiprocessing` queues (the
AReaL-style runtime) and `queue.Queue` (the threaded baseline). Weights never travel here;
they move through the parameter service's shared slots.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from rlcore.policy.train_batch import TrainBatch
from rlcore.record.schedule import GenerationRecord, TrainerOp


@dataclass(frozen=True)
class PromptSlot:
    """One sample to generate: a prompt of a group, on its `attempt`-th try (0 = first)."""

    slot_id: int
    group_id: int
    prompt: str
    attempt: int = 0
    system: str | None = None  # the task's system message (task.system_prompt)


@dataclass
class SampleMsg:
    """A finished generation (rollout -> controller)."""

    slot: PromptSlot
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    versions: list[int]  # policy version of every token
    finished: bool
    text: str  # decoded by the rollout worker, which holds the tokenizer
    worker: str
    t_emit: float


@dataclass
class InterruptedMsg:
    """A generation abandoned at a chunk boundary because the policy moved (resubmit)."""

    slot: PromptSlot
    tokens: int  # tokens sampled in the abandoned attempt
    old_version: int
    new_version: int
    worker: str
    t: float


@dataclass
class RolloutBatch:
    """Everything one generation batch produced, in one message (rollout -> controller).

    One message per batch rather than per sample: on a small machine the controller's
    unpickling competes with the workers for the same cores.
    """

    worker: str
    generation: GenerationRecord | None = None  # how the batch ran, for the schedule
    samples: list[SampleMsg] = field(default_factory=list)
    interrupted: list[InterruptedMsg] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)


@dataclass
class TrainRequest:
    """A batch for one update (controller -> trainer)."""

    batch_id: int
    base_version: int  # the version the controller expects the update to start from
    batch: TrainBatch


@dataclass(frozen=True)
class CommitRequest:
    """A candidate state written into `slot` (trainer -> parameter service), with the update's
    statistics, which the service passes on to the controller with its verdict."""

    trainer: int
    batch_id: int
    slot: int
    base_version: int
    # The update applied an optimizer step (the paper's `updated`, from `commit_verdict`);
    # the service skips the commit of one that did not.
    updated: bool
    stats: dict[str, float] = field(default_factory=dict)
    t_start: float = 0.0  # the run's clock when the trainer started the update
    t_sent: float = 0.0  # ... and when it sent this request
    ops: tuple[TrainerOp, ...] = ()  # the trainer's steps since its last report
    work: dict[str, float] = field(default_factory=dict)  # what the update computed
    digest: str | None = None  # the candidate's `state_digest`, where slots carry digests


@dataclass(frozen=True)
class CommitAck:
    """The parameter service's verdict (-> trainer)."""

    applied: bool
    version: int  # the global version after the decision
    next_slot: int  # the slot the trainer writes its next candidate into
    t: float  # when the decision was made (the run's clock)
    reason: str = ""


@dataclass
class UpdateDone:
    """An update attempt finished, applied or skipped (-> controller): from the parameter
    service for every commit it decides, from the trainer for an update it never proposed."""

    trainer: int
    batch_id: int
    applied: bool
    version: int
    base_version: int  # the version the update was computed from
    reason: str
    stats: dict[str, float]
    t_commit: float  # when the commit was decided (or the trainer gave the update up)
    t_start: float  # when the trainer started the update: its busy span is t_start..t_commit
    commit_s: float | None = None  # the service's decision time; None: never proposed
    ops: tuple[TrainerOp, ...] = ()  # the trainer's steps since its last report
    work: dict[str, float] = field(default_factory=dict)  # what the update computed


@dataclass
class Event:
    """A timestamped record for events.jsonl (any role -> controller)."""

    type: str
    t: float
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass
class RewardsReady:
    """Wakes the controller: the reward pool finished scoring some samples."""


@dataclass
class Ready:
    """A worker has loaded its model (the ready barrier)."""

    worker: str
    pid: int
    device: str
    load_s: float
    # the cores the creating thread may run on, as the kernel reports them
    cpus: list[int] = field(default_factory=lambda: sorted(os.sched_getaffinity(0)))


@dataclass
class WorkerError:
    """A worker raised; the run must fail with this traceback."""

    worker: str
    traceback: str


@dataclass
class Stopped:
    """A worker has left its loop (rollout workers report their token counts)."""

    worker: str
    tokens_sampled: int = 0
    tokens_reprefilled: int = 0
    tokens_kv_kept: int = 0  # response tokens whose KV cache keep_kv kept, not re-prefilled
    tokens_abandoned: int = 0  # partial generations cut off by the end of the run
    cpu_s: float = 0.0  # CPU its own process used since the start (0 for a thread)
    gpu_peak_bytes: int | None = None  # its process's allocator peak on its device (policy.device)
