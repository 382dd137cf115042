"""A data-parallel trainer (rlcore/policy/data_parallel.py): how a batch is split over ranks,
why weighting each rank's loss by its tokens makes the sum the whole batch's loss, and an
update of two gloo ranks against one rank's update of the same batch."""

from __future__ import annotations

import json
import multiprocessing as mp
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from rlcore.algo.batching import shard_groups, token_share
from rlcore.algo.objectives import Inputs, Knobs
from rlcore.algo.registry import names, objective
from rlcore.config import config_from_dict
from rlcore.policy.data_parallel import RankGroup
from rlcore.policy.train_batch import TrainBatch
from tests.conftest import small_config

JOIN_S = 120  # each rank process: start, load the tiny model, one update, save


class TestShardGroups:
    def test_largest_group_first_to_the_lightest_rank(self):
        # groups 0..3 weigh 10, 2, 3, 4 tokens: 0 -> rank 0; 3, 2, 1 -> rank 1 (4, 7, 9 < 10)
        assert shard_groups([0, 0, 1, 1, 2, 3], [5, 5, 1, 1, 3, 4], 2) == [
            [0, 1], [2, 3, 4, 5]]

    def test_groups_stay_whole_and_every_sample_has_one_rank(self):
        rng = random.Random(0)
        ids = [g for g in range(9) for _ in range(rng.randint(1, 4))]
        tokens = [rng.randint(1, 30) for _ in ids]
        shards = shard_groups(ids, tokens, 3)
        assert sorted(i for s in shards for i in s) == list(range(len(ids)))
        for s in shards:
            assert s and s == sorted(s)
            for g in {ids[i] for i in s}:
                assert {i for i, x in enumerate(ids) if x == g} <= set(s)

    def test_a_group_a_rank_at_least(self):
        assert shard_groups([0, 0, 1], [1, 1, 1], 2) == [[0, 1], [2]]
        with pytest.raises(ValueError, match="2 groups cannot give each of 3 ranks one"):
            shard_groups([0, 0, 1], [1, 1, 1], 3)

    def test_token_share(self):
        assert token_share([0, 2], [3, 1, 1, 5]) == 0.4


@pytest.mark.parametrize("name", names())
def test_weighted_shares_sum_to_the_whole_batch_loss(name: str):
    """Every objective is a mean over the batch's response tokens, so the shares' losses,
    each weighted by its tokens, sum to the whole batch's: what makes summed gradients
    of the ranks one rank's."""
    g = torch.Generator().manual_seed(0)
    rows, width = 6, 5
    lengths = [5, 2, 4, 1, 3, 5]
    mask = torch.tensor([[1.0] * n + [0.0] * (width - n) for n in lengths])
    logp = -torch.rand(rows, width, generator=g) * mask
    behav = (logp - 0.3 * torch.rand(rows, width, generator=g)) * mask
    prox = (logp - 0.1 * torch.rand(rows, width, generator=g)) * mask
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, -1.0])[:, None].expand_as(mask)
    stale = torch.tensor([[0.0], [1.0], [2.0], [0.0], [1.0], [3.0]]).expand_as(mask) * mask
    loss_fn = objective(name).loss_fn()
    knobs = Knobs(0.2, 0.05)

    def loss(idx: list[int]) -> torch.Tensor:
        return loss_fn(Inputs(logp[idx], behav[idx], prox[idx], adv[idx], mask[idx],
                              stale[idx]), knobs)[0]

    whole = loss(list(range(rows)))
    shards = [[0, 1, 4], [2, 3, 5]]
    summed = sum(token_share(s, lengths) * loss(s) for s in shards)
    assert float(summed) == pytest.approx(float(whole), rel=1e-6, abs=1e-7)


def a_batch(seed: int = 0) -> TrainBatch:
    """Four groups of two samples, responses of 1 to 5 tokens, on the tiny model's vocab."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, 20) for _ in range(rng.randint(3, 6))] for _ in range(8)]
    responses = [[rng.randrange(3, 20) for _ in range(rng.randint(1, 5))] for _ in range(8)]
    return TrainBatch(prompts, responses, [[-1.0] * len(r) for r in responses],
                      [[0] * len(r) for r in responses],
                      [rng.choice([-1.0, 1.0]) for _ in responses],
                      group_ids=[i // 2 for i in range(8)])


def update_once(model_dir: str, lora: bool, objective_name: str, rank: int = 0,
                world: int = 1, rendezvous: str | None = None) -> dict[str, torch.Tensor]:
    """The trainable state after one update of `a_batch` (as rank `rank` of `world`)."""
    from rlcore.policy.hf_policy import HFPolicy

    torch.manual_seed(0)
    torch.set_num_threads(1)
    train: dict[str, Any] = {"objective": objective_name, "minibatches": 2}
    if lora:
        train["lora"] = {"rank": 4}
    cfg = config_from_dict(small_config(model_dir, train=train,
                                        model={"rollout_device": "cpu",
                                               "trainer_device": "cpu"}))
    policy = HFPolicy(cfg.model, cfg.train, role="trainer")
    if world > 1:
        assert rendezvous is not None
        policy.ranks = RankGroup(Path(rendezvous), rank, world, timeout_s=60)
    try:
        before = policy.export_state()
        policy.update(a_batch(), temperature=1.0, current_version=1)
        after = policy.export_state()
        # how far the update moved the weights: what a rank's difference is measured against
        after["moved"] = torch.tensor(max(float((after[n] - before[n]).abs().max())
                                          for n in before))
        # the last step's gradients, summed over the ranks (what every rank applied)
        for n, p in policy.model.named_parameters():
            if p.grad is not None:
                after[f"grad/{n}"] = p.grad.detach().clone()
        return after
    finally:
        if policy.ranks is not None:
            policy.ranks.close()


def _rank(model_dir: str, lora: bool, objective_name: str, rank: int, world: int,
          rendezvous: str, out: str) -> None:
    torch.save(update_once(model_dir, lora, objective_name, rank, world, rendezvous), out)


@pytest.mark.parametrize(("lora", "objective_name"), [(False, "pg"), (True, "pg"),
                                                       (False, "decoupled")],
                         ids=["full-pg", "lora-pg", "full-decoupled"])
def test_two_ranks_update_as_one_rank_does(tiny_model_dir: Path, tmp_path: Path, lora: bool,
                                           objective_name: str):
    ctx = mp.get_context("spawn")
    rendezvous = tmp_path / "rendezvous"
    outs = [tmp_path / f"rank{r}.pt" for r in range(2)]
    procs = [ctx.Process(target=_rank, args=(str(tiny_model_dir), lora, objective_name, r, 2,
                                             str(rendezvous), str(outs[r])))
             for r in range(2)]
    for p in procs:
        p.start()
    one = update_once(str(tiny_model_dir), lora, objective_name)
    for p in procs:
        p.join(JOIN_S)
        if p.is_alive():
            p.kill()
    assert [p.exitcode for p in procs] == [0, 0]
    ranks = [torch.load(o) for o in outs]
    # the ranks applied the same summed gradients: equal bit for bit
    assert all(torch.equal(ranks[0][n], ranks[1][n]) for n in one if n != "moved")
    # the summed gradients are one rank's up to the order of the sums
    grads = [n for n in one if n.startswith("grad/")]
    assert grads
    scale = max(float(one[n].abs().max()) for n in grads)
    assert max(float((ranks[0][n] - one[n]).abs().max()) for n in grads) < 1e-5 * scale
    # and so are the weights: Adam's first steps divide each gradient by its own size, so
    # a rounding difference in one near zero moves its weight by up to a share of lr
    moved = float(one.pop("moved"))
    diff = max(float((ranks[0][n] - one[n]).abs().max()) for n in one if n not in grads)
    assert moved > 1e-5 and diff < 1e-2 * moved, (diff, moved)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_a_live_run_of_two_rollout_workers_and_two_ranks(tiny_model_dir: Path, tmp_path: Path,
                                                         lora: bool):
    """AReaL-style with two rollout workers and a trainer of two gloo ranks: it ends, every
    trained token within the bound, every group trained whole in one batch, the ranks equal
    at the end (each run checks it), and under LoRA every version's digest checked by each
    of its readers on arrival (a run whose adapter did not arrive fails)."""
    from rlcore.runners.asynchronous.runtime import run_async
    from rlcore.runners.asynchronous.vehicles import Processes

    train: dict[str, Any] = {"updates": 6, "update_batch_size": 16}
    if lora:
        train["lora"] = {"rank": 4}
    k = 1
    cfg = config_from_dict(small_config(
        tiny_model_dir, mode="areal", train=train,
        staleness={"staleness_k": k, "staleness_control": "both", "interrupt": "continue"},
        model={"rollout_device": "cpu", "trainer_device": "cpu"},
        runtime={"rollout_workers": 2, "trainer_ranks": 2, "collective_timeout_s": 30}))
    out = tmp_path / "run"
    summary = run_async(cfg, out, force=False, vehicle=Processes())
    assert summary["updates"] == 6
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    ready = {e["worker"] for e in events if e["type"] == "worker_ready"}
    assert ready == {"param_service", "rollout0", "rollout1", "trainer0", "trainer0_rank1"}
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    trained = [s for s in samples if s["status"] == "accepted" and s["batch_id"] is not None]
    assert trained and all(s["staleness"] <= k for s in trained)
    assert {s["worker"] for s in samples} == {"rollout0", "rollout1"}
    batch_of: dict[int, set[int]] = {}
    for s in trained:
        batch_of.setdefault(s["group_id"], set()).add(s["batch_id"])
    assert all(len(b) == 1 for b in batch_of.values())
    # a replay trains in one process: not bit for bit, and a verification says so
    from rlcore.errors import ConfigError
    from rlcore.replay.replayer import replay_run

    with pytest.raises(ConfigError, match="its trainer had 2 data-parallel ranks"):
        replay_run(out, tmp_path / "replay")


def test_the_virtual_clock_prices_ranks_and_computes_their_update_whole(tiny_model_dir: Path,
                                                                        tmp_path: Path):
    """On the virtual clock a trainer of M ranks is one process: it computes the update
    whole (the ranks' up to the order of sums) and is charged the slowest rank's tokens and
    a ring all-reduce per step. Twice the same run: the same records."""
    import yaml
    from safetensors.torch import load_file

    from rlcore.clock.profile import load_profile
    from tests.test_virtual_clock import RUN_PROFILE, records, run_mode, virtual_config

    cfg = virtual_config(tiny_model_dir, tmp_path, "areal", 2)
    (tmp_path / "test-run.yaml").write_text(yaml.safe_dump(
        {**RUN_PROFILE, "allreduce": {"call_s": 2e-3, "gb_per_s": 1.0, "gil_share": 0.0}}))
    ranks = config_from_dict({**cfg.to_dict(), "runtime": {
        **cfg.to_dict()["runtime"], "trainer_ranks": 2}})
    spans = []
    for name in ("first", "second"):
        run_mode(ranks, tmp_path / name)
        events = [json.loads(line) for line in
                  (tmp_path / name / "events.jsonl").read_text().splitlines()]
        spans.append([e["work"] for e in events
                      if e["type"] == "span" and e["role"] == "trainer"
                      and "update.per_token_s" in e["work"]])
    assert records(tmp_path / "first") == records(tmp_path / "second")
    work = spans[0]
    assert work and all(w["allreduce.call_s"] == 1 for w in work)  # one optimizer step
    # 2 (M - 1) / M = 1 times the trainable bytes: the tiny model's fp32 weights (the test
    # profile prices the run's own model)
    assert load_profile(str(tmp_path / "test-run.yaml")).model_bytes is None
    trainable = 4 * sum(t.numel() for t in
                        load_file(str(tiny_model_dir / "model.safetensors")).values())
    assert all(w["allreduce.per_ring_gb"] == pytest.approx(trainable / 1e9) for w in work)
    # the slowest of two ranks trains about half the batch's padded tokens
    run_mode(cfg, tmp_path / "one")
    events = [json.loads(line) for line in
              (tmp_path / "one" / "events.jsonl").read_text().splitlines()]
    whole = sum(e["work"]["update.per_token_s"] for e in events
                if e["type"] == "span" and "update.per_token_s" in e.get("work", {}))
    assert sum(w["update.per_token_s"] for w in work) < 0.8 * whole


def test_a_profile_without_an_allreduce_cannot_price_ranks(tiny_model_dir: Path,
                                                          tmp_path: Path):
    from rlcore.errors import ConfigError
    from tests.test_virtual_clock import run_mode, virtual_config

    cfg = virtual_config(tiny_model_dir, tmp_path, "areal", 2)
    ranks = config_from_dict({**cfg.to_dict(), "runtime": {
        **cfg.to_dict()["runtime"], "trainer_ranks": 2}})
    with pytest.raises(ConfigError, match="prices no gradient sum between ranks"):
        run_mode(ranks, tmp_path / "run")


@pytest.mark.slow
def test_calibrate_times_two_gloo_ranks_summing(tiny_model_dir: Path):
    """`rlcore calibrate`'s all-reduce term: two rank processes sum the trainable state's
    float32 gradients at three sizes; the fit's terms are a call's seconds and GB/s."""
    from rlcore.measure.copy_timings import time_allreduce

    cfg = config_from_dict(small_config(tiny_model_dir, model={"trainer_device": "cpu"}))
    fit = time_allreduce(cfg, reps=1)
    assert fit is not None and fit.n == 3 * 3
    assert all(c >= 0 for c in fit.coef) and sum(fit.coef) > 0
