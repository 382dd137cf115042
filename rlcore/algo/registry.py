"""The objectives by name: each is one registration, and everything else that names
objectives (the config's allowed values and its reference, the pipeline's schema check and
wildcards, the figures' colours, the planner's proximal recompute) reads them from here.

An objective is a pure loss `(Inputs, Knobs) -> (loss, LossStats)` (objectives.py holds the
built-in ones), named here as "module:function" (`rlcore.registry`). Code outside rlcore adds
one with `register(Objective(...))` in a module that a package's `rlcore.objectives` entry
point names (docs/extending.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlcore.registry import Registry, resolve

# The train settings that correct a clipped ratio or a behaviour weight
# (objectives.py::Correction): an objective takes those it names in `corrections`, and a
# config that sets another is refused.
CORRECTIONS = ("clip_eps_high", "dual_clip", "behav_weight_cap")


@dataclass(frozen=True)
class Objective:
    """A loss and what running it needs."""

    name: str
    help: str  # one line: what it optimises, and its source
    loss: str  # "module:function", a function (Inputs, Knobs) -> (loss, LossStats)
    needs_prox: bool = False  # recompute the proximal log-probs before the update's steps
    corrections: frozenset[str] = frozenset()  # of CORRECTIONS, the ones it takes

    def loss_fn(self) -> Callable[..., Any]:
        """The loss function itself (imported at first use)."""
        return resolve(self.loss)


OBJECTIVES: Registry[Objective] = Registry("objective", "train.objective", "rlcore.objectives")


def register(objective: Objective) -> Objective:
    """Add an objective under its name (a name another objective holds is refused)."""
    unknown = set(objective.corrections) - set(CORRECTIONS)
    if unknown:
        raise ValueError(f"objective {objective.name!r}: unknown corrections "
                         f"{sorted(unknown)}; known: {', '.join(CORRECTIONS)}")
    return OBJECTIVES.register(objective)


unregister = OBJECTIVES.unregister
names = OBJECTIVES.names
objective = OBJECTIVES.get
described = OBJECTIVES.described

ALL = frozenset(CORRECTIONS)
register(Objective("pg", "plain policy gradient (paper decoupled_objective=0)",
                   "rlcore.algo.objectives:pg"))
register(Objective("behav_clip", "clipped ratio vs behaviour log-probs + k3 KL (paper =1)",
                   "rlcore.algo.objectives:behav_clip",
                   corrections=frozenset({"clip_eps_high", "dual_clip"})))
register(Objective("decoupled", "AReaL eq. 3", "rlcore.algo.objectives:decoupled",
                   needs_prox=True, corrections=ALL))
register(Objective("a3po", "decoupled with A-3PO's loglinear proximal policy (no extra "
                   "forward)", "rlcore.algo.objectives:a3po", corrections=ALL))
OBJECTIVES.seal()
