"""`rlcore bench`'s overlap figures: the speed-up over sync and the three factors of its
efficiency, on summaries worked by hand."""

from __future__ import annotations

import random

import pytest

from rlcore.measure.bench import overlap


def summary(updates: int, wall: float, rollout: float, trainer: float,
            controller: float = 0.0) -> dict:
    return {"updates": updates, "time": {"wall_s": wall, "rollout_busy_s": rollout,
                                         "trainer_busy_s": trainer,
                                         "controller_busy_s": controller}}


def test_overlap_figures_worked_by_hand():
    # sync: T_gen = 7 + 1 = 8 s, T_train = 9 s, 1 s outside both: ideal 17 / 9
    sync = summary(400, 18.0, rollout=7.0, trainer=9.0, controller=1.0)
    # the overlapped run: 12 s, the trainer its busiest role at 10.8 s
    run = summary(400, 12.0, rollout=10.0, trainer=10.8)
    f = overlap(sync, run)
    assert f["ideal_ratio"] == pytest.approx(17 / 9)
    assert f["ratio_to_sync"] == pytest.approx(1.5)
    assert f["overlap_efficiency"] == pytest.approx(1.5 * 9 / 17)
    assert f["pipeline_efficiency"] == pytest.approx(0.9)  # 10.8 of 12 s busy
    assert f["work_efficiency"] == pytest.approx(9 / 10.8)  # 9 s of sync's training took 10.8
    assert f["sync_overhead"] == pytest.approx(18 / 17)
    assert f["rollout_busy_vs_sync"] == pytest.approx(10 / 7)
    assert f["trainer_busy_vs_sync"] == pytest.approx(1.2)


def test_a_rollout_bound_run_is_judged_by_its_rollout():
    sync = summary(100, 10.0, rollout=6.0, trainer=4.0)
    run = summary(100, 8.0, rollout=7.5, trainer=5.0)
    f = overlap(sync, run)
    assert f["pipeline_efficiency"] == pytest.approx(7.5 / 8.0)
    assert f["work_efficiency"] == pytest.approx(6.0 / 7.5)


def test_the_three_factors_multiply_to_the_efficiency():
    rng = random.Random(0)
    for _ in range(200):
        sync = summary(rng.randint(1, 500), rng.uniform(5, 30), rng.uniform(1, 10),
                       rng.uniform(1, 10), rng.uniform(0, 2))
        run = summary(rng.randint(1, 500), rng.uniform(5, 30), rng.uniform(1, 10),
                      rng.uniform(1, 10))
        f = overlap(sync, run)
        product = f["pipeline_efficiency"] * f["work_efficiency"] * f["sync_overhead"]
        assert product == pytest.approx(f["overlap_efficiency"], rel=1e-12)


def test_the_weight_sync_figures_price_a_lora_hand_over_with_its_digests():
    """Adapters carry their digest, published and checked on arrival; full weights do not."""
    import torch

    from rlcore.measure.bench import bench_weight_sync

    state = {"a": torch.ones(4, 8), "b": torch.zeros(16, 4)}
    full = bench_weight_sync(state, reps=2)
    lora = bench_weight_sync(state, reps=2, digests=True)
    assert full["bytes"] == lora["bytes"] == (32 + 64) * 4
    assert full["digest_s"] == full["check_s"] == 0.0
    assert lora["digest_s"] > 0 and lora["check_s"] > 0
    steps = ("write_s", "digest_s", "commit_s", "reload_s", "check_s")
    assert lora["per_version_s"] == pytest.approx(sum(lora[k] for k in steps))
