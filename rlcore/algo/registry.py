"""The objectives by name: each is one registration, and everything else that names
objectives (the config's allowed values and its reference, the pipeline's schema check and
wildcards, the figures' colours, the planner's proximal recompute) reads them from here.

An objective is a pure loss `(Inputs, Knobs) -> (loss, LossStats)` (objectives.py holds the
built-in ones), named here as "module:function" so that reading the registry imports no
torch (the config reads it, and torch must not be imported before the kernels are pinned).
Code outside rlcore adds one with `register(Objective(...))` in a module that a package's
`rlcore.objectives` entry point names (docs/extending.md): every process imports those
modules at its first lookup.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from importlib.metadata import entry_points
from typing import Any

from rlcore.errors import ConfigError

ENTRY_POINTS = "rlcore.objectives"  # modules that register objectives when imported
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
        return _resolve(self.loss)


@cache
def _resolve(ref: str) -> Callable[..., Any]:
    module, _, name = ref.partition(":")
    fn = getattr(importlib.import_module(module), name, None)
    if not callable(fn):
        raise ConfigError(f"objective loss {ref!r}: {module} has no function {name!r}")
    return fn


_REGISTERED: dict[str, Objective] = {}
_plugins_loaded = False


def register(objective: Objective) -> Objective:
    """Add an objective under its name (a name another objective holds is refused)."""
    name = objective.name
    if not (name[:1].isalpha() and name.islower() and name.replace("_", "").isalnum()):
        raise ValueError(f"objective name {name!r}: lower-case letters, digits and _, "
                         "starting with a letter (it names run directories)")
    unknown = set(objective.corrections) - set(CORRECTIONS)
    if unknown:
        raise ValueError(f"objective {name!r}: unknown corrections {sorted(unknown)}; "
                         f"known: {', '.join(CORRECTIONS)}")
    held = _REGISTERED.get(name)
    if held is not None and held != objective:
        raise ValueError(f"objective {name!r} is registered already")
    _REGISTERED[name] = objective
    return objective


def unregister(name: str) -> None:
    """Remove a registration (a test's or an interactive session's own; built-ins stay)."""
    if name in BUILT_IN:
        raise ValueError(f"objective {name!r} is built in")
    _REGISTERED.pop(name, None)


def _load_plugins() -> None:
    """Import the modules the `rlcore.objectives` entry points name, once per process."""
    global _plugins_loaded
    if not _plugins_loaded:
        _plugins_loaded = True
        for ep in entry_points(group=ENTRY_POINTS):
            ep.load()


def names() -> tuple[str, ...]:
    """Every registered objective's name, the built-in ones first."""
    _load_plugins()
    return tuple(_REGISTERED)


def objective(name: str) -> Objective:
    """The objective registered as `name`; a ConfigError lists those there are."""
    _load_plugins()
    try:
        return _REGISTERED[name]
    except KeyError:
        raise ConfigError(f"train.objective {name!r} is not a registered objective; "
                          f"registered: {', '.join(_REGISTERED)} (docs/extending.md)") from None


def described() -> str:
    """`name: help` of every objective, for the config reference."""
    return "; ".join(f"{n}: {objective(n).help}" for n in names())


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
BUILT_IN = frozenset(_REGISTERED)
