"""The generation loop (`rlcore/policy/generation.py`) by hand, on the planner's model-free
sampler: which rows are cut and when, what is re-prefilled, and what goes on after a cut."""

from __future__ import annotations

import pytest

from rlcore.clock.work import Prefill, Work
from rlcore.plan.sampler import LengthSampler
from rlcore.policy.generation import generate


class Script:
    """A look that swaps to version 1 after `swap_at` (a chunk) and cuts `cut_rows` after
    `cut_at`; it records what it was asked."""

    def __init__(self, sampler: LengthSampler, swap_at: int | None = None,
                 cut_at: int | None = None, cut_rows: list[int] | None = None,
                 reason: str = "stop"):
        self.sampler, self.swap_at, self.cut_at = sampler, swap_at, cut_at
        self.cut_rows, self.reason = cut_rows, reason
        self.asked: list[tuple[str, int]] = []

    def cut(self, running: list[int]) -> tuple[str, list[int]] | None:
        self.asked.append(("cut", self.sampler.chunks))
        if self.sampler.chunks == self.cut_at:
            return self.reason, running if self.cut_rows is None else self.cut_rows
        return None

    def swap(self) -> int | None:
        self.asked.append(("swap", self.sampler.chunks))
        return 1 if self.sampler.chunks == self.swap_at else None


def sampler(charged: list[Work], draws: list[tuple[int, bool]], cap: int = 8) -> LengthSampler:
    """Prompts of 2 tokens each; row i stops after draws[i] tokens (or runs to the cap)."""
    return LengthSampler(charged.append, [[0, 0]] * len(draws), draws, cap)


def test_without_a_look_the_batch_runs_to_its_end():
    s = sampler([], [(1, True), (5, True), (8, False)])
    out = generate(s, 2, "resubmit")
    # rows sample 1 + 5 + 8 tokens over 4 chunks of 2 steps
    assert (out.sampled, s.chunks, out.cut, out.kept(3)) == (14, 4, {}, [0, 1, 2])


def test_resubmit_cuts_the_running_rows_at_the_swap():
    s = sampler([], [(1, True), (5, True), (8, False)])
    look = Script(s, swap_at=1)
    out = generate(s, 2, "resubmit", look)
    # after chunk 1 (2 steps): row 0 ended at 1 token, rows 1 and 2 have 2 tokens each
    assert out.cut == {1: 2, 2: 2} and out.cut_reason == "interrupt" and out.cut_after == 1
    assert out.kept(3) == [0] and out.sampled == 5
    assert look.asked == [("cut", 1), ("swap", 1)]  # nothing is asked after the cut


@pytest.mark.parametrize("interrupt", ["continue", "keep_kv"])
def test_continue_and_keep_kv_go_on_counting_the_running_rows_tokens(interrupt: str):
    charged: list[Work] = []
    s = sampler(charged, [(1, True), (5, True), (8, False)])
    out = generate(s, 2, interrupt, Script(s, swap_at=2))
    # after chunk 2 (4 steps): rows 1 and 2 run with 4 tokens each
    assert (out.reprefilled, out.kv_kept) == ((8, 0) if interrupt == "continue" else (0, 8))
    assert out.cut == {} and out.kept(3) == [0, 1, 2] and out.sampled == 14
    reprefills = [w for w in charged if isinstance(w, Prefill)][1:]
    # a re-prefill recomputes every row's prompt and 4 response positions: 3 x (2 + 4)
    assert reprefills == ([Prefill(calls=1, tokens=18)] if interrupt == "continue" else [])


def test_a_stop_cuts_a_row_at_the_cap_even_when_the_batch_is_done():
    s = sampler([], [(1, True), (2, False)], cap=2)
    out = generate(s, 2, "resubmit", Script(s, cut_at=1))
    # the cap ended the batch after chunk 1; the capped row never sampled a stop token
    assert out.cut == {1: 2} and out.cut_reason == "stop" and out.kept(2) == [0]


def test_after_a_recorded_cut_the_kept_rows_that_still_run_go_on():
    s = sampler([], [(1, True), (5, True), (8, False)])
    look = Script(s, cut_at=1, cut_rows=[2], reason="interrupt")
    out = generate(s, 2, "resubmit", look)
    # row 2 is cut with 2 tokens; row 1 is kept and runs to its stop token at 5, where the
    # loop ends (row 2 would run to the cap)
    assert out.cut == {2: 2} and out.kept(3) == [0, 1] and s.chunks == 3
    assert s.length(1) == 5 and s.finished(1)
    assert look.asked == [("cut", 1)]
