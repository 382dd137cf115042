"""What a role computed, in the sizes a hardware profile prices (`profile.py`).

A role reports each computation to its clock (`clock.py`) as one of these. The wall clock
ignores them, since the computation took the time it took; the virtual clock
(`virtual.py`) charges their price to the role that did them. Each is linear in its
fields, so the work of several calls adds up field by field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rlcore.config.task import Verifier


@dataclass(frozen=True)
class Decode:
    """Decoding steps of one generation batch: each a forward pass over one new token per
    row against a KV cache of `context` positions."""

    steps: int  # sampling steps
    rows: int  # sum over forward passes of the batch's rows (finished rows still count)
    row_context: int  # sum over forward passes of rows x KV-cache length


@dataclass(frozen=True)
class Prefill:
    """Forward passes over whole sequences without a gradient: a (re)prefill, or the
    proximal policy's recomputed log-probabilities."""

    calls: int
    tokens: int  # rows x padded width, summed over calls


@dataclass(frozen=True)
class Update:
    """One training update: forward, backward and optimizer step over every minibatch;
    `frozen_base`: of low-rank adapters only (train.lora), which a profile prices apart."""

    tokens: int  # rows x padded width, summed over minibatches
    frozen_base: bool = False


@dataclass(frozen=True)
class Adapters:
    """Low-rank adapters applied unmerged in a generation batch's decode forward passes
    (train.lora): two rank-r products per target per row, beside the `Decode` they add to."""

    steps: int  # decode forward passes
    rows: int  # sum over those passes of the batch's rows, as in `Decode`
    params: int  # the adapters' elements a row multiplies: rank x (in + out) over targets


@dataclass(frozen=True)
class Weights:
    """A copy of the whole trainable state: a trainer writing its candidate, or a worker
    reading the published version."""

    direction: Literal["write", "read"]
    nbytes: int


@dataclass(frozen=True)
class AllReduce:
    """A data-parallel trainer's ranks summing their gradients, once per optimizer step: a
    ring all-reduce, in which each rank sends and receives 2 (M - 1) / M of the bytes."""

    calls: int  # optimizer steps
    nbytes: int  # the trainable state's gradients
    ranks: int

    def ring_gb(self) -> float:
        """Gigabytes each rank moves over all the calls."""
        return self.calls * 2 * (self.ranks - 1) / self.ranks * self.nbytes / 1e9


@dataclass(frozen=True)
class Digest:
    """A sha256 of the state a version hands over (train.lora's adapters): the trainer's of
    its candidate, or a reader's of what it loaded, checked on arrival."""

    nbytes: int


@dataclass(frozen=True)
class Reward:
    """Scoring one response."""

    kind: Verifier  # reward.verifier


@dataclass(frozen=True)
class Handle:
    """The controller handling one message: its samples scored, filtered and buffered."""

    samples: int


@dataclass(frozen=True)
class Handoff:
    """A rollout worker handing a finished batch over: its samples' messages built (their
    responses decoded to text), pickled and written to the controller's pipe."""

    samples: int


@dataclass(frozen=True)
class Commit:
    """The parameter service deciding one commit (the version bump, not the weight copy)."""


Work = (Decode | Prefill | Update | AllReduce | Adapters | Weights | Digest | Reward | Handle
        | Handoff | Commit)


def terms(work: Work) -> dict[str, float]:
    """The profile coefficients that price `work` ('SECTION.FIELD', as in a profile file),
    each with the quantity it multiplies; a copy's bandwidth term is 'SECTION.per_gb', the
    gigabytes (1e9 bytes) copied, priced at 1 / gb_per_s, and an all-reduce's
    'allreduce.per_ring_gb', the gigabytes each rank moves. What `rlcore calibrate
    --from-runs` regresses a span's seconds on."""
    match work:
        case Decode():
            return {"decode.step_s": work.steps, "decode.per_row_s": work.rows,
                    "decode.per_row_context_s": work.row_context}
        case Prefill():
            return {"prefill.call_s": work.calls, "prefill.per_token_s": work.tokens}
        case Update():
            section = "lora_update" if work.frozen_base else "update"
            return {f"{section}.call_s": 1, f"{section}.per_token_s": work.tokens}
        case AllReduce():
            return {"allreduce.call_s": work.calls, "allreduce.per_ring_gb": work.ring_gb()}
        case Adapters():
            return {"adapters.call_s": work.steps, "adapters.per_param_s": work.rows * work.params}
        case Weights():
            section = "weight_write" if work.direction == "write" else "weight_read"
            return {f"{section}.call_s": 1, f"{section}.per_gb": work.nbytes / 1e9}
        case Digest():
            return {"sha256.call_s": 1, "sha256.per_gb": work.nbytes / 1e9}
        case Reward():
            kind = {"code": "code_s", "math": "math_s"}.get(work.kind, "answer_s")
            return {f"reward.{kind}": 1}
        case Handle():
            return {"controller.message_s": 1, "controller.per_sample_s": work.samples}
        case Handoff():
            return {"handoff.call_s": 1, "handoff.per_sample_s": work.samples}
        case Commit():
            return {"commit.call_s": 1}
    raise TypeError(f"no cost term for {work!r}")


class WorkTally:
    """The work a role reported since it last took the tally, summed term by term: what a
    busy span of it computed (its `work` in events.jsonl)."""

    def __init__(self) -> None:
        self._sums: dict[str, float] = {}

    def add(self, work: Work) -> None:
        for key, quantity in terms(work).items():
            self._sums[key] = self._sums.get(key, 0) + quantity

    def take(self) -> dict[str, float]:
        """The sums since the last take, in sorted order, and a fresh start."""
        out = {k: self._sums[k] for k in sorted(self._sums)}
        self._sums = {}
        return out
