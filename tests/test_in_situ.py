"""Spans carry their work, and `calibrate --from-runs` fits a profile to them: the tally,
the overlap, the fit against hand-made spans, and a virtual run's spans fitted exactly."""

import dataclasses
import json
import pickle
import threading
from pathlib import Path

import pytest
import yaml

from rlcore.clock import WALL
from rlcore.clock.profile import load_profile
from rlcore.clock.work import (
    Commit,
    Decode,
    Handle,
    Handoff,
    Prefill,
    Reward,
    Update,
    Weights,
    WorkTally,
)
from rlcore.config import ConfigError, config_from_dict
from rlcore.measure.in_situ import (
    RunSpans,
    Span,
    calibrate_from_runs,
    covered,
    fit_spans,
    priced,
    read_run,
    spans_of,
)
from rlcore.measure.interpreter_fit import fit_interpreter, with_gil_share
from rlcore.record.rundir import read_jsonl
from rlcore.runners import run_mode
from tests.conftest import small_config
from tests.test_virtual_clock import RUN_PROFILE


def test_a_tally_sums_each_term_until_taken():
    tally = WorkTally()
    tally.add(Decode(steps=2, rows=8, row_context=40))
    tally.add(Decode(steps=1, rows=4, row_context=30))
    tally.add(Weights("read", 2_000_000_000))
    tally.add(Reward("math"))
    tally.add(Reward("exact"))
    assert tally.take() == {"decode.per_row_context_s": 70, "decode.per_row_s": 12,
                            "decode.step_s": 3, "reward.answer_s": 1, "reward.math_s": 1,
                            "weight_read.call_s": 1, "weight_read.per_gb": 2.0}
    assert tally.take() == {}
    for work, terms in [(Prefill(calls=2, tokens=50), {"prefill.call_s": 2,
                                                      "prefill.per_token_s": 50}),
                        (Update(tokens=96), {"update.call_s": 1, "update.per_token_s": 96}),
                        (Handle(samples=3), {"controller.message_s": 1,
                                             "controller.per_sample_s": 3}),
                        (Commit(), {"commit.call_s": 1})]:
        tally.add(work)
        assert tally.take() == terms


def test_the_wall_clock_tallies_each_thread_apart_and_travels_as_this_processs_own():
    WALL.take_work()
    WALL.charge(Update(tokens=10))
    other: dict = {}
    thread = threading.Thread(target=lambda: (WALL.charge(Commit()),
                                              other.update(WALL.take_work())))
    thread.start()
    thread.join()
    assert other == {"commit.call_s": 1}
    assert WALL.take_work() == {"update.call_s": 1, "update.per_token_s": 10}
    assert pickle.loads(pickle.dumps(WALL)) is WALL


def test_covered_by_hand():
    # [0, 10] under (2, 4), (3, 6) and (8, 12): 2..6 and 8..10, 6 of 10
    assert covered(0, 10, [(8, 12), (2, 4), (3, 6)]) == pytest.approx(0.6)
    assert covered(0, 10, []) == 0 and covered(5, 5, [(0, 9)]) == 0


def test_spans_overlap_only_the_other_computing_role():
    events = [
        {"type": "span", "role": "rollout", "start": 0.0, "end": 2.0, "work": {"a": 1}},
        {"type": "span", "role": "trainer", "start": 1.0, "end": 3.0, "work": {"b": 1}},
        {"type": "span", "role": "controller", "start": 0.0, "end": 4.0, "work": {"c": 1}},
        {"type": "span", "role": "rollout", "start": 5.0, "end": 6.0, "work": {}},  # a replay's
        {"type": "queues", "t": 0.5},
    ]
    assert [(s.role, s.seconds, s.overlap) for s in spans_of(events)] == [
        ("rollout", 2.0, 0.5), ("trainer", 2.0, 0.5), ("controller", 4.0, 0.0)]


def _span(role, overlap, **work):
    # decode.step_s 0.01 s, update.call_s 0.5 s; each overlapped second runs at 1 / 1.25
    price = 0.01 * work.get("decode.step_s", 0) + 0.5 * work.get("update.call_s", 0)
    return Span(role, price / (1 - overlap + overlap / 1.25), overlap, work, role, 0.0)


def test_the_fit_recovers_prices_and_slowdown_from_spans_made_by_hand():
    spans = [_span("rollout", 0.0, **{"decode.step_s": 10}),
             _span("rollout", 1.0, **{"decode.step_s": 20}),   # 0.2 s of work in 0.25 s
             _span("trainer", 0.0, **{"update.call_s": 1}),
             _span("trainer", 0.5, **{"update.call_s": 1})]    # 0.5 / 0.9 s
    assert spans[1].seconds == pytest.approx(0.25) and spans[3].seconds == pytest.approx(5 / 9)
    fit = fit_spans(spans)
    assert fit.slowdown == pytest.approx(0.25)
    assert fit.prices == pytest.approx({"decode.step_s": 0.01, "update.call_s": 0.5})
    assert fit.residual == pytest.approx({"rollout": 0.0, "trainer": 0.0}, abs=1e-9)
    assert fit.spans == {"rollout": 2, "trainer": 2}
    assert fit.stalls == {"rollout": 0, "trainer": 0}


def test_a_stall_of_the_host_is_left_out_of_the_fit():
    # ten 0.1 s decodes (10 steps of 10 ms) and one that the host paused for 0.6 s: with it,
    # least squares would price a step at 0.0155 s; without it, at 0.01 s exactly
    spans = [_span("rollout", 0.0, **{"decode.step_s": 10}) for _ in range(10)]
    spans.append(Span("rollout", 0.7, 0.0, {"decode.step_s": 10}, "rollout0", 0.0))
    fit = fit_spans(spans, slowdowns=[0.0])
    assert fit.prices == pytest.approx({"decode.step_s": 0.01})
    assert (fit.spans, fit.stalls) == ({"rollout": 10}, {"rollout": 1})
    # a span 3 times its price is slow work, not a stall: it stays in
    spans[-1] = Span("rollout", 0.3, 0.0, {"decode.step_s": 10}, "rollout0", 0.0)
    fit = fit_spans(spans, slowdowns=[0.0])
    assert fit.stalls == {"rollout": 0} and fit.prices["decode.step_s"] > 0.01


def test_priced_turns_a_per_gb_price_into_a_bandwidth_and_keeps_the_rest(tmp_path: Path):
    base = load_profile("cpu-2core")
    fit = fit_spans([Span("trainer", 0.3, 0.0, {"weight_write.call_s": 1,
                                                 "weight_write.per_gb": 0.5}, "trainer0", 0.0),
                     Span("trainer", 0.55, 0.0, {"weight_write.call_s": 1,
                                                  "weight_write.per_gb": 1.0}, "trainer0", 0.0)])
    run = RunSpans("r1", "a CPU", "portable", "wall", "areal", 10.0, [])
    p = priced(base, fit, None, "fitted", [run])
    # 0.05 s a call, 0.5 s per GB: 2 GB/s
    assert p.weight_write.call_s == pytest.approx(0.05)
    assert p.weight_write.gb_per_s == pytest.approx(2.0)
    assert (p.name, p.host, p.kernels, p.decode) == ("fitted", "a CPU", "portable", base.decode)
    assert p.cpu.concurrent_slowdown == fit.slowdown


def test_a_virtual_sync_runs_spans_are_its_prices_exactly(tiny_model_dir: Path,
                                                          tmp_path: Path):
    """Sync never overlaps its roles, so each span is its work's price: the fit explains
    every span to rounding, whatever split of collinear terms it picks."""
    hw = tmp_path / "test-run.yaml"
    hw.write_text(yaml.safe_dump(RUN_PROFILE))
    cfg = config_from_dict(small_config(
        tiny_model_dir, mode="sync", train={"updates": 6, "update_batch_size": 8},
        runtime={"progress_every": 0, "save_policy": False, "clock": "virtual",
                 "hardware": str(hw)}))
    run_mode(cfg, tmp_path / "run")
    spans = spans_of(read_jsonl(tmp_path / "run" / "events.jsonl"))
    assert {s.role for s in spans} == {"rollout", "controller", "trainer"}
    assert all(s.work for s in spans)
    fit = fit_spans(spans)
    assert max(fit.residual.values()) < 1e-6
    # ... and a virtual run is refused as a source of prices
    with pytest.raises(ConfigError, match="not timed by a machine"):
        calibrate_from_runs([tmp_path / "run"], load_profile("cpu-2core"), "x", drift=False)


def test_a_live_runs_spans_carry_work_and_fit(tiny_model_dir: Path, tmp_path: Path):
    cfg = config_from_dict(small_config(tiny_model_dir, mode="areal",
                                        runtime={"progress_every": 0, "save_policy": False}))
    run_mode(cfg, tmp_path / "run")
    run = read_run(tmp_path / "run")
    roles = {s.role for s in run.spans}
    assert roles == {"rollout", "handoff", "trainer", "weight_read", "weight_write"}
    handoffs = [s for s in run.spans if s.role == "handoff"]
    assert all(s.seconds > 0 and s.work["handoff.call_s"] == 1 for s in handoffs)
    updates = [s.work for s in run.spans if s.role == "trainer"]
    writes = [s.work for s in run.spans if s.role == "weight_write"]
    # each update's write, timed apart, is a span of its own
    assert len(updates) == len(writes) > 0
    assert all(w["update.call_s"] == 1 and len(w) == 2 for w in updates)
    assert all(w["weight_write.call_s"] == 1 and len(w) == 2 for w in writes)
    profile, report = calibrate_from_runs([tmp_path / "run"], load_profile("cpu-2core"), "x",
                                          drift=False)
    assert profile.host == run.cpu and "rollout" in report and "trainer" in report
    # cpu-2core, timed term by term, has no hand-off: the fit adds it
    assert load_profile("cpu-2core").handoff is None and profile.handoff is not None
    assert "handoff" in report
    assert profile.drift is None and "drift" not in report
    drifting, report = calibrate_from_runs([tmp_path / "run"], load_profile("cpu-2core"), "x",
                                           drift=True)
    assert drifting.drift is not None and "drift" in report
    assert dataclasses.replace(drifting, drift=None) == profile


def test_a_run_without_work_in_its_spans_is_refused_with_the_fix(tmp_path: Path):
    (tmp_path / "summary.json").write_text(json.dumps({
        "reproducibility": {"environment": {"cpu": "c", "kernels": "portable"}},
        "clock": {"kind": "wall"}}))
    (tmp_path / "events.jsonl").write_text(json.dumps(
        {"type": "span", "role": "rollout", "start": 0, "end": 1, "samples": 4}) + "\n")
    with pytest.raises(ConfigError, match="rerun it with this version of rlcore"):
        read_run(tmp_path)
    with pytest.raises(ConfigError, match="not a finished run directory"):
        read_run(tmp_path / "nothing")


def test_a_timed_weight_copy_leaves_its_span_and_is_fitted_on_its_own():
    events = [
        {"type": "span", "role": "rollout", "worker": "rollout0", "start": 0.0, "end": 1.0,
         "work": {"decode.step_s": 10, "weight_read.call_s": 1, "weight_read.per_gb": 0.5}},
        {"type": "weight_reload", "worker": "rollout0", "t": 0.25, "reload_s": 0.125},
        {"type": "weight_reload", "worker": "rollout1", "t": 0.5, "reload_s": 0.5},  # not its
        {"type": "span", "role": "trainer", "worker": "trainer0", "start": 1.0, "end": 3.0,
         "work": {"update.call_s": 1, "weight_write.call_s": 1}},
    ]
    updates = [{"t_commit": 3.0, "time/weight_write_s": 0.5},
               {"t_commit": 9.0, "time/weight_write_s": 0.25}]  # another update's
    assert [(s.role, s.seconds, s.work) for s in spans_of(events, updates)] == [
        ("rollout", 0.875, {"decode.step_s": 10}),
        ("weight_read", 0.125, {"weight_read.call_s": 1, "weight_read.per_gb": 0.5}),
        ("trainer", 1.5, {"update.call_s": 1}),
        ("weight_write", 0.5, {"weight_write.call_s": 1})]
    # without the updates the trainer's span stays whole
    assert [s.seconds for s in spans_of(events)] == [0.875, 0.125, 2.0]


def test_a_handoff_is_a_span_of_its_own_stretched_by_the_trainers_overlap():
    events = [
        {"type": "span", "role": "rollout", "worker": "rollout0", "start": 0.0, "end": 1.0,
         "work": {"decode.step_s": 10}},
        {"type": "handoff", "worker": "rollout0", "t": 1.5, "samples": 8, "handoff_s": 0.5},
        {"type": "span", "role": "trainer", "worker": "trainer0", "start": 1.25, "end": 3.0,
         "work": {"update.call_s": 1}},
    ]
    handoff = spans_of(events)[-1]
    # [1.0, 1.5], of which the trainer's span covers [1.25, 1.5]: half
    assert (handoff.role, handoff.seconds, handoff.overlap, handoff.start) == (
        "handoff", 0.5, 0.5, 1.0)
    assert handoff.work == {"handoff.call_s": 1, "handoff.per_sample_s": 8}


def test_handoffs_price_a_call_and_a_sample_into_a_base_without_them():
    """Hand-offs of 8 and 32 samples at 1 ms + 20 us each: both prices come out, and the
    profile, whose base had no hand-off, gets one."""
    events = [{"type": "handoff", "worker": "rollout0", "t": float(i), "samples": n,
               "handoff_s": 1e-3 + 2e-5 * n} for i, n in enumerate([8, 32, 8, 32, 16])]
    fit = fit_spans(spans_of(events), slowdowns=[0.0])
    assert fit.prices == pytest.approx({"handoff.call_s": 1e-3, "handoff.per_sample_s": 2e-5})
    base = load_profile("cpu-2core")
    run = RunSpans("r", "cpu", "portable", "wall", "areal", 1.0, spans_of(events))
    profile = priced(base, fit, None, "fitted", [run])
    assert base.handoff is None
    assert profile.seconds(Handoff(32)) == pytest.approx(1e-3 + 32 * 2e-5)


def test_split_copies_separate_a_per_call_price_that_whole_spans_cannot():
    """Every span has one prefill call and one reload: whole, the two prices are one sum
    and the fit may put it anywhere; with the reload timed apart both come out exact."""
    events, t = [], 0.0
    for steps in [4, 6, 5, 6, 3]:
        seconds = 0.01 * steps + 0.005 + 0.0003  # steps, the prefill call, the reload
        events.append({"type": "span", "role": "rollout", "worker": "rollout0", "start": t,
                       "end": t + seconds, "work": {"decode.step_s": steps,
                                                    "prefill.call_s": 1,
                                                    "weight_read.call_s": 1}})
        events.append({"type": "weight_reload", "worker": "rollout0", "t": t + 0.0003,
                       "reload_s": 0.0003})
        t += seconds + 1
    fit = fit_spans(spans_of(events), slowdowns=[0.0])
    assert fit.prices == pytest.approx({"decode.step_s": 0.01, "prefill.call_s": 0.005,
                                        "weight_read.call_s": 0.0003}, rel=1e-6)


def test_the_interpreter_share_is_found_again_from_a_threaded_run(tiny_model_dir: Path,
                                                                  tmp_path: Path):
    """A threaded run on the virtual clock at share 0.6 stands in for a live one: planned on
    the same prices, its updates/s are matched at 0.6 again, and not at 0 or 1."""
    hw = tmp_path / "share.yaml"
    at = {s: {**RUN_PROFILE[s], "gil_share": 0.6} for s in ("decode", "prefill", "update")}
    hw.write_text(yaml.safe_dump({**RUN_PROFILE, **at}))
    cfg = config_from_dict(small_config(
        tiny_model_dir, mode="async", train={"updates": 12, "update_batch_size": 8},
        staleness={"staleness_k": 4},
        runtime={"progress_every": 0, "save_policy": False, "clock": "virtual",
                 "hardware": str(hw)}))
    summary = run_mode(cfg, tmp_path / "run")
    run = RunSpans(str(tmp_path / "run"), "c", "portable", "wall", "async",
                   summary["updates"] / summary["time"]["wall_s"], [])
    base = load_profile(str(hw))
    fit = fit_interpreter(with_gil_share(base, 1.0), [run])
    assert fit.share == pytest.approx(0.6)
    assert abs(fit.error[run.path]) < 0.02
    # the share matters to the plan: at the grid's ends it misses
    for far in (0.0, 1.0):
        assert abs(fit_interpreter(base, [run], shares=[far]).error[run.path]) > 0.05


def test_threaded_runs_alone_cannot_price_the_work(tmp_path: Path, monkeypatch):
    runs = {str(tmp_path / n): RunSpans(str(tmp_path / n), "c", "portable", "wall", "async",
                                        10.0, [_span("rollout", 0.0, **{"decode.step_s": 1})])
            for n in ("a", "b")}
    monkeypatch.setattr("rlcore.measure.in_situ.read_run", lambda d: runs[str(d)])
    with pytest.raises(ConfigError, match="add a sync or areal run"):
        calibrate_from_runs(list(runs), load_profile("cpu-2core"), "x", drift=False)
