"""The reward harness: answer parsing and exact-match scoring."""

from __future__ import annotations

import pytest

from rlcore.config import RewardConfig
from rlcore.tasks.reward import evaluate_response, parse_answer
from rlcore.tasks.suites import Task


def answer_task(answer: str) -> Task:
    return Task(task_id="t1", prompt="?", answer=answer)


@pytest.mark.parametrize(("text", "expected"), [
    ("7", "7"),
    ("the answer is 12", "12"),
    ("3+4 is 7, so 7", "7"),
    ("-5", "-5"),
    ("1,234", "1234"),
    ("007", "7"),
    ("", None),
    ("no digits", None),
    ("12 apples and 30 pears", "30"),
    ("the answer is 12.", "12"),
    ("  42\n", "42"),
    ("-0", "0"),
])
def test_parse_answer(text: str, expected: str | None) -> None:
    assert parse_answer(text) == expected


class TestEvaluateResponse:
    def test_exact_match_passes(self) -> None:
        result = evaluate_response("7", answer_task("7"), RewardConfig())
        assert result["reward"] == 1.0
        assert result["pass"] is True
        assert result["parsed"] == "7"
        assert result["eval_s"] >= 0.0

    def test_wrong_answer_fails(self) -> None:
        result = evaluate_response("8", answer_task("7"), RewardConfig())
        assert result["reward"] == 0.0
        assert result["pass"] is False
        assert result["parsed"] == "8"

    def test_working_before_the_right_last_number_passes(self) -> None:
        result = evaluate_response("3+4 is 7, so the answer is 7", answer_task("7"), RewardConfig())
        assert result["pass"] is True
        assert result["reward"] == 1.0

    def test_right_number_not_last_fails(self) -> None:
        assert evaluate_response("7, or maybe 8", answer_task("7"), RewardConfig())["pass"] is False

    def test_a_larger_number_containing_the_answer_fails(self) -> None:
        assert evaluate_response("17", answer_task("7"), RewardConfig())["pass"] is False

    def test_response_without_a_number_fails(self) -> None:
        result = evaluate_response("I don't know", answer_task("7"), RewardConfig())
        assert result == {**result, "reward": 0.0, "pass": False, "parsed": None}

    @pytest.mark.parametrize(("response", "reference"), [
        ("1234", "1,234"), ("1,234", "1234"), ("7", "007"), ("-5", "-5"),
    ])
    def test_numbers_are_compared_normalised(self, response: str, reference: str) -> None:
        assert evaluate_response(response, answer_task(reference), RewardConfig())["pass"] is True

    def test_sign_matters(self) -> None:
        assert evaluate_response("5", answer_task("-5"), RewardConfig())["pass"] is False

    def test_non_numeric_reference_needs_the_exact_stripped_text(self) -> None:
        task = answer_task("Paris")
        ok = evaluate_response("  Paris\n", task, RewardConfig())
        assert (ok["pass"], ok["reward"], ok["parsed"]) == (True, 1.0, "Paris")
        for wrong in ("paris", "The answer is Paris", "Paris."):
            assert evaluate_response(wrong, task, RewardConfig())["pass"] is False, wrong

    def test_decimal_reference_is_matched_as_text(self) -> None:
        task = answer_task("3.5")
        assert evaluate_response("3.5", task, RewardConfig())["pass"] is True
        # Not an integer reference, so the last-integer rule does not apply.
        assert evaluate_response("it is 3.5", task, RewardConfig())["pass"] is False

    def test_code_task_runs_its_tests(self) -> None:
        task = Task(task_id="c1", prompt="def f():", tests=["assert f() == 1"],
                    entry_point="f")
        good = evaluate_response("```python\ndef f():\n    return 1\n```", task,
                                 RewardConfig(verifier="code"))
        assert good["pass"] is True and good["reward"] == 1.0 and good["tests_passed"] == 1
        bad = evaluate_response("def f():\n    return 2", task, RewardConfig(verifier="code"))
        assert bad["pass"] is False and bad["reward"] == 0.0
