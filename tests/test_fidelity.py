"""The emulator's validation split: disjoint fitting and held-out configs, checked on load."""

import dataclasses
from pathlib import Path

import pytest
import yaml

from rlcore.clock.profile import load_profile
from rlcore.errors import ConfigError
from rlcore.measure.fidelity import fidelity_markdown, load_split, run_split
from rlcore.measure.in_situ import RunSpans, Span, run_speed
from tests.conftest import small_config

ROOT = Path(__file__).resolve().parents[1]


def test_the_shipped_split_spans_what_the_issue_asks_and_holds_out_the_rest(monkeypatch):
    monkeypatch.chdir(ROOT)
    split = load_split("config/fidelity.yaml")
    held = [cfg for _, cfg in split.configs("heldout")]
    assert len(held) >= 12
    assert {c.mode for c in held} >= {"async", "areal"}
    assert {c.staleness.staleness_k for c in held} >= {0, 1, 2, 4, 8}
    assert {c.staleness.interrupt for c in held} >= {"resubmit", "continue", "keep_kv"}
    fit = [cfg for _, cfg in split.configs("fit")]
    for size in (lambda c: c.train.update_batch_size, lambda c: c.rollout.group_size,
                 lambda c: c.rollout.max_new_tokens, lambda c: c.rollout.chunk_tokens,
                 lambda c: c.staleness.rollout_train_ratio):
        # each size is varied by some held-out config away from every fitting one
        assert {size(c) for c in held} - {size(c) for c in fit}
    assert not set(split.fit) & set(split.heldout)


def _write(tmp_path: Path, fit: str, heldout: str) -> Path:
    path = tmp_path / "split.yaml"
    path.write_text(f"base: {ROOT / 'config' / 'bench.yaml'}\nupdates: 10\nrepeats: 1\n"
                    f"fit:\n{fit}\nheldout:\n{heldout}\n")
    return path


@pytest.mark.parametrize(("fit", "heldout", "message"), [
    ("  a: [mode=sync]", "  a: [mode=areal]", "a is in both fit and heldout"),
    ("  a: [mode=areal]", "  b: [mode=areal]", "heldout.b is the same config as fit.a"),
    ("  a: [mode=areal]", "  b: mode=areal", "heldout.b must be a list of KEY=VALUE"),
    ("  a: [mode=areal]", "  b: [rollout.nope=1]", r"heldout.b \(.*rollout.nope=1\): .*nope"),
], ids=["same-name", "same-config", "not-a-list", "unknown-key"])
def test_a_split_that_overlaps_or_does_not_load_is_refused(tmp_path, fit, heldout, message):
    with pytest.raises(ConfigError, match=message):
        load_split(_write(tmp_path, fit, heldout))


def _entry(live_ups, virtual_ups, drop, tv, live_tv, ratio):
    spread = {"median": live_ups, "min": live_ups - 1, "max": live_ups + 1}
    share = {"median": 0.2, "min": 0.2, "max": 0.2}
    return {"live": {"updates_per_s": spread, "stale_drop_rate": share,
                     "wasted_token_share": share},
            "virtual": {"updates_per_s": virtual_ups, "stale_drop_rate": 0.2 + drop,
                        "wasted_token_share": 0.2},
            "plan": {"updates_per_s": live_ups, "stale_drop_rate": 0.2,
                     "wasted_token_share": 0.2},
            "virtual_error": {"updates_per_s_rel": virtual_ups / live_ups - 1,
                              "stale_drop_rate_abs": drop, "wasted_token_share_abs": 0.0},
            "plan_error": {"updates_per_s_rel": 0.0},
            "staleness_tv": {"virtual_vs_live": {"median": tv},
                             "live_vs_live": {"min": live_tv, "max": live_tv}},
            "cost": {"ratio": {"median": ratio}}}


def test_the_fidelity_table_says_which_goals_are_met():
    # errors 4 % and 12 %: median 8 % (missed), worst 12 % (missed); one drop rate 0.05 off
    result = {"configs": {"a": _entry(50.0, 52.0, 0.0, 0.10, 0.15, 1.1),
                          "b": _entry(50.0, 56.0, 0.05, 0.20, 0.15, 1.3)}}
    table = fidelity_markdown(result)
    assert "| a | 50.0 (49.0-51.0) | 52.0 (+4%) | 50.0 (+0%) | — | 0.20 / 0.20 / 0.20 |" in table
    assert "own speed" not in table  # no result carries it
    assert "median error 8.0% (goal 5%: missed), worst 12.0% (goal 10%: missed)" in table
    assert "within 0.03: 3 of 4 (missed)" in table
    assert "1 of 2 configs (missed)" in table
    assert "median 1.20, worst 1.30 (goal 1.2: missed)" in table
    result = {"configs": {"a": _entry(50.0, 51.0, 0.0, 0.10, 0.15, 1.0)}}
    table = fidelity_markdown(result)
    assert table.count("met)") == 5 and "missed" not in table


def test_the_table_gives_the_error_at_each_live_runs_own_speed():
    # live 50 updates/s, virtual 60 (+20 %); the live runs ran 1.25 and 1.15 times slower
    # than the profile: at their speeds virtual 48 (-4 %) and 52.2 (+4.3 %)
    a = {**_entry(50.0, 60.0, 0.0, 0.10, 0.15, 1.0),
         "at_run_speed": {"speeds": [1.25, 1.15], "updates_per_s_rel": 0.002}}
    b = {**_entry(50.0, 55.0, 0.0, 0.10, 0.15, 1.0), "at_run_speed": None}
    table = fidelity_markdown({"configs": {"a": a, "b": b}})
    assert "| 60.0 (+20%) | 50.0 (+0%) | +0% (1.25, 1.15) |" in table
    assert "| 55.0 (+10%) | 50.0 (+0%) | — (threaded) |" in table
    assert "own speed (the machine's drift between runs taken out; not a goal, a diagnosis): " \
        "median error 0.2%, worst 0.2% over 1 configs" in table


def test_a_runs_speed_is_its_computing_spans_seconds_over_their_price():
    """Two rollout spans of 10 decode steps at 1 ms (0.010 s each), taking 0.012 and 0.013 s,
    and a trainer span of one update at 20 ms taking 0.025 s; its hand-off and weight copy
    are not computing spans. Speed (0.012 + 0.013 + 0.025) / (0.010 + 0.010 + 0.020)."""
    profile = load_profile("cpu-2core")
    profile = dataclasses.replace(
        profile, decode=dataclasses.replace(profile.decode, step_s=1e-3),
        update=dataclasses.replace(profile.update, call_s=0.02),
        cpu=dataclasses.replace(profile.cpu, concurrent_slowdown=0.0))
    spans = [Span("rollout", 0.012, 0.0, {"decode.step_s": 10}, "rollout0", 0.0),
             Span("rollout", 0.013, 0.0, {"decode.step_s": 10}, "rollout0", 1.0),
             Span("trainer", 0.025, 0.5, {"update.call_s": 1}, "trainer0", 0.5),
             Span("handoff", 0.5, 0.0, {"handoff.call_s": 1}, "rollout0", 0.02),
             Span("weight_read", 0.5, 0.0, {"weight_read.call_s": 1}, "rollout0", 0.01)]
    run = RunSpans("r", "cpu", "portable", "wall", "areal", 1.0, spans)
    assert run_speed(run, profile) == pytest.approx(0.050 / 0.040)
    assert run_speed(dataclasses.replace(run, mode="async"), profile) is None


@pytest.mark.slow
def test_the_check_fits_every_rounds_runs_and_judges_the_held_out_ones(tiny_model_dir: Path,
                                                                       tmp_path: Path):
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump(small_config(
        tiny_model_dir, mode="areal", train={"update_batch_size": 8},
        rollout={"group_size": 4, "max_new_tokens": 4}, runtime={"progress_every": 0})))
    split_path = tmp_path / "split.yaml"
    split_path.write_text(
        f"base: {base}\nupdates: 3\nrepeats: 2\n"
        "fit:\n  sync: [mode=sync, staleness.staleness_k=0]\n  areal: [mode=areal]\n"
        "heldout:\n  areal-k4: [mode=areal, staleness.staleness_k=4]\n")
    out = tmp_path / "out"
    result = run_split(load_split(split_path), out, "cpu-2core")
    rounds = {r: sorted(p.name for p in (out / "fit" / r).iterdir())
              for r in ("round0", "round1")}
    assert rounds == {"round0": ["areal", "sync"], "round1": ["areal", "sync"]}
    # one round's fit is what a user pays (fit_s); the judged profile pools both rounds
    first = yaml.safe_load((out / "profile-round0.yaml").read_text())["source"]
    pooled = yaml.safe_load((out / "profile.yaml").read_text())["source"]
    assert "round1" not in first and "round0" in first
    assert "round0/sync" in pooled and "round1/areal" in pooled
    assert result["fit_s"] > 0 and result["profile"] == str(out / "profile.yaml")
    entry = result["configs"]["areal-k4"]
    assert len(entry["staleness"]["live"]) == 2  # one live run per round
    assert entry["virtual"]["updates_per_s"] > 0 and entry["plan"]["updates_per_s"] > 0
    assert "areal-k4" in fidelity_markdown(result)
    own = entry["at_run_speed"]  # each live run's speed against the pooled profile
    assert len(own["speeds"]) == 2 and all(f > 0 for f in own["speeds"])
