"""The `chain` task: worked multi-step sums, their slips, the suite and its exact reward."""

import random
import re

import pytest

from rlcore.config import ConfigError, config_from_dict
from rlcore.policy.tiny import _noisy_answer
from rlcore.tasks.chain import chain_problems, chain_prompt, is_chain, slip, worked_chain
from rlcore.tasks.reward import evaluate_response
from rlcore.tasks.suites import load_suite


def test_worked_chain_and_prompt():
    assert chain_prompt([12, 35, 8]) == "12+35+8="
    assert worked_chain([12, 35, 8]) == "12+35=47;47+8=55"
    assert worked_chain([3, 4]) == "3+4=7"


def test_is_chain():
    assert is_chain("3+4=7") and is_chain("12+35=47;47+8=56")  # wrong, but a chain
    assert not is_chain("7") and not is_chain("3+4=7;") and not is_chain("3+4=7;x")


@pytest.mark.parametrize("seed", range(20))
def test_slip_is_a_wrong_chain_carried_through(seed):
    worked = worked_chain([12, 35, 8, 20])
    wrong = slip(worked, random.Random(seed))
    assert wrong != worked and is_chain(wrong)
    steps = [tuple(map(int, re.fullmatch(r"(\d+)\+(\d+)=(\d+)", s).groups()))
             for s in wrong.split(";")]
    assert [b for _, b, _ in steps] == [35, 8, 20]  # the addends are the problem's
    assert all(steps[i + 1][0] == steps[i][2] for i in range(2))  # carried on from the slip
    assert sum(a + b != c for a, b, c in steps) == 1  # exactly one step is wrong


def test_slip_rejects_what_is_not_a_chain():
    with pytest.raises(ValueError, match="not a worked chain"):
        slip("42", random.Random(0))


def test_problems_are_distinct_and_span_the_term_range():
    problems = chain_problems(random.Random(0), 500, 2, 5, 29)
    assert len({tuple(p) for p in problems}) == 500
    assert {len(p) for p in problems} == {2, 3, 4, 5}
    assert all(0 <= x <= 29 for p in problems for x in p)
    with pytest.raises(ValueError, match="9 distinct"):
        chain_problems(random.Random(0), 10, 2, 2, 2)


def _cfg(**task):
    return config_from_dict({"task": {"suite": "chain", **task}})


def test_suite_splits_are_disjoint_sized_and_deterministic():
    cfg = _cfg(train_size=200, heldout_size=50, max_terms=4)
    suite = load_suite(cfg.task)
    train, heldout = suite.split("train"), suite.split("heldout")
    assert (len(train), len(heldout)) == (200, 50)
    assert not {t.prompt for t in train} & {t.prompt for t in heldout}
    assert [t.prompt for t in load_suite(cfg.task).split("train")] == [t.prompt for t in train]
    t = train[0]
    assert t.answer == worked_chain([int(x) for x in t.prompt[:-1].split("+")])
    assert t.meta["terms"] == t.prompt.count("+") + 1


def test_suite_too_small_a_setting_is_a_config_error():
    with pytest.raises(ConfigError, match="task.train_size"):
        load_suite(_cfg(max_operand=2, min_terms=2, max_terms=2, train_size=5,
                        heldout_size=5).task)


def test_min_terms_above_max_terms_is_refused():
    with pytest.raises(ConfigError, match="task.min_terms"):
        _cfg(min_terms=4, max_terms=3)


def test_reward_is_exact_on_the_whole_chain():
    task = load_suite(_cfg(train_size=10, heldout_size=5).task).split("train")[0]
    cfg = _cfg().reward
    assert evaluate_response(task.answer, task, cfg)["pass"]
    assert evaluate_response(f" {task.answer}\n", task, cfg)["pass"]
    final = task.answer.rsplit("=", 1)[1]
    assert not evaluate_response(final, task, cfg)["pass"]  # the answer alone is not enough
    assert not evaluate_response(slip(task.answer, random.Random(0)), task, cfg)["pass"]


def test_warm_start_noise_keeps_a_chain_a_chain():
    rng = random.Random(0)
    worked = worked_chain([5, 6, 7])
    assert is_chain(_noisy_answer(worked, rng)) and _noisy_answer(worked, rng) != worked
    assert _noisy_answer("13", rng).isdigit()
