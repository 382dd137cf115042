"""Prompt-level audit of dropping stale samples (claim C8): per-prompt trained shares, lengths and
pass rates, the binned shares and short_bias, checked against values worked out by hand."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from rlcore.analysis.figures.prompts import PASS_EDGES, draw_prompt_audit
from rlcore.analysis.prompts import (
    binned_shares,
    cause_bias,
    final_rows,
    length_terciles,
    prompt_rows,
    run_prompt_audit,
    short_bias,
    trained_share,
    unanswered,
)


def row(group: int, slot: int, tokens: int, *, status: str = "accepted",
        batch: int | None = 0, passed: bool = False, attempt: int = 0,
        task: str | None = None) -> dict[str, Any]:
    """The samples.jsonl fields the audit reads (a dropped row is never trained); a group's
    reference answer has ANSWER_CHARS[group] characters."""
    if status != "accepted":
        batch = None
    return {"task_id": task or f"t{group}", "answer_chars": ANSWER_CHARS.get(group),
            "group_id": group, "slot": slot, "attempt": attempt,
            "status": status, "batch_id": batch, "pass": passed and status != "dropped_interrupted",
            "response_tokens": tokens}


# group 2 (never answered) has the longest reference answer; group 3 is group 0's task again
ANSWER_CHARS = {0: 20, 1: 8, 2: 40, 3: 20, 4: 12, 5: 25}
SAMPLES = [
    # group 0: trained, accepted-never-trained, a resubmitted slot (its row is attempt 1),
    # a stale drop
    row(0, 0, 10, passed=True),
    row(0, 1, 20, batch=None),
    row(0, 2, 30, batch=1, passed=True, attempt=1),
    row(0, 3, 40, status="dropped_stale"),
    # group 1: one slot cut for good after 5 tokens on its last allowed attempt (attempt 2)
    row(1, 4, 6, passed=True), row(1, 5, 8, passed=True),
    row(1, 6, 5, status="dropped_interrupted", attempt=2),
    row(1, 7, 7, batch=1),
    # group 2: every slot cut for good: no response at all
    row(2, 8, 12, status="dropped_interrupted", attempt=2),
    row(2, 9, 16, status="dropped_interrupted", attempt=2),
    # group 3: the same task as group 0, drawn again
    row(3, 10, 50, batch=2, task="t0"), row(3, 11, 60, status="dropped_stale", task="t0"),
    # group 4: all three trained
    row(4, 12, 15, batch=2, passed=True), row(4, 13, 15, batch=2, passed=True),
    row(4, 14, 15, batch=2),
    # group 5: one slot, its length 25 tied with group 0's
    row(5, 15, 25, batch=3, passed=True),
]


def prompts() -> list[dict[str, Any]]:
    return prompt_rows(SAMPLES)


def by_group() -> dict[int, dict[str, Any]]:
    return {p["group_id"]: p for p in prompts()}


class TestPromptRows:
    def test_group_with_every_fate(self):
        # slots 0..3; trained: slot 0 (batch 0) and slot 2 (batch 1) -> 2/4;
        # lengths over all four responses (a stale drop has one): (10+20+30+40)/4 = 25;
        # passes 1,0,1,0 -> 0.5
        assert by_group()[0] == {"group_id": 0, "task_id": "t0", "answer_chars": 20,
                                 "samples": 4, "trained": 2, "dropped_stale": 1,
                                 "dropped_interrupted": 0,
                                 "trained_share": 0.5, "length": 25.0, "pass_rate": 0.5,
                                 "cut": None}

    def test_a_slot_cut_for_good_counts_as_a_sample_but_has_no_length(self):
        # 4 slots, 3 trained -> 0.75; length over the three responses (6+8+7)/3 = 7;
        # passes 1,1,0 over those three -> 2/3; the cut slot had 5 tokens
        g = by_group()[1]
        assert (g["samples"], g["trained"], g["trained_share"]) == (4, 3, 0.75)
        assert g["length"] == 7.0
        assert g["pass_rate"] == pytest.approx(2 / 3)
        assert g["cut"] == 5

    def test_a_group_without_response_has_no_length_or_pass_rate(self):
        assert by_group()[2] == {"group_id": 2, "task_id": "t2", "answer_chars": 40,
                                 "samples": 2, "trained": 0, "dropped_stale": 0,
                                 "dropped_interrupted": 2,
                                 "trained_share": 0.0, "length": None, "pass_rate": None,
                                 "cut": 16}
        assert [p["group_id"] for p in unanswered(prompts())] == [2]

    def test_one_row_per_group_in_group_order(self):
        assert [p["group_id"] for p in prompt_rows(reversed(SAMPLES))] == [0, 1, 2, 3, 4, 5]
        # group 3 draws group 0's task again: still a prompt of its own
        assert by_group()[3]["task_id"] == "t0"
        assert (by_group()[3]["length"], by_group()[3]["pass_rate"]) == (55.0, 0.0)

    def test_a_slot_counts_once_by_its_last_attempt(self):
        # an earlier attempt of slot 2 recorded as a row (after the final one, even) must not
        # add a sample or a length: group 0 stays as it was
        earlier = row(0, 2, 4, status="dropped_interrupted", attempt=0)
        assert prompt_rows([*SAMPLES, earlier])[0] == by_group()[0]
        assert prompt_rows([earlier, *SAMPLES])[0] == by_group()[0]
        assert len(final_rows([*SAMPLES, earlier])) == len(SAMPLES)

    def test_overall_trained_share(self):
        # trained 2+3+0+1+3+1 = 10 of 4+4+2+2+3+1 = 16 slots
        assert trained_share(prompts()) == 10 / 16
        assert trained_share([]) is None


class TestBins:
    def test_length_terciles_by_hand(self):
        # lengths (group): 7 (1), 15 (4), 25 (0), 25 (5), 55 (3); group 2 has none.
        # N=5 -> ranks [0], [1, 2], [3, 4]: the tie at 25 splits by group id, 0 before 5
        short, mid, long = length_terciles(prompts(), "length")
        assert short == {"prompts": 1, "length": 7.0, "low": 7.0, "high": 7.0,
                         "samples": 4, "trained": 3, "trained_share": 0.75,
                         "dropped_stale_share": 0.0, "dropped_interrupted_share": 0.25}
        # groups 4 and 0: (15+25)/2 = 20; trained 3+2 of 3+4 slots, one dropped as stale
        assert mid == {"prompts": 2, "length": 20.0, "low": 15.0, "high": 25.0,
                       "samples": 7, "trained": 5, "trained_share": 5 / 7,
                       "dropped_stale_share": 1 / 7, "dropped_interrupted_share": 0.0}
        # groups 5 and 3: (25+55)/2 = 40; trained 1+1 of 1+2 slots
        assert long == {"prompts": 2, "length": 40.0, "low": 25.0, "high": 55.0,
                        "samples": 3, "trained": 2, "trained_share": 2 / 3,
                        "dropped_stale_share": 1 / 3, "dropped_interrupted_share": 0.0}

    def test_the_split_does_not_depend_on_input_order(self):
        shuffled = prompts()
        random.Random(0).shuffle(shuffled)
        assert length_terciles(shuffled, "length") == length_terciles(prompts(), "length")

    def test_pass_rate_quantile_bins(self):
        # pass rates (group): 0 (3), 0.5 (0), 2/3 (1), 2/3 (4), 1 (5) -> [3], [0, 1], [4, 5]
        low, mid, high = binned_shares(prompts(), "pass_rate", 3)
        assert (low["prompts"], low["pass_rate"], low["trained_share"]) == (1, 0.0, 0.5)
        # trained 2+3 of 4+4; mean pass (1/2 + 2/3)/2 = 7/12
        assert (mid["samples"], mid["trained_share"]) == (8, 5 / 8)
        assert mid["pass_rate"] == pytest.approx(7 / 12)
        # trained 3+1 of 3+1; mean pass (2/3 + 1)/2 = 5/6
        assert (high["samples"], high["trained_share"]) == (4, 1.0)
        assert high["pass_rate"] == pytest.approx(5 / 6)

    def test_pass_rate_bins_by_edges(self):
        # edges 0, 1/8, 3/8, 5/8, 7/8, 1: 0 -> bin 0; 1/2 -> bin 2; 2/3, 2/3 -> bin 3;
        # 1 -> bin 4 (the last bin is closed); bin 1 is empty
        bins = binned_shares(prompts(), "pass_rate", PASS_EDGES)
        assert [b["prompts"] for b in bins] == [1, 0, 1, 2, 1]
        assert bins[1] == {"prompts": 0, "pass_rate": None, "low": None, "high": None,
                           "samples": 0, "trained": 0, "trained_share": None,
                           "dropped_stale_share": None, "dropped_interrupted_share": None}
        assert [b["trained_share"] for b in bins] == [0.5, None, 0.5, 6 / 7, 1.0]

    def test_more_bins_than_prompts_leaves_bins_empty(self):
        bins = binned_shares(prompts(), "length", 10)
        assert sum(b["prompts"] for b in bins) == 5
        assert [b["prompts"] for b in bins].count(0) == 5


class TestShortBias:
    def test_by_hand(self):
        # long tercile 2/3 minus short tercile 3/4 = -1/12: long problems trained less
        assert short_bias(prompts(), "length") == pytest.approx(-1 / 12)
        assert short_bias(prompts(), "length") < 0

    def test_by_answer_length_every_prompt_counts(self):
        # answer chars (group): 8 (1), 12 (4), 20 (0), 20 (3), 25 (5), 40 (2): group 2, never
        # answered, is on this axis. Short: groups 1, 4, trained 3+3 of 4+3; long: groups 5,
        # 2, trained 1+0 of 1+2: 1/3 - 6/7 = -11/21
        assert short_bias(prompts()) == pytest.approx(1 / 3 - 6 / 7)
        short, mid, long = length_terciles(prompts())
        assert (short["answer_chars"], mid["answer_chars"], long["answer_chars"]) == (
            10.0, 20.0, 32.5)
        assert mid["trained_share"] == 0.5  # groups 0 and 3: 2 of 4 and 1 of 2

    def test_each_drop_cause_makes_its_part_of_the_bias(self):
        # by answer length: short groups 1, 4 (7 slots: 0 stale, 1 interrupted), middle
        # groups 0, 3 (6 slots: 2 stale), long groups 5, 2 (3 slots: 0 stale, 2
        # interrupted). Stale: 0 - 0; interrupted: 1/7 - 2/3 = -11/21, the whole short_bias
        assert cause_bias(prompts(), "dropped_stale") == 0.0
        assert cause_bias(prompts(), "dropped_interrupted") == pytest.approx(1 / 7 - 2 / 3)
        assert cause_bias(prompts(), "dropped_interrupted") == pytest.approx(
            short_bias(prompts()))
        _, middle, _ = length_terciles(prompts())
        assert middle["dropped_stale_share"] == pytest.approx(2 / 6)
        assert cause_bias([], "dropped_stale") is None

    def test_positive_when_long_problems_are_trained_more(self):
        rows = [row(0, 0, 5, status="dropped_stale"), row(0, 1, 5),   # short: 1 of 2
                row(1, 2, 9), row(1, 3, 9),                           # middle: 2 of 2
                row(2, 4, 20), row(2, 5, 20)]                         # long: 2 of 2
        assert short_bias(prompt_rows(rows), "length") == 1.0 - 0.5

    def test_none_below_three_prompts_with_a_length(self):
        # group 2 has no response: groups 0 and 1 are the only prompts with a length
        two = [r for r in SAMPLES if r["group_id"] in (0, 1, 2)]
        assert short_bias(prompt_rows(two), "length") is None
        assert short_bias(prompt_rows([r for r in SAMPLES if r["group_id"] == 2]),
                          "length") is None
        assert short_bias([]) is None
        # a third prompt with a length makes one prompt per tercile: group 3 (0.5) minus
        # group 1 (0.75)
        three = [r for r in SAMPLES if r["group_id"] in (0, 1, 2, 3)]
        assert short_bias(prompt_rows(three), "length") == 0.5 - 0.75


def write_run(run_dir: Path, samples: list[dict[str, Any]]) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in samples))
    return run_dir


class TestRuns:
    def test_run_prompt_audit(self, tmp_path: Path):
        audit = run_prompt_audit(write_run(tmp_path / "run", SAMPLES))
        assert {k: audit[k] for k in ("prompts", "trained_share", "no_response",
                                      "no_response_samples")} == {
            "prompts": 6, "trained_share": 10 / 16, "no_response": 1, "no_response_samples": 2}
        assert audit["short_bias"] == pytest.approx(1 / 3 - 6 / 7)
        assert [b["trained_share"] for b in audit["length_terciles"]] == [6 / 7, 0.5, 1 / 3]
        assert [b["prompts"] for b in audit["pass_terciles"]] == [1, 2, 2]
        json.dumps(audit)  # it goes into tables and reports as it is

    def test_draw_prompt_audit_writes_png_and_svg(self, tmp_path: Path):
        k1 = write_run(tmp_path / "k1", SAMPLES)
        # a second K whose long prompts were all trained
        k8 = write_run(tmp_path / "k8", [{**r, "batch_id": 0} if r["status"] == "accepted"
                                         else r for r in SAMPLES])
        png, svg = tmp_path / "prompts.png", tmp_path / "prompts.svg"
        draw_prompt_audit({8: [k8], 1: [k1, k1]}, png, svg, title="prompt audit", min_prompts=1)
        assert png.stat().st_size > 0 and svg.stat().st_size > 0
        assert "prompt audit" in svg.read_text()
