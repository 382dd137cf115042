"""What a role computed, in the sizes a hardware profile prices (`profile.py`).

A role reports each computation to its clock (`clock.py`) as one of these. The wall clock
ignores them, since the computation took the time it took; the virtual clock
(`virtual.py`) charges their price to the role that did them. Each is linear in its
fields, so the work of several calls adds up field by field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


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
    """One training update: forward, backward and optimizer step over every minibatch."""

    tokens: int  # rows x padded width, summed over minibatches


@dataclass(frozen=True)
class Weights:
    """A copy of the whole trainable state: a trainer writing its candidate, or a worker
    reading the published version."""

    direction: Literal["write", "read"]
    nbytes: int


@dataclass(frozen=True)
class Reward:
    """Scoring one response."""

    kind: Literal["last_integer", "exact", "math", "code"]  # reward.verifier


@dataclass(frozen=True)
class Handle:
    """The controller handling one message: its samples scored, filtered and buffered."""

    samples: int


@dataclass(frozen=True)
class Commit:
    """The parameter service deciding one commit (the version bump, not the weight copy)."""


Work = Decode | Prefill | Update | Weights | Reward | Handle | Commit
