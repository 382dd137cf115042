"""docs/extending.md, done: an objective added from outside rlcore is one function and one
registration, and a run trains with it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlcore.algo.objectives import Inputs, Knobs, LossStats, pg
from rlcore.algo.registry import Objective, names, objective, register, unregister
from rlcore.config import ConfigError, config_from_dict
from rlcore.runners import run_mode
from tests.conftest import small_config

CALLS: list[float] = []


def half_pg(x: Inputs, k: Knobs) -> tuple[torch.Tensor, LossStats]:
    """A toy objective: half of the plain policy gradient."""
    loss, stats = pg(x, k)
    CALLS.append(float(loss.detach()))
    return 0.5 * loss, stats


TOY = Objective("half_pg", "half of pg (a test)", f"{__name__}:half_pg")


@pytest.fixture
def toy():
    register(TOY)
    try:
        yield TOY
    finally:
        unregister(TOY.name)


def test_a_registered_objective_is_allowed_and_described(toy: Objective):
    assert names()[-1] == "half_pg" and objective("half_pg") is toy
    cfg = config_from_dict({"train": {"objective": "half_pg"}})
    assert cfg.train.objective == "half_pg"


def test_an_unregistered_objective_is_refused_with_the_registered_ones():
    with pytest.raises(ConfigError, match="allowed values: pg, behav_clip, decoupled, a3po"):
        config_from_dict({"train": {"objective": "half_pg"}})


def test_a_correction_the_objective_does_not_take_is_refused(toy: Objective):
    with pytest.raises(ConfigError, match="train.dual_clip .* choose behav_clip, decoupled or "
                                          "a3po"):
        config_from_dict({"train": {"objective": "half_pg", "dual_clip": 3.0}})


@pytest.mark.slow
def test_a_sync_run_trains_with_an_objective_registered_outside_rlcore(
        toy: Objective, tiny_model_dir: Path, tmp_path: Path):
    CALLS.clear()
    cfg = config_from_dict(small_config(tiny_model_dir, train={"objective": "half_pg",
                                                               "updates": 3}))
    summary = run_mode(cfg, tmp_path / "run")
    assert summary["objective"] == "half_pg" and summary["run"]["objective"] == "half_pg"
    assert len(CALLS) == 3  # one minibatch an update
    assert summary["updates"] == 3


def test_names_are_checked_at_registration():
    with pytest.raises(ValueError, match="lower-case"):
        register(Objective("Half", "h", f"{__name__}:half_pg"))
    with pytest.raises(ValueError, match="unknown corrections"):
        register(Objective("h2", "h", f"{__name__}:half_pg", corrections=frozenset({"x"})))
    with pytest.raises(ValueError, match="registered already"):
        register(Objective("pg", "another", f"{__name__}:half_pg"))
