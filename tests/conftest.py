"""Shared fixtures: a tiny base model built once per test session, and small configs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlcore.kernels import take_intel_mkl_paths

take_intel_mkl_paths()  # before torch is imported (rlcore/kernels.py)

import torch  # noqa: E402

from rlcore.config import RunConfig, config_from_dict  # noqa: E402
from rlcore.kernels import pin  # noqa: E402
from rlcore.policy.tiny import build_base  # noqa: E402

# Before any test computes: the session runs on the kernels a run pins by default, so that
# numbers compared across tests (and against tests/golden/) are those of any x86-64 host.
pin(config_from_dict({}))

# Small and quick: enough steps to produce answers of the right shape, not to be good.
FAST_BASE = {"warm_start_steps": 60, "warm_start_label_noise": 0.5}


def small_config(model_path: str | Path, **sections: Any) -> dict[str, Any]:
    """A config dict for short test runs; keyword arguments replace or extend sections."""
    data: dict[str, Any] = {
        "seed": 0,
        "model": {"path": str(model_path)},
        "task": {"max_operand": 9, "heldout_size": 30},
        "rollout": {"max_new_tokens": 5, "chunk_tokens": 2, "group_size": 4},
        "train": {"updates": 4, "update_batch_size": 8},
        "eval": {"heldout_tasks": 30, "samples_per_task": 2},
        "runtime": {"progress_every": 0},
        "base": FAST_BASE,
    }
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values} if isinstance(values, dict) else values
    return data


def small_pipeline_config() -> dict[str, Any]:
    """A pipeline config of two runs (sync, AReaL-style at K 1), two replays and three claims."""
    return {
        "run": small_config("models/tiny"),
        "build_base": True,
        "grid": {"seeds": [0], "blocks": [
            {"modes": ["sync"], "presets": ["none"], "ks": [0], "objectives": ["pg"]},
            {"modes": ["areal"], "presets": ["paper"], "ks": [1], "objectives": ["pg"]}],
            "replays": {"of": {"modes": ["areal"], "presets": ["paper"], "ks": [1],
                               "objectives": ["pg"]},
                        "objectives": ["pg", "decoupled"]}},
        "presets": {"none": {},
                     "paper": {"staleness": {"staleness_control": "filter",
                                             "interrupt": "resubmit"}}},
        "figures": {"trace": {"preset": "paper", "k": 1, "objective": "pg", "seed": 0},
                    "window_s": [0.0, 0.5], "k_axis": {"mode": "areal", "preset": "paper"}},
        "claims": [
            {"id": "T1", "statement": "AReaL-style beats sync", "source": "a test",
             "metric": "heldout_pass_rate", "expect": "positive", "pairing": "none",
             "contrast": {"wall/areal/paper/k1/pg": 1, "wall/sync/none/k0/pg": -1}},
            {"id": "T2", "statement": "decoupled beats pg on pg's schedule", "source": "a test",
             "metric": "heldout_pass_rate", "expect": "positive", "pairing": "seed",
             "contrast": {"wall/areal/paper/k1/pg/decoupled": 1, "wall/areal/paper/k1/pg": -1}},
            {"id": "T3", "statement": "long problems are trained less", "source": "a test",
             "metric": "short_bias", "expect": "negative", "pairing": "seed",
             "contrast": {"wall/areal/paper/k1/pg": 1}},
        ],
        "reported": {"T1": {"figure": "a 0.1 gain", "differs": "a smaller model"}},
        "sesoi": {"heldout_pass_rate": {"delta": 0.02, "relative": False, "reason": "a test"},
                  "short_bias": {"delta": 0.05, "relative": False, "reason": "a test"}},
    }


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2 char model, saved with save_pretrained, shared by the whole session."""
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("models") / "tiny"
    build_base(out, config_from_dict(small_config("unused")))
    return out


@pytest.fixture
def cfg(tiny_model_dir: Path) -> RunConfig:
    return config_from_dict(small_config(tiny_model_dir))


@pytest.fixture(scope="session")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`small_pipeline_config`'s grid run once with the default profile, and its report; the
    workflow tests read it, and the Slurm test compares its own run with it."""
    from tests.snakemake_run import snakemake, write_config

    workdir = tmp_path_factory.mktemp("pipeline")
    write_config(workdir, small_pipeline_config())
    result = snakemake(workdir)
    assert result.returncode == 0, result.stderr[-3000:]
    result = snakemake(workdir, "--report", "results/report.html")
    assert result.returncode == 0, result.stderr[-3000:]
    return workdir
