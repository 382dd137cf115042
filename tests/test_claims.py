"""The claims table: contrasts, intervals, seeds needed and verdicts, against hand values."""

import math

import pytest

from rlcore.analysis.claims import (
    ABSENT,
    CONTRADICTED,
    EQUIVALENT,
    SUPPORTED,
    UNRESOLVED,
    Effect,
    Sesoi,
    arm_from_path,
    blocked_widths,
    claim_from_config,
    claims_table,
    comparison_text,
    delta_for,
    paired_effect,
    ran_block_by_block,
    same_weights,
    seeds_needed,
    seeds_needed_equivalence,
    sesoi_from_config,
    unpaired_effect,
    verdict,
)
from rlcore.analysis.claims_text import claims_findings, claims_markdown, paper_beside
from rlcore.analysis.tables import t975


def test_paired_effect_by_hand():
    # per-seed contrasts 1, 2, 2: mean 5/3, sd sqrt(1/3), t(2) = 4.303
    e = paired_effect([{0: 1.0, 1: 2.0, 2: 3.0}, {0: 0.0, 1: 0.0, 2: 1.0}], [1, -1])
    assert e.mean == pytest.approx(5 / 3)
    assert e.spread == pytest.approx(math.sqrt(1 / 3))
    assert e.lo == pytest.approx(5 / 3 - 4.303 / 3, abs=1e-9)
    assert e.hi == pytest.approx(5 / 3 + 4.303 / 3, abs=1e-9)
    assert e.seeds == 3


def test_paired_effect_uses_only_seeds_in_every_arm():
    e = paired_effect([{0: 1.0, 1: 2.0, 2: 9.0}, {0: 0.0, 1: 0.0}], [1, -1])
    assert e.seeds == 2 and e.mean == pytest.approx(1.5)


def test_paired_effect_of_one_seed_has_no_interval():
    e = paired_effect([{0: 1.0}, {0: 0.5}], [1, -1])
    assert e.mean == 0.5 and math.isnan(e.lo) and e.seeds == 1


def test_unpaired_effect_welch_by_hand():
    # means 2 and 1/3; variances 1 and 1/3 over 3 runs each: se 2/3, df 3.2 -> t(3) = 3.182
    e = unpaired_effect([[1.0, 2.0, 3.0], [0.0, 0.0, 1.0]], [1, -1])
    assert e.mean == pytest.approx(5 / 3)
    assert e.lo == pytest.approx(5 / 3 - 3.182 * 2 / 3)
    assert e.spread == pytest.approx(math.sqrt(4 / 3))


def test_unpaired_difference_of_differences():
    arms = [[4.0, 4.0], [1.0, 1.0], [3.0, 3.0], [2.0, 2.0]]
    e = unpaired_effect(arms, [1, -1, -1, 1])  # (4 - 1) - (3 - 2) = 2, no spread
    assert (e.mean, e.lo, e.hi) == (2.0, 2.0, 2.0)


def test_seeds_needed_by_hand():
    # paired: (1.96 + 0.8416)^2 * (sqrt(1/3) / (5/3))^2 + 1.96^2 / 2 = 2.86 -> 3
    assert seeds_needed(5 / 3, math.sqrt(1 / 3), paired=True) == 3
    # unpaired: 7.8489 * (1.1547 / 1.6667)^2 + 1.96^2 / 4 = 4.73 -> 5
    assert seeds_needed(5 / 3, math.sqrt(4 / 3), paired=False) == 5
    # a tenth of the effect: 7.8489 * 12 + 1.92 = 96.11 -> 97
    assert seeds_needed(1 / 6, math.sqrt(1 / 3), paired=True) == 97
    assert seeds_needed(0.0, 1.0, paired=True) == math.inf
    assert math.isnan(seeds_needed(1.0, math.nan, paired=True))
    assert seeds_needed(1.0, 0.0, paired=True) == 2  # an interval needs two


@pytest.mark.parametrize(("lo", "hi", "expect", "want"), [
    (0.1, 0.5, "positive", SUPPORTED),
    (-0.5, -0.1, "positive", CONTRADICTED),
    (-0.1, 0.5, "positive", UNRESOLVED),
    (-0.5, -0.1, "negative", SUPPORTED),
    (0.1, 0.5, "negative", CONTRADICTED),
    (0.0, 0.5, "positive", UNRESOLVED),  # touching zero is not excluding it
    (math.nan, math.nan, "positive", UNRESOLVED),
])
def test_verdict_from_the_interval(lo, hi, expect, want):
    assert verdict(Effect(0.3, lo, hi, 3, 0.1), expect)[0] == want


def test_equivalence_by_hand():
    # mean 0.005, se 0.005 over 3 seeds: 90 % interval 0.005 +- 2.920 x 0.005 =
    # [-0.0096, 0.0196]; the 95 % one, [-0.02, 0.03], contains zero
    e = Effect(0.005, -0.02, 0.03, 3, 0.00866, se=0.005, df=2)
    assert e.interval90() == pytest.approx((0.005 - 0.0146, 0.005 + 0.0146))
    assert verdict(e, "positive", delta=0.02) == (EQUIVALENT, "equivalence")
    # a claim that something does not improve is supported by it, and says so
    assert verdict(e, "positive", 0.02, or_equivalent=True) == (SUPPORTED, "equivalence")
    # delta too tight for this interval: 0.0196 > 0.015, and zero is inside the 95 %
    assert verdict(e, "positive", delta=0.015) == (UNRESOLVED, "")
    # an interval on the predicted side is support on that basis
    assert verdict(Effect(0.3, 0.1, 0.5, 3, 0.1, se=0.05, df=2), "positive", 0.02) == (
        SUPPORTED, "interval")


def test_seeds_needed_for_equivalence_by_hand():
    # (1.6449 + 1.2816)^2 = 8.5639; paired: 8.5639 x (0.01 / 0.02)^2 + 1.6449^2 / 2
    # = 2.1410 + 1.3528 = 3.49 -> 4; unpaired: 2.1410 + 1.3528 / 2 = 2.82 -> 3
    assert seeds_needed_equivalence(0.01, 0.02, paired=True) == 4
    assert seeds_needed_equivalence(0.01, 0.02, paired=False) == 3
    # five times the spread: 8.5639 x 6.25 + 1.3528 = 54.88 -> 55
    assert seeds_needed_equivalence(0.05, 0.02, paired=True) == 55
    assert math.isnan(seeds_needed_equivalence(math.nan, 0.02, paired=True))
    assert math.isnan(seeds_needed_equivalence(0.01, math.nan, paired=True))


def test_a_relative_delta_is_a_share_of_the_reference_arm():
    claim = claim_from_config(SPEC)  # areal weighted 1, sync -1: sync is the reference
    sesoi = {"reward_per_1k_tokens": Sesoi(0.05, relative=True, reason="a test")}
    assert delta_for(claim, [{0: 1.0}, {0: 10.0, 1: 20.0, 2: 30.0}], sesoi) == pytest.approx(1.0)
    assert math.isnan(delta_for(claim, [{0: 1.0}, {}], sesoi))  # no reference runs
    absolute = {"reward_per_1k_tokens": Sesoi(0.5, relative=False, reason="a test")}
    assert delta_for(claim, [{0: 1.0}, {}], absolute) == 0.5
    assert sesoi_from_config({"m": {"delta": 0.02, "relative": False, "reason": "r"}}) == {
        "m": Sesoi(0.02, False, "r")}


SESOI = {"reward_per_1k_tokens": Sesoi(0.05, relative=True, reason="a test"),
         "heldout_pass_rate": Sesoi(0.02, relative=False, reason="a test")}

SPEC = {
    "id": "C5", "statement": "AReaL-style has the highest reward per 1k tokens",
    "source": "seed 000, Figure 4", "metric": "reward_per_1k_tokens", "expect": "positive",
    "pairing": "seed",
    "contrast": {"v100/areal/areal_defaults/k2/pg": 1, "v100/sync/none/k0/pg": -1},
}


def _row(mode, preset, k, seed, value, clock="v100", replayed=None, job_s=60.0):
    return {"clock": clock, "mode": mode, "preset": preset, "staleness_k": k,
            "objective": "pg", "replayed": replayed, "seed": seed,
            "reward_per_1k_tokens": value, "job_s": job_s}


def test_claims_table_from_rows():
    claim = claim_from_config(SPEC)
    rows = [_row("areal", "areal_defaults", 2, s, v) for s, v in enumerate([1.0, 2.0, 3.0])]
    rows += [_row("sync", "none", 0, s, v) for s, v in enumerate([0.0, 0.0, 1.0])]
    rows.append(_row("sync", "none", 0, 0, 50.0, clock="wall"))  # another clock: ignored
    # a replay: ignored
    rows.append(_row("areal", "areal_defaults", 2, 0, 50.0, replayed="decoupled"))
    (row,) = claims_table([claim], rows, budget_min=20, sesoi=SESOI)
    assert row["effect"] == pytest.approx(5 / 3)
    assert row["verdict"] == SUPPORTED and row["seeds"] == 3 and row["seeds_needed"] == 3
    assert row["missing_arms"] == ""
    # one seed of the two arms: a minute each; it has the seeds it needs: nothing more
    assert row["job_min_per_seed"] == pytest.approx(2.0) and row["extra_job_min"] == 0
    assert row["spare_min"] == pytest.approx(20 - 8)  # 8 jobs of a minute read
    md = claims_markdown([row])
    # delta: 5 % of sync's mean 1/3; equivalence would need 8.5639 x (sqrt(1/3) x 60)^2
    # + 1.3528 = 10276.6 + 1.4 = 10277.98 -> 10278 seeds
    assert row["delta"] == pytest.approx(1 / 60) and row["seeds_needed_equivalence"] == 10278
    assert "| C5 |" in md and "| supported |" in md
    assert "| 3 / 3 or over 100 for equivalence |" in md  # the csv keeps 10278


def test_an_unresolved_claim_says_whether_its_seeds_fit_the_budget():
    claim = claim_from_config(SPEC)
    # per-seed contrasts 1, -1, 1: mean 1/3, sd 2/sqrt(3); need
    # (1.96 + 0.8416)^2 * (sd / mean)^2 + 1.96^2 / 2 = 7.849 * 12 + 1.921 = 96.1 -> 97
    rows = [_row("areal", "areal_defaults", 2, s, v, job_s=30.0)
            for s, v in enumerate([1.0, 0.0, 1.0])]
    rows += [_row("sync", "none", 0, s, v, job_s=j)
             for s, v, j in [(0, 0.0, 10.0), (1, 1.0, 20.0), (2, 0.0, 90.0)]]
    (row,) = claims_table([claim], rows, budget_min=20, sesoi=SESOI)
    assert row["verdict"] == UNRESOLVED and row["seeds_needed"] == 97
    assert row["job_min_per_seed"] == pytest.approx((30 + 20) / 60)  # medians, summed
    # 94 seeds more at 50 s: 78.3 min; the jobs read took 3 x 30 + 120 s = 3.5 min
    assert row["extra_job_min"] == pytest.approx(94 * 50 / 60)
    assert row["spare_min"] == pytest.approx(16.5) and row["beyond_budget"]
    assert "3 / 97 or " in claims_markdown([row])
    assert "for equivalence (+78.3 job-min)" in claims_markdown([row])
    assert "unresolved at this power; more seeds do not fit the budget" in claims_markdown([row])
    (row,) = claims_table([claim], rows, budget_min=90, sesoi=SESOI)
    assert "; more seeds fit the budget" in claims_markdown([row])


def test_a_replay_arm_is_priced_with_the_live_run_it_replays():
    spec = {**SPEC, "contrast": {"v100/areal/areal_defaults/k2/pg/decoupled": 1,
                                 "v100/areal/areal_defaults/k2/pg/behav_clip": -1}}
    rows = [_row("areal", "areal_defaults", 2, s, 1.0, job_s=40.0) for s in range(2)]
    rows += [_row("areal", "areal_defaults", 2, s, 1.0, replayed=r, job_s=5.0)
             for s in range(2) for r in ("decoupled", "behav_clip")]
    (row,) = claims_table([claim_from_config(spec)], rows, budget_min=20, sesoi=SESOI)
    assert row["job_min_per_seed"] == pytest.approx((40 + 5 + 5) / 60)
    rows = [r for r in rows if r["replayed"]]  # the live run missing: no price
    (row,) = claims_table([claim_from_config(spec)], rows, budget_min=20, sesoi=SESOI)
    assert math.isnan(row["job_min_per_seed"]) and row["beyond_budget"]


def test_a_claim_without_runs_is_unresolved_and_names_the_missing_arm():
    claim = claim_from_config(SPEC)
    rows = [_row("areal", "areal_defaults", 2, s, 1.0) for s in range(3)]
    (row,) = claims_table([claim], rows, budget_min=20, sesoi=SESOI)
    assert row["verdict"] == UNRESOLVED and row["seeds"] == 0
    assert row["missing_arms"] == "sync/none/K0/pg"
    assert "no runs: sync/none/K0/pg" in claims_markdown([row])


def test_a_claim_with_no_effect_that_matters_is_equivalent():
    spec = {**SPEC, "metric": "heldout_pass_rate"}
    # per-seed contrasts 0, 0.01, -0.005: mean 0.00167, sd 0.00764, se 0.00441; 90 %
    # interval +- 2.920 x 0.00441 = [-0.0112, 0.0145], inside +-0.02; the 95 % contains 0
    rows = [{**_row("areal", "areal_defaults", 2, s, None), "heldout_pass_rate": v}
            for s, v in enumerate([0.70, 0.71, 0.70])]
    rows += [{**_row("sync", "none", 0, s, None), "heldout_pass_rate": v}
             for s, v in enumerate([0.70, 0.70, 0.705])]
    (row,) = claims_table([claim_from_config(spec)], rows, budget_min=20, sesoi=SESOI)
    assert (row["verdict"], row["basis"], row["delta"]) == (EQUIVALENT, "equivalence", 0.02)
    assert (row["ci90_lo"], row["ci90_hi"]) == pytest.approx((-0.01121, 0.01454), abs=1e-5)
    assert row["ci95_lo"] < 0 < row["ci95_hi"]
    assert "equivalent (the 90 % interval lies within +-delta)" in claims_markdown([row])
    (row,) = claims_table([claim_from_config({**spec, "or_equivalent": True})], rows,
                          budget_min=20, sesoi=SESOI)
    assert (row["verdict"], row["basis"]) == (SUPPORTED, "equivalence")


def test_a_claim_whose_cause_is_absent_says_so_instead_of_a_verdict():
    """C8 at K = 8: a bias that stale drops would make, on runs that dropped nothing as
    stale (but a thousand samples as interrupted), is no finding either way."""
    spec = {"id": "C8", "statement": "dropping stale rollouts biases training toward short",
            "source": "tinker", "metric": "stale_short_bias", "expect": "negative",
            "pairing": "seed", "cause": "dropped_stale",
            "contrast": {"v100/areal/paper/k8/pg": 1}}
    sesoi = {"stale_short_bias": Sesoi(0.05, relative=False, reason="a test")}
    rows = [{**_row("areal", "paper", 8, s, None), "stale_short_bias": 0.0,
             "dropped_stale": 0, "dropped_interrupted": 1000 + s, "resubmissions": 3000}
            for s in range(3)]
    (row,) = claims_table([claim_from_config(spec)], rows, budget_min=20, sesoi=sesoi)
    assert (row["verdict"], row["basis"]) == (ABSENT, "cause")
    assert row["cause_per_run"] == \
        "dropped_stale 0, dropped_interrupted 1001, resubmissions 3000 a run"
    assert "not tested: no dropped\\_stale in its runs" in claims_findings([row])
    assert "not tested: its cause is absent (no dropped_stale in its runs: " in \
        claims_markdown([row])
    # one stale drop in one run: the verdict is the interval's again
    rows[0] = {**rows[0], "dropped_stale": 1, "stale_short_bias": -0.2}
    rows[1] = {**rows[1], "stale_short_bias": -0.25}
    rows[2] = {**rows[2], "stale_short_bias": -0.3}
    (row,) = claims_table([claim_from_config(spec)], rows, budget_min=20, sesoi=sesoi)
    assert row["verdict"] == SUPPORTED


def test_an_arm_path_with_one_more_level_is_a_replay():
    arm = arm_from_path("wall/areal/paper/k8/pg/decoupled", -0.5)
    assert (arm.clock, arm.mode, arm.preset, arm.staleness_k, arm.objective, arm.replayed,
            arm.weight) == ("wall", "areal", "paper", 8, "pg", "decoupled", -0.5)
    assert arm_from_path("wall/sync/none/k0/pg", 1).replayed is None


def test_comparison_text():
    assert comparison_text(claim_from_config(SPEC)) == (
        "areal/areal_defaults/K2/pg - sync/none/K0/pg; reward_per_1k_tokens; "
        "virtual clock (v100); paired by seed")


def test_each_claim_is_a_plain_sentence_on_the_front_page():
    """What the source said and the verdict on each clock, rows of one claim together; the
    markup characters of a statement escaped, so it reads the same in Markdown and rst."""
    claim = claim_from_config({**SPEC, "statement": "AReaL_style *wins*"})
    rows = [_row("areal", "areal_defaults", 2, s, v) for s, v in enumerate([1.0, 2.0, 3.0])]
    rows += [_row("sync", "none", 0, s, v) for s, v in enumerate([0.0, 0.0, 1.0])]
    (row,) = claims_table([claim], rows, budget_min=20, sesoi=SESOI)
    live = {**row, "clock": "wall", "verdict": SUPPORTED, "basis": "equivalence"}
    other = {**row, "claim": "C6", "statement": "another", "verdict": EQUIVALENT}
    assert claims_findings([row, live, other]) == (
        "- **C5** AReaL\\_style \\*wins\\* (seed 000, Figure 4): **supported** on the emulated "
        "v100; **supported by equivalence** on this machine's clock.\n"
        "- **C6** another (seed 000, Figure 4): **equivalent (no effect that matters)** on the "
        "emulated v100.\n")


def test_the_paper_beside_us_sets_each_claims_figure_beside_its_verdicts():
    """One row per claim statement: the source's figure and reason on the claim's first row
    only, the emulated and live verdicts in their columns, 'not tested' where none."""
    claim = claim_from_config(SPEC)
    rows = [_row("areal", "areal_defaults", 2, s, v) for s, v in enumerate([1.0, 2.0, 3.0])]
    rows += [_row("sync", "none", 0, s, v) for s, v in enumerate([0.0, 0.0, 1.0])]
    (row,) = claims_table([claim], rows, budget_min=20, sesoi=SESOI)
    live = {**row, "clock": "wall", "verdict": SUPPORTED, "basis": "equivalence"}
    threaded = {**row, "statement": "against threaded", "verdict": EQUIVALENT}
    other = {**row, "claim": "C6", "statement": "another", "verdict": CONTRADICTED}
    reported = {"C5": {"figure": "0.153 vs 0.104", "differs": "a tiny | model"}}
    assert paper_beside([row, live, threaded, other], reported).splitlines() == [
        "| claim (source) | the source reported | emulated (v100) | this machine | why they "
        "may differ |",
        "|---|---|---|---|---|",
        "| **C5** AReaL-style has the highest reward per 1k tokens (seed 000, Figure 4) | 0.153 "
        "vs 0.104 | supported | supported "
        "by equivalence | a tiny \\| model |",
        "| **C5** against threaded (seed 000, Figure 4) |  | equivalent (no effect that "
        "matters) | not tested |  |",
        "| **C6** another (seed 000, Figure 4) |  | contradicted | not tested |  |"]
    # two emulated clocks: each verdict names its own
    h100 = {**row, "clock": "h100", "verdict": UNRESOLVED}
    assert "| supported on v100; unresolved at this power on h100 |" in paper_beside(
        [row, h100], {})


BLOCKED = {**SPEC, "id": "C3", "metric": "wall_s", "pairing": "block",
           "contrast": {"wall/areal/areal_defaults/k2/pg": 1, "wall/sync/none/k0/pg": -1}}
SECONDS = {"wall_s": Sesoi(0.05, relative=True, reason="a test")}


def _timed(mode, preset, k, seed, seconds, started):
    return {**_row(mode, preset, k, seed, None, clock="wall"), "wall_s": seconds,
            "started_unix": started}


def test_a_reason_that_says_which_way_ours_goes_is_shown_only_where_it_went_so():
    row = {"claim": "C3", "statement": "async does not improve runtime", "source": "s",
           "clock": "wall", "verdict": SUPPORTED, "basis": "interval", "same_weights": False}
    reported = {"C3": {"figure": "none", "differs": "sync leaves a core idle",
                       "explains": ["contradicted"]}}
    assert "sync leaves a core idle" not in paper_beside([row], reported)
    both = [row, {**row, "clock": "v100", "verdict": CONTRADICTED}]
    assert "sync leaves a core idle" in paper_beside(both, reported)
    # a reason that names no direction is shown whatever the verdicts
    plain = {"C3": {"figure": "none", "differs": "another model"}}
    assert "another model" in paper_beside([row], plain)


def test_the_front_page_says_what_each_virtual_clock_priced_and_what_learned():
    from rlcore.analysis.claims_text import conditions_text

    rows = [{"clock": "v100"}, {"clock": "wall"}]
    priced = {"v100": {"machine": "2x V100, Qwen", "weight_transport": "host",
                       "decode_path": "hf"}}
    text = conditions_text(rows, priced, "models/tiny", 129792)
    assert text.startswith("On the emulated v100 the model that learned is models/tiny "
                           "(129,792 parameters), its seconds priced as on 2x V100, Qwen: a "
                           "hybrid of the one's learning and the other's time; it prices "
                           "weights copied through pageable host memory and Hugging Face's "
                           "eager decoding")
    assert conditions_text([{"clock": "wall"}], priced, "models/tiny") == ""


def test_a_blocked_claim_pairs_by_block_and_gives_the_unpaired_width_beside_it():
    # arm values by block 10, 14, 12 and 9, 12, 11: the machine drifts between blocks
    areal = [_timed("areal", "areal_defaults", 2, s, v, 100 * s + 1)
             for s, v in enumerate([10.0, 14.0, 12.0])]
    sync = [_timed("sync", "none", 0, s, v, 100 * s) for s, v in enumerate([9.0, 12.0, 11.0])]
    (row,) = claims_table([claim_from_config(BLOCKED)], areal + sync, budget_min=20,
                          sesoi=SECONDS)
    # per block 1, 2, 1: mean 4/3, sd sqrt(1/3), se 1/3, t(2) = 4.303 -> half 1.434
    assert row["effect"] == pytest.approx(4 / 3)
    assert row["ci95_half"] == pytest.approx(1.434, abs=1e-3)
    # unpaired on the same runs: var 4 and 7/3 over 3 seeds each, se^2 = 4/3 + 7/9 = 19/9,
    # Welch df = (19/9)^2 / ((4/3)^2 / 2 + (7/9)^2 / 2) = 3.741
    df = (19 / 9) ** 2 / ((4 / 3) ** 2 / 2 + (7 / 9) ** 2 / 2)
    assert row["unpaired_ci95_half"] == pytest.approx(t975(df) * math.sqrt(19 / 9))
    assert row["block_by_block"] is True
    assert "paired by block" in row["comparison"]
    # delta: 5 % of sync's mean 32/3 s
    w = blocked_widths([row])
    assert (w.rows, w.out_of_order) == (1, ())
    assert w.blocked == pytest.approx(row["ci95_half"] / (0.05 * 32 / 3))
    assert w.ratio == pytest.approx(row["ci95_half"] / row["unpaired_ci95_half"])
    assert "the median 95 % half-width is" in claims_markdown([row])


def test_runs_that_did_not_start_block_by_block_are_named():
    claim = claim_from_config(BLOCKED)
    rows = [_timed("areal", "areal_defaults", 2, 0, 10.0, 5.0),
            _timed("sync", "none", 0, 0, 9.0, 0.0),
            _timed("areal", "areal_defaults", 2, 1, 12.0, 3.0),  # seed 1 before seed 0's end
            _timed("sync", "none", 0, 1, 11.0, 7.0)]
    assert ran_block_by_block(claim, rows) is False
    rows[2]["started_unix"] = None  # recorded before runs kept their start
    assert ran_block_by_block(claim, rows) is None
    rows[2]["started_unix"] = 6.0
    assert ran_block_by_block(claim, rows) is True
    rows[2]["started_unix"] = 3.0
    (row,) = claims_table([claim], rows, budget_min=20, sesoi=SECONDS)
    assert blocked_widths([row]).out_of_order == ("C3",)
    assert "the runs of C3 did not start block by block" in claims_markdown([row])


def test_rows_paired_by_seed_or_unpaired_have_no_blocked_paragraph():
    rows = [_row("areal", "areal_defaults", 2, s, v) for s, v in enumerate([1.0, 2.0, 3.0])]
    rows += [_row("sync", "none", 0, s, v) for s, v in enumerate([0.0, 0.0, 1.0])]
    (row,) = claims_table([claim_from_config(SPEC)], rows, budget_min=20, sesoi=SESOI)
    assert math.isnan(row["unpaired_ci95_half"]) and row["block_by_block"] is None
    assert blocked_widths([row]) is None and "block" not in claims_markdown([row])


def _weights(mode, preset, k, seed, digest):
    return {**_row(mode, preset, k, seed, 0.5), "state_digest": digest}


def test_arms_whose_runs_end_in_the_same_weights_are_flagged_and_say_so():
    claim = claim_from_config(SPEC)
    same = [_weights("areal", "areal_defaults", 2, s, f"sha256:{s}") for s in (0, 1)]
    same += [_weights("sync", "none", 0, s, f"sha256:{s}") for s in (0, 1)]
    same.append(_weights("sync", "none", 0, 2, "sha256:x"))  # a seed one arm lacks: not judged
    assert same_weights(claim, same)
    (row,) = claims_table([claim], same, budget_min=20, sesoi=SESOI)
    assert row["same_weights"] is True and row["effect"] == 0
    assert "end in the same weights" in claims_markdown([row])
    # on the front page such a row is listed apart, after the findings, as a check
    other = {**row, "claim": "C1", "same_weights": False}
    findings = claims_findings([row, other])
    assert findings.index("- **C1**") < findings.index("Checks of the method") < \
        findings.index("- **C5**")
    assert "end in the same weights" in claims_findings([row])
    differ = [dict(r) for r in same]
    differ[1]["state_digest"] = "sha256:other"  # one seed's weights differ
    assert not same_weights(claim, differ)
    (row,) = claims_table([claim], differ, budget_min=20, sesoi=SESOI)
    assert row["same_weights"] is False
    assert "same weights" not in claims_markdown([row]) + claims_findings([row])


def test_no_shared_seed_or_no_digest_is_not_the_same_weights():
    claim = claim_from_config(SPEC)
    apart = [_weights("areal", "areal_defaults", 2, 0, "sha256:a"),
             _weights("sync", "none", 0, 1, "sha256:a")]
    assert not same_weights(claim, apart)
    unrecorded = [{**r, "seed": 0, "state_digest": None} for r in apart]
    assert not same_weights(claim, unrecorded)
    one_arm = claim_from_config({**SPEC, "contrast": {"v100/areal/areal_defaults/k2/pg": 1}})
    assert not same_weights(one_arm, apart)  # a quantity against zero compares no runs


def _priced(mode, preset, k, seed, seconds, transport_share, decode_share):
    """A virtual run priced with host copies (where its config would copy GPU to GPU, in
    all but sync, which copies none) and eager decoding (where it would capture steps)."""
    copies = mode != "sync"
    return {**_row(mode, preset, k, seed, None), "wall_s": seconds,
            "priced_weight_transport": "host" if copies else None,
            "config_weight_transport": "device" if copies else None,
            "weight_transport_share": transport_share,
            "priced_decode_path": "hf", "config_decode_path": "graph",
            "decode_path_share": decode_share}


def test_a_virtual_time_verdict_names_the_paths_its_profile_priced_and_their_share():
    from rlcore.analysis.claims_text import priced_condition

    spec = {**SPEC, "id": "C3", "metric": "wall_s", "expect": "positive",
            "contrast": {"v100/areal/areal_defaults/k2/pg": 1, "v100/sync/none/k0/pg": -1}}
    rows = [_priced("areal", "areal_defaults", 2, s, 200.0 + s, share, 0.70)
            for s, share in enumerate([0.40, 0.38])]
    rows += [_priced("sync", "none", 0, s, 180.0 + s, 0.0, 0.50) for s in range(2)]
    (row,) = claims_table([claim_from_config(spec)], rows, budget_min=20, sesoi=SECONDS)
    assert (row["priced_weight_transport"], row["config_weight_transport"]) == ("host", "device")
    # the largest arm's mean share: AReaL-style's (0.40 + 0.38) / 2 and 0.70 against sync's 0.50
    assert row["weight_transport_share"] == pytest.approx(0.39)
    assert row["decode_path_share"] == pytest.approx(0.70)
    assert priced_condition(row) == (
        ", as priced on paths its config would not take on those GPUs: weights copied "
        "through pageable host memory (up to 39% of a run's seconds; its config: through "
        "GPU memory shared by CUDA IPC) and Hugging Face's eager decoding (up to 70% of a "
        "run's seconds; its config: decode steps captured as CUDA graphs)")
    assert priced_condition(row) in claims_findings([row])
    # what the weights score is not the clock's price; and a wall-clock row prices nothing
    assert priced_condition({**row, "metric": "heldout_pass_rate"}) == ""
    assert priced_condition({**row, "clock": "wall"}) == ""
    # runs whose config takes the priced paths carry no condition
    agreed = [{**r, "priced_weight_transport": None, "priced_decode_path": None} for r in rows]
    (row,) = claims_table([claim_from_config(spec)], agreed, budget_min=20, sesoi=SECONDS)
    assert row["priced_weight_transport"] is None and priced_condition(row) == ""


def test_a_model_directorys_parameters_are_read_from_its_safetensors(tiny_model_dir):
    import json

    from rlcore.analysis.tables import model_parameters

    built = json.loads((tiny_model_dir / "rlcore_base.json").read_text())["params"]
    assert model_parameters(tiny_model_dir) == built
    assert model_parameters(tiny_model_dir / "absent") is None
