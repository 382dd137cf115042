"""The planner (`rlcore plan`): length distributions by hand, the model-free sampler's
prices by hand, and the planner's roles against the live roles on the virtual clock: given
the lengths a virtual run sampled, a plan must make that run's decisions exactly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlcore.algo.batching import slowest_rank_tokens
from rlcore.cli import main
from rlcore.clock.profile import profile_from_dict
from rlcore.clock.work import Decode, Prefill, Work
from rlcore.config import config_from_dict
from rlcore.errors import ConfigError
from rlcore.plan.lengths import Lengths, empirical, fitted, geometric
from rlcore.plan.planner import SPLIT, pick, plan, plan_sync, splits, workload
from rlcore.plan.sampler import LengthPolicy, LengthSampler
from rlcore.policy.sampler import Draws
from rlcore.record.schedule import ScheduleLog
from rlcore.record.timing import run_timing, stale_drop_rate, total_variation
from rlcore.runners import run_mode
from rlcore.tasks.suites import Task
from tests.test_virtual_clock import RUN_PROFILE, virtual_config


def write_samples(run: Path, rows: list[dict[str, Any]]) -> Path:
    run.mkdir(parents=True, exist_ok=True)
    (run / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def row(slot: int, attempt: int, tokens: int, finished: bool, status: str = "accepted"
        ) -> dict[str, Any]:
    return {"slot": slot, "attempt": attempt, "response_tokens": tokens, "finished": finished,
            "status": status}


class TestLengths:
    def test_geometric_fit_by_hand(self):
        # max 2 tokens: P(1) = p, P(2, finished) = p(1-p), P(2, cut) = (1-p)^2;
        # mean = p + 2(1-p) = 2 - p, so a mean of 1.5 needs p = 0.5
        g = geometric(1.5, 2, "test")
        dist = dict(zip(g.values, (w / sum(g.weights) for w in g.weights), strict=True))
        assert dist == pytest.approx({(1, True): 0.5, (2, True): 0.25, (2, False): 0.25})
        assert g.mean == pytest.approx(1.5)

    def test_a_mean_outside_the_cap_is_refused(self):
        with pytest.raises(ConfigError, match="outside 1..4"):
            geometric(5, 4, "test")

    def test_empirical_leaves_out_interrupted_attempts(self, tmp_path: Path):
        run = write_samples(tmp_path, [row(0, 0, 3, True), row(1, 0, 3, True),
                                       row(2, 0, 6, False), row(3, 0, 1, False,
                                                                "dropped_interrupted")])
        e = empirical(run)
        assert dict(zip(e.values, e.weights, strict=True)) == {(3, True): 2.0, (6, False): 1.0}
        assert e.mean == pytest.approx(4.0)
        assert fitted(run, 6).mean == pytest.approx(4.0, abs=1e-6)

    def test_draws_are_a_function_of_seed_slot_and_attempt(self):
        g = geometric(3, 8, "test")
        draws = [g.draw(0, s, a) for s in range(50) for a in range(2)]
        assert draws == [g.draw(0, s, a) for s in range(50) for a in range(2)]
        assert len(set(draws)) > 3  # and they vary

    def test_as_recorded_draws_each_recorded_attempt_as_it_was(self, tmp_path: Path):
        run = write_samples(tmp_path, [row(5, 1, 2, True), row(6, 0, 4, False)])
        # one batch of version 0: slot 7's first attempt was cut after the first chunk
        log = ScheduleLog()
        log.add("generate", worker="rollout0", rows=[[5, 1, 0], [6, 0, 1], [7, 0, 1]],
                version=0, chunks=1, swaps=[], cut_after=1, cut=[2], cut_reason="stop")
        (run / "schedule.jsonl").write_text("\n".join(log.lines()) + "\n")
        e = empirical(run, as_recorded=True)
        assert e.draw(0, 5, 1) == (2, True) and e.draw(123, 6, 0) == (4, False)
        capped = e.capped(3)  # a cap below a recorded length cuts it, unfinished
        assert capped.draw(0, 6, 0) == (3, False) and capped.values == ((2, True), (3, False))
        # the cut attempt runs on to the cap (where the plan's cut stops it); it is not
        # among the lengths drawn for the attempts the run never made
        assert capped.draw(0, 7, 0) == (3, False) and e.draw(0, 7, 0)[0] > 10**9
        (run / "schedule.jsonl").unlink()
        with pytest.raises(ConfigError, match="--as-recorded .* no schedule.jsonl"):
            empirical(run, as_recorded=True)

    def test_per_task_draws_each_task_from_its_own_lengths(self, tmp_path: Path):
        rows = [{**row(0, 0, 2, True), "task_id": "short"},
                {**row(1, 0, 3, True), "task_id": "short"},
                {**row(2, 0, 9, False), "task_id": "long"}]
        e = empirical(write_samples(tmp_path, rows), per_task=True)
        assert e.by_task == {"short": ((2, True), (3, True)), "long": ((9, False),)}
        # every attempt at `long` is long, whatever its slot or attempt; a task the run never
        # sampled is drawn from all three
        assert {e.draw(0, s, a, "long") for s in range(20) for a in range(3)} == {(9, False)}
        assert {e.draw(0, s, 0, "short") for s in range(20)} == {(2, True), (3, True)}
        assert {e.draw(0, s, 0, "other") for s in range(50)} == {(2, True), (3, True),
                                                                  (9, False)}
        assert e.capped(4).by_task["long"] == ((4, False),)
        assert empirical(tmp_path).by_task == {}  # pooled unless asked

    def test_a_run_without_samples_is_named(self, tmp_path: Path):
        with pytest.raises(ConfigError, match="no samples.jsonl"):
            empirical(tmp_path)
        (tmp_path / "samples.jsonl").write_text('{"slot": 0}\n')
        with pytest.raises(ConfigError, match="line 1"):
            empirical(tmp_path)

    def test_no_weight_is_refused(self):
        with pytest.raises(ValueError, match="no values"):
            Lengths("x", (), ())


class TestLengthSampler:
    def test_prices_by_hand(self):
        charged: list[Work] = []
        # prompts of 3 and 5 tokens (left-padded to 5); row 0 stops after 1 token, row 1
        # runs to the cap of 3
        s = LengthSampler(charged.append, [[0] * 3, [0] * 5], [(1, True), (3, False)], 3)
        assert charged == [Prefill(calls=1, tokens=10)]
        # step 1: both rows sample; forward over 2 rows x (5 + 1) positions. Step 2: row 1
        # only; forward over 2 rows x 7 positions
        assert s.step(2) == 3
        assert charged[-1] == Decode(steps=2, rows=4, row_context=26)
        assert s.finished(0) and not s.finished(1) and not s.done
        # step 3 reaches the cap: no forward pass after the last token
        assert s.step(2) == 1
        assert charged[-1] == Decode(steps=1, rows=0, row_context=0)
        assert s.done and s.length(0) == 1 and s.length(1) == 3 and not s.finished(1)
        assert s.step(2) == 0  # done: nothing more is charged
        s.reprefill(1)
        assert charged[-1] == Prefill(calls=1, tokens=2 * (5 + 3))

    @pytest.mark.parametrize("interrupt,want", [
        # continue: the re-prefill recomputes the logits, so the very next token is new
        ("continue", [3, 3, 5, 5, 5]),
        # keep_kv: the next token still comes from the old weights' logits
        ("keep_kv", [3, 3, 3, 5, 5]),
    ])
    def test_each_token_keeps_the_version_that_computed_it(self, interrupt: str,
                                                           want: list[int]):
        s = LengthSampler(lambda w: None, [[0]], [(5, True)], 8, version=3)
        s.step(2)
        (s.reprefill if interrupt == "continue" else s.keep_cache)(5)
        s.step(4)
        [g] = s.gens
        assert (g.versions, g.finished, len(g.response_ids)) == (want, True, 5)

    def test_the_stand_in_policy_draws_each_prompt_from_its_task(self):
        tasks = [Task("a", "2+2", "4"), Task("b", "3+3", "6")]
        lengths = Lengths("test", ((1, True), (6, False)), (1.0, 1.0),
                          by_task={"a": ((1, True),), "b": ((6, False),)})
        policy = LengthPolicy(lambda w: None, tasks, {"2+2": 3, "3+3": 2}, lengths, 0)
        ids = [policy.encode_prompt("3+3"), policy.encode_prompt("2+2")]
        assert [len(i) for i in ids] == [2, 3]
        s = policy.sampler(ids, max_new_tokens=6, temperature=1.0,
                           draws=Draws(0, [(0, 0), (1, 0)]))
        s.step(6)
        assert [(len(g.response_ids), g.finished) for g in s.gens] == [(6, False), (1, True)]

    def test_update_tokens_split_like_the_policy(self):
        # 5 rows in 2 minibatches: rows 0-1 and 2-4, each padded to its own longest row
        assert slowest_rank_tokens([4, 9, 2, 3, 7], 2) == 2 * 9 + 3 * 7
        assert slowest_rank_tokens([4, 9, 2], 1) == 3 * 9

    def test_ranks_wait_for_the_one_with_the_most(self):
        # 6 rows, groups of 2, one minibatch over 2 ranks: groups by response tokens 7, 3, 5
        # -> group 0 to rank 0, group 2 then group 1 to rank 1 (5 < 7, then 8): rank 0 has
        # rows 0-1 padded to 9, rank 1 rows 2-5 padded to 8
        lengths, responses = [9, 6, 4, 5, 8, 3], [4, 3, 1, 2, 3, 2]
        assert slowest_rank_tokens(lengths, 1, 2, [0, 0, 1, 1, 2, 2], responses) == \
            max(2 * 9, 4 * 8)
        assert slowest_rank_tokens(lengths, 1) == 6 * 9


class TestTiming:
    def test_figures_by_hand(self):
        assert stale_drop_rate(20, 3, 2) == 0.25
        assert total_variation({"0": 1, "1": 3}, {"1": 1}) == pytest.approx(0.25)
        assert total_variation({"2": 5}, {"2": 1}) == 0.0


# The decode step (s) of the test profile per case, so that every case makes the decisions
# it is there for (checked below): fast rollout for `filter` (samples go stale, two trainers
# race), slower rollout under the throttle (it waits for admission, yet versions still change
# mid-generation).
def decode_step_s(control: str, trainers: int) -> float:
    if control == "filter":
        return 2e-3
    return 1.2e-2 if trainers == 1 else 1e-2


CASES = [(mode, interrupt, control, trainers, None)
         for mode in ("async", "areal") for interrupt in ("resubmit", "continue", "keep_kv")
         for control in ("filter", "throttle", "both") for trainers in (1, 2)] + \
    [(mode, interrupt, "filter", 1, 1.5)
     for mode in ("async", "areal") for interrupt in ("resubmit", "continue", "keep_kv")]


@pytest.mark.slow
@pytest.mark.parametrize("mode,interrupt,control,trainers,ratio", CASES)
def test_a_plan_with_the_runs_lengths_makes_the_runs_decisions(
        tiny_model_dir: Path, tmp_path: Path, mode: str, interrupt: str, control: str,
        trainers: int, ratio: float | None):
    """Given the lengths a virtual run sampled (and, for the attempts it cut, that they ran
    until the cut), the planner's roles must make every decision the live roles made, at the
    same virtual times."""
    profile = {**RUN_PROFILE,
               "decode": {**RUN_PROFILE["decode"], "step_s": decode_step_s(control, trainers)}}
    (tmp_path / "profile.yaml").write_text(yaml.safe_dump(profile))
    base = virtual_config(tiny_model_dir, tmp_path, mode, 1, interrupt=interrupt,
                          staleness_control=control, rollout_train_ratio=ratio).to_dict()
    cfg = config_from_dict({**base, "train": {**base["train"], "updates": 12},
                            "runtime": {**base["runtime"], "trainer_workers": trainers,
                                        "hardware": str(tmp_path / "profile.yaml")}})
    summary = run_mode(cfg, tmp_path / "run")
    s, sched, tokens = summary["samples"], summary["scheduling"], summary["tokens"]
    waits = sched["waits"]
    # each case exercises the decisions it is there for
    if control == "filter":
        assert s["dropped_stale"] > 0
    if control in ("throttle", "both"):
        assert waits["rollout_throttle_s"] > 0
    cut = s["resubmissions"] + s["dropped_interrupted"]
    assert (cut, tokens["reprefilled"], tokens["kv_kept"])[
        ("resubmit", "continue", "keep_kv").index(interrupt)] > 0
    if trainers == 2:
        assert sched["skipped_commits"] > 0  # the trainers raced and one lost
    if ratio is not None:
        assert waits["trainer_ratio_s"] + waits["rollout_ratio_s"] > 0
    p = plan(cfg, workload(cfg, empirical(tmp_path / "run", as_recorded=True)))
    measured = run_timing(summary, json.loads((tmp_path / "run/staleness.json").read_text()))
    assert (p["wall_s"], p["staleness"]) == (measured["wall_s"], measured["staleness"])
    assert p["samples"] == {k: s[k] for k in p["samples"]}
    assert (p["tokens_trained"], p["tokens_reprefilled"], p["skipped_commits"]) == \
        (tokens["trained"], tokens["reprefilled"], sched["skipped_commits"])
    assert p["waits"] == waits


@pytest.mark.parametrize("interrupt", ["resubmit", "continue"])
def test_a_plan_of_trainer_ranks_makes_the_runs_decisions(tiny_model_dir: Path, tmp_path: Path,
                                                          interrupt: str):
    """A trainer of two ranks, priced as its slowest rank and a gradient sum per step: the
    planner's trainer and the virtual run's charge the same, so every decision and time
    agree."""
    profile = {**RUN_PROFILE, "allreduce": {"call_s": 1e-3, "gb_per_s": 2.0, "gil_share": 0}}
    (tmp_path / "profile.yaml").write_text(yaml.safe_dump(profile))
    base = virtual_config(tiny_model_dir, tmp_path, "areal", 1, interrupt=interrupt,
                          staleness_control="filter").to_dict()
    cfg = config_from_dict({**base, "train": {**base["train"], "updates": 10},
                            "runtime": {**base["runtime"], "trainer_ranks": 2,
                                        "hardware": str(tmp_path / "profile.yaml")}})
    summary = run_mode(cfg, tmp_path / "run")
    p = plan(cfg, workload(cfg, empirical(tmp_path / "run", as_recorded=True)))
    measured = run_timing(summary, json.loads((tmp_path / "run/staleness.json").read_text()))
    assert (p["wall_s"], p["staleness"]) == (measured["wall_s"], measured["staleness"])
    charged = summary["clock"]["charged_s"]
    assert charged["allreduce"] > 0 and p["charged_s"] == pytest.approx(charged)
    one = plan(config_from_dict({**cfg.to_dict(), "runtime": {
        **cfg.to_dict()["runtime"], "trainer_ranks": 1}}),
        workload(cfg, empirical(tmp_path / "run", as_recorded=True)))
    assert "allreduce" not in one["charged_s"] and one["charged_s"]["update"] > charged["update"]


def test_a_sync_plan_prices_a_sync_run(tiny_model_dir: Path, tmp_path: Path):
    cfg = virtual_config(tiny_model_dir, tmp_path, "sync", 0)
    summary = run_mode(cfg, tmp_path / "run")
    p = plan(cfg, workload(cfg, empirical(tmp_path / "run", as_recorded=True)))
    assert p["wall_s"] == pytest.approx(summary["time"]["wall_s"], rel=1e-9)
    assert p["speedup_vs_sync"] == 1.0


def test_a_sync_plan_on_two_devices_prices_a_sync_run_on_two(tiny_model_dir: Path,
                                                             tmp_path: Path):
    """Sync on two devices on the virtual clock: each generates its half of the groups side
    by side, then two ranks train; the planner's sync on two prices the run to the last bit
    and makes its samples, and the run is faster than on one device."""
    profile = {**RUN_PROFILE, "allreduce": {"call_s": 1e-3, "gb_per_s": 2.0, "gil_share": 0}}
    (tmp_path / "profile.yaml").write_text(yaml.safe_dump(profile))
    base = virtual_config(tiny_model_dir, tmp_path, "sync", 0).to_dict()
    runs = {}
    for n in (1, 2):
        cfg = config_from_dict({**base, "runtime": {**base["runtime"], "trainer_ranks": n,
                                                    "hardware": str(tmp_path / "profile.yaml")}})
        summary = run_mode(cfg, tmp_path / f"run{n}")
        p = plan(cfg, workload(cfg, empirical(tmp_path / f"run{n}", as_recorded=True)))
        assert p["sync_devices"] == n
        assert p["wall_s"] == pytest.approx(summary["time"]["wall_s"], rel=1e-9)
        runs[n] = summary
    samples = [json.loads(line) for line in (tmp_path / "run2/samples.jsonl").read_text()
               .splitlines()]
    assert {s["worker"] for s in samples} == {"rollout0", "rollout1"}
    assert all(s["worker"] == f"rollout{s['group_id'] % 2}" for s in samples)
    assert "allreduce" in runs[2]["clock"]["charged_s"]
    assert runs[2]["time"]["wall_s"] < runs[1]["time"]["wall_s"]


def test_a_plan_says_what_each_gpu_holds(tiny_model_dir: Path, tmp_path: Path):
    """On a profile that gives its model's size and KV cache, each plan says the GiB a
    rollout worker's and a trainer rank's GPU holds: weights and a KV cache for a batch of
    the longest prompt plus max_new_tokens; weights, gradients and Adam's two moments."""
    from rlcore.clock.profile import load_profile
    from rlcore.runners.asynchronous.layout import GIB

    cfg = virtual_config(tiny_model_dir, tmp_path, "areal", 1)
    work = workload(cfg)
    p = plan(cfg, work, load_profile("v100x4-qwen0.5b-fp16"))
    weights = 1_976_131_072  # the profile's model_bytes: Qwen2.5-0.5B's fp32 weights
    rows = cfg.train.update_batch_size * (max(work.prompt_tokens.values())
                                          + cfg.rollout.max_new_tokens)
    assert p["memory_gib"] == pytest.approx({"rollout": (weights + 12_288 * rows) / GIB,
                                             "trainer": 4 * weights / GIB})
    assert plan(cfg, work, load_profile("cpu-2core"))["memory_gib"] is None


def test_staleness_zero_with_admission_control_plans_no_drop(tiny_model_dir: Path,
                                                             tmp_path: Path):
    cfg = virtual_config(tiny_model_dir, tmp_path, "areal", 0, interrupt="continue",
                         staleness_control="both")
    p = plan(cfg, workload(cfg))
    assert set(p["staleness"]) == {"0"} and p["stale_drop_rate"] == 0.0
    assert p["samples"]["accepted"] == cfg.train.updates * cfg.train.update_batch_size


def test_the_pick_is_the_split_with_the_most_updates_per_second():
    assert splits(4) == [(1, 3), (2, 2), (3, 1)]
    plans = [{SPLIT: "1+3", "updates_per_s": 0.5}, {SPLIT: "2+2", "updates_per_s": 1.0},
             {SPLIT: "3+1", "updates_per_s": 1.0}]
    best = pick(plans, 4)
    assert best[SPLIT] == "3+1"  # a tie: fewer trainer ranks
    assert [p["gpu_s_per_update"] for p in plans] == [8.0, 4.0, 4.0]


def test_sync_on_n_devices_samples_and_trains_their_shares(tiny_model_dir: Path,
                                                           tmp_path: Path):
    """Sync on 2 devices: each samples half the groups at once, so where sampling costs per
    row the batch is ready in about half the time; then two ranks train, each its half, and
    sum their gradients. Where sampling costs per step, the devices gain nothing."""
    cfg = virtual_config(tiny_model_dir, tmp_path, "sync", 0)
    work = workload(cfg)

    def profile(decode: dict[str, float]) -> Any:
        return profile_from_dict({**RUN_PROFILE, "decode": {**RUN_PROFILE["decode"], **decode},
                                  "update": {"call_s": 0.0, "per_token_s": 0.0,
                                             "gil_share": 0.0},
                                  "allreduce": {"call_s": 1e-3, "gb_per_s": 1e3,
                                                "gil_share": 0.0}})

    per_row = profile({"step_s": 0.0, "per_row_s": 1e-2, "per_row_context_s": 0.0})
    one, two = plan_sync(cfg, work, per_row), plan_sync(cfg, work, per_row, devices=2)
    assert 0.4 < two["wall_s"] / one["wall_s"] < 0.6
    assert (two["tokens_generated"], two["tokens_trained"]) == \
        (one["tokens_generated"], one["tokens_trained"])
    per_step = profile({"step_s": 1e-2, "per_row_s": 0.0, "per_row_context_s": 0.0})
    one, two = plan_sync(cfg, work, per_step), plan_sync(cfg, work, per_step, devices=2)
    # the same steps on each device, plus a gradient sum per update
    assert two["wall_s"] >= one["wall_s"] * 0.9


def test_cli_plans_every_split_of_n_gpus(tiny_model_dir: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]):
    """`--gpus 3` plans 1+2 and 2+1 on a profile that prices a gradient sum, names the
    pick, and lists a split that cannot run (two ranks for a minibatch of one group) with
    its reason instead of a plan."""
    cfg = virtual_config(tiny_model_dir, tmp_path, "areal", 1, interrupt="resubmit",
                         staleness_control="filter")
    hw = tmp_path / "three.yaml"
    hw.write_text(yaml.safe_dump({**RUN_PROFILE, "name": "three",
                                  "allreduce": {"call_s": 1e-3, "gb_per_s": 1.0,
                                                "gil_share": 0.0}}))
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg.to_dict()))
    out = tmp_path / "plans.json"
    assert main(["plan", str(path), "--gpus", "3", "--hardware", str(hw), "--mean-tokens",
                 "3", "--out", str(out)]) == 0
    plans = json.loads(out.read_text())
    assert [p[SPLIT] for p in plans] == ["1+2", "2+1"]
    text = capsys.readouterr().out
    best = max(plans, key=lambda p: p["updates_per_s"])
    assert f"pick: {best[SPLIT]} (rollout workers + trainer ranks) on 3 GPUs" in text
    # sync's batches of 8 in groups of 4 feed two devices, not three
    assert "sync on 2 GPUs (of 3: a minibatch of its batch has 2 groups" in text
    assert all(p["sync_devices"] == 2 for p in plans)
    # batches of 4 in groups of 4: no second rank has a group of its own
    assert main(["plan", str(path), "--gpus", "3", "--hardware", str(hw), "--mean-tokens",
                 "3", "--set", "train.update_batch_size=4"]) == 0
    text = capsys.readouterr().out
    assert "not planned: 1+2: runtime.trainer_ranks (2)" in text and "pick: 2+1" in text
    assert main(["plan", str(path), "--gpus", "3", "--sweep", "seed=0,1"]) == 2
    assert "give no --sweep" in capsys.readouterr().err


def test_cli_sweeps_and_writes_the_plans(tiny_model_dir: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]):
    cfg = virtual_config(tiny_model_dir, tmp_path, "areal", 1, interrupt="resubmit",
                         staleness_control="filter")
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg.to_dict()))
    out = tmp_path / "plans.json"
    assert main(["plan", str(path), "--sweep", "staleness.staleness_k=0,2",
                 "--mean-tokens", "3", "--out", str(out)]) == 0
    plans = json.loads(out.read_text())
    assert [p["staleness.staleness_k"] for p in plans] == ["0", "2"]
    assert max(int(k) for k in plans[1]["staleness"]) <= 2
    text = capsys.readouterr().out
    assert "given: geometric, mean 3" in text and "updates/s" in text
    assert main(["plan", str(path), "--sweep", "staleness.staleness_k"]) == 2
    assert "key=v1,v2" in capsys.readouterr().err
    assert main(["plan", str(path), "--fit"]) == 2
    assert "give --lengths RUN_DIR" in capsys.readouterr().err
    assert main(["plan", str(path), "--pooled"]) == 2
    assert "--pooled read a run" in capsys.readouterr().err
    # one run's lengths per sweep value, in order
    runs = [write_samples(tmp_path / name, [row(0, 0, n, True)]) for name, n in (("a", 2),
                                                                                ("b", 4))]
    sweep = ["plan", str(path), "--sweep", "staleness.staleness_k=0,2", "--out", str(out)]
    assert main([*sweep, "--lengths", str(runs[0]), "--lengths", str(runs[1])]) == 0
    assert [p["lengths"] for p in json.loads(out.read_text())] == \
        [f"empirical per task: {r}" for r in runs]
    assert main([*sweep[:3], "staleness.staleness_k=0,1,2", "--lengths", str(runs[0]),
                 "--lengths", str(runs[1])]) == 2
    assert "2 --lengths for 3 sweep values" in capsys.readouterr().err
