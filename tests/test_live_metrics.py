"""Live metrics (`runtime.tensorboard`): the scalars of each update and of the final eval,
read back with the tensorboard package's own reader."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rlcore.config import config_from_dict
from rlcore.evaluation import EVAL_SEED, evaluate_run
from rlcore.record.live_metrics import TB_DIR, eval_scalars, update_scalars
from rlcore.runners import run_mode
from tests.conftest import small_config


def test_update_scalars_by_hand():
    row = {"version": 3, "batch_id": 2, "sample_ids": [4, 5], "reward_mean": 0.5,
           "pass_rate": 0.5, "staleness_max": 1, "loss": -0.25, "loss/clip_frac": 0.125,
           "time/update_s": 0.04, "t_commit": 1.5, "finite": True}
    assert update_scalars(row) == {"train/reward_mean": 0.5, "train/pass_rate": 0.5,
                                   "train/staleness_max": 1.0, "train/loss": -0.25,
                                   "loss/clip_frac": 0.125, "time/update_s": 0.04}
    assert eval_scalars({"greedy_pass_rate": 0.75, "sampled_pass_rate": 0.5, "tasks": 30}) == \
        {"eval/greedy_pass_rate": 0.75, "eval/sampled_pass_rate": 0.5}


def read_scalars(log_dir: Path) -> dict[str, list]:
    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: acc.Scalars(tag) for tag in acc.Tags()["scalars"]}


@pytest.mark.parametrize("mode", ["sync", "areal"])
def test_a_run_writes_what_tensorboard_reads_back(tiny_model_dir: Path, tmp_path: Path,
                                                  mode: str):
    cfg = config_from_dict(small_config(tiny_model_dir, mode=mode,
                                        runtime={"progress_every": 0, "tensorboard": True}))
    t_start = time.time()
    out = tmp_path / "run"
    run_mode(cfg, out)
    assert (out / TB_DIR).is_dir() and not (out / f"{TB_DIR}.partial").exists()
    updates = [json.loads(line) for line in (out / "updates.jsonl").read_text().splitlines()]
    scalars = read_scalars(out / TB_DIR)
    for tag, key in [("train/pass_rate", "pass_rate"), ("train/loss", "loss"),
                     ("train/staleness_mean", "staleness_mean"), ("policy/entropy",
                                                                   "policy/entropy")]:
        events = scalars[tag]
        assert [e.step for e in events] == [u["version"] for u in updates]
        assert [e.value for e in events] == pytest.approx([u[key] for u in updates], rel=1e-6)
    walls = [e.wall_time for e in scalars["train/loss"]]
    assert walls == sorted(walls) and t_start <= walls[0] and walls[-1] <= time.time()

    result, _ = evaluate_run(out, "final", seed=EVAL_SEED)
    scalars = read_scalars(out / TB_DIR)
    (greedy,) = scalars["eval/greedy_pass_rate"]
    assert greedy.step == len(updates) and greedy.value == pytest.approx(
        result["greedy_pass_rate"])


def test_off_by_default(tiny_model_dir: Path, tmp_path: Path):
    cfg = config_from_dict(small_config(tiny_model_dir))
    run_mode(cfg, tmp_path / "run")
    evaluate_run(tmp_path / "run", "final", seed=EVAL_SEED)
    assert not list((tmp_path / "run").glob(f"{TB_DIR}*"))
