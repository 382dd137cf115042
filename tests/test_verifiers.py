"""reward.verifier: the verdicts of last_integer, exact and math on hand-picked answers, math's
hard timeout on hostile answers in every execution path, and tasks a verifier cannot judge
refused before a run."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from rlcore.config import ConfigError, RewardConfig, RunConfig, config_from_dict
from rlcore.record.rundir import read_jsonl, validate_summary
from rlcore.replay.replayer import replay_run
from rlcore.runners import run_mode
from rlcore.tasks import reward
from rlcore.tasks.reward import check_tasks, evaluate_response
from rlcore.tasks.suites import Task
from tests.conftest import small_config

# Long enough that a loaded machine (a worker restarting, sympy parsing a new gold) is not
# read as a timeout: these tests are about verdicts; the timeout has its own test below.
MATH = RewardConfig(verifier="math", timeout_sec=10.0)

# (gold answer, response, math-verify's expected verdict). The gold is what a task file's
# preset extracts: GSM8K's '#### N' (separators removed), MATH's last \boxed{...}.
CASES: list[tuple[str, str, bool]] = [
    # one value, many forms
    ("\\frac{1}{2}", "1/2", True),
    ("\\frac{1}{2}", "0.5", True),
    ("0.5", "so it is \\boxed{\\frac{1}{2}}", True),
    ("1.75", "7/4", True),
    ("\\frac{3}{5}", "\\boxed{\\boxed{3/5}}", True),
    ("5\\sqrt{2}", "\\boxed{\\sqrt{50}}", True),
    # thousands separators, units, signs, prose around the answer
    ("1104", "He plants 23 * 48 = 1,104 cabbages.", True),
    ("1048", "\\boxed{1{,}048}", True),
    ("12", "\\boxed{12\\text{ dollars}}", True),
    ("12", "It costs $12.", True),
    ("-4", "Subtracting 7 gives 3x = -12, so x = -4", True),
    ("7", "3 + 4 = 7.", True),
    # near misses
    ("1104", "1105", False),
    ("0.12", "0.125", False),
    ("-4", "x = 4", False),
    ("\\sqrt{2}", "\\boxed{2}", False),
    ("\\frac{1}{3}", "0.33", False),
    ("3", "3, no wait, 4", False),
    ("12", "twelve", False),
    ("12", "\\boxed{}", False),
    ("12", "", False),
    # the last box counts, as in MATH's grading: a corrected answer on the same line, on a
    # line of its own, after a box with nested braces, a box inside prose
    ("5", "\\boxed{3} no wait, \\boxed{5}", True),
    ("3", "\\boxed{3} no wait, \\boxed{5}", False),
    ("5", "first \\boxed{3}\nthen \\boxed{5}", True),
    ("\\frac{1}{2}", "guess \\boxed{\\frac{2}{3}}, then \\boxed{\\frac{1}{2}}", True),
    ("7", "so the total is \\boxed{7} apples", True),
    # a box never closed is no box: math-verify's own read of the text, which finds no 7
    ("7", "a box \\boxed{7 never closed", False),
    # LaTeX outside $...$ or \boxed{} is read as plain text: only the 5 of 5\sqrt{2}
    ("5\\sqrt{2}", "5\\sqrt{2}", False),
    ("5\\sqrt{2}", "$5\\sqrt{2}$", True),
]


@pytest.mark.parametrize(("gold", "response", "expected"), CASES,
                         ids=[f"{g}|{r}" for g, r, _ in CASES])
def test_math_verdicts(gold: str, response: str, expected: bool):
    result = evaluate_response(response, Task("t", "p", answer=gold), MATH)
    assert result["pass"] is expected, result
    assert result["reward"] == float(expected) and "verify_error" not in result


@pytest.mark.parametrize(("verifier", "response", "expected"), [
    ("last_integer", "23 * 48 = 1,104", True),  # the last integer, separators allowed
    ("last_integer", "1104.5", False),          # its last integer is 5
    ("last_integer", "1/2", False),
    ("exact", "1104", True),
    ("exact", " 1104\n", True),                # stripped
    ("exact", "1,104", False),
    ("exact", "the answer is 1104", False),
    ("math", "1104.0", True),
    ("stated", "1104", True),                   # alone
    ("stated", "**1,104**.", True),             # alone, bold, closing period
    ("stated", "23 * 48 = 1104, so", True),     # right after the first '='
    ("stated", "23 times 48 equals 1104.", True),
    ("stated", "The answer is: 1104", True),
    ("stated", "23 * 48 = 1000 + 104 = 1104", False),  # the first '=' states 1000
    ("stated", "we multiply 23 by 48 and get 1104", False),  # stated by no marker
    ("stated", "23 * 48 = about", False),
])
def test_each_verifier_judges_by_its_rule(verifier: Any, response: str, expected: bool):
    cfg = RewardConfig(verifier=verifier)
    assert evaluate_response(response, Task("t", "p", answer="1104"), cfg)["pass"] is expected


HOSTILE = [
    "\\boxed{9^{9^{9^{9}}}}",                           # a power tower, evaluated exactly
    "$2^{2^{2^{2^{2^{2}}}}}$",
    "\\boxed{" + "{" * 3000 + "1" + "}" * 3000 + "}",  # pathological nesting
]


@pytest.mark.parametrize("response", HOSTILE, ids=["9^9^9^9", "2-tower", "nesting"])
def test_a_hostile_answer_scores_0_within_the_timeout(response: str):
    cfg = RewardConfig(verifier="math", timeout_sec=1.0)
    # the workers started (math-verify imported) before the clock starts: the bound is the
    # answer's, not the verifier's start-up
    assert evaluate_response("\\boxed{12}", Task("t", "p", answer="12"), cfg)["pass"]
    t0 = time.monotonic()
    result = evaluate_response(response, Task("t", "p", answer="12"), cfg)
    spent = time.monotonic() - t0
    assert (result["reward"], result["pass"]) == (0.0, False)
    assert result["verify_error"] == "no verdict within reward.timeout_sec=1 s", result
    # the timeout, plus killing one worker and starting another (not waiting for it)
    assert spent < 1.0 + 2.0, spent
    # the killed worker was replaced: the next answer is judged as usual
    assert evaluate_response("\\boxed{12}", Task("t", "p", answer="12"), cfg)["pass"]


def test_math_verdicts_off_the_main_thread_are_real():
    """verl's bug: math-verify's SIGALRM timeout raises off the main thread, and a harness
    that swallowed it scored every answer 0. Here threads get the main thread's verdicts."""
    answers = [(f"the answer is {i}", str(i if i % 3 else i + 1)) for i in range(24)]
    expected = [evaluate_response(r, Task("t", "p", answer=g), MATH)["pass"]
                for r, g in answers]
    got: dict[int, bool] = {}

    def score(i: int) -> None:
        got[i] = evaluate_response(answers[i][0], Task("t", "p", answer=answers[i][1]),
                                   MATH)["pass"]

    threads = [threading.Thread(target=score, args=(i,)) for i in range(len(answers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [got[i] for i in range(len(answers))] == expected
    assert expected.count(True) == 16  # every third gold is off by one


class TestTasksAVerifierCannotJudge:
    def test_a_code_task_needs_the_code_verifier(self):
        task = Task("c1", "def f():", tests=["assert f() == 1"], entry_point="f")
        with pytest.raises(ConfigError, match=r"^train.jsonl: task 'c1' is a code task \(it "
                           r"has tests\): set reward.verifier to 'code' \(it is 'math'\)$"):
            check_tasks([task], MATH, "train.jsonl")

    def test_the_code_verifier_needs_code_tasks(self):
        with pytest.raises(ConfigError, match=r"^h.jsonl: task 'a1' is an answer task: "
                           r"reward.verifier 'code' runs code tasks' tests"):
            check_tasks([Task("a1", "1+1=", answer="2")], RewardConfig(verifier="code"),
                        "h.jsonl")

    @pytest.mark.parametrize("gold", ["x^2+", "\\sqrt", "???"])
    def test_a_gold_answer_math_verify_reads_no_expression_from(self, gold: str):
        tasks = [Task("ok", "p", answer="\\frac{1}{2}"), Task("bad", "p", answer=gold)]
        with pytest.raises(ConfigError) as info:
            check_tasks(tasks, MATH, "math/train.jsonl")
        assert str(info.value) == (
            f"math/train.jsonl: task 'bad': math-verify reads no mathematical expression "
            f"from the gold answer {gold!r}, so it could only compare text: fix the answer "
            "in the file, or set reward.verifier to exact")

    def test_readable_golds_pass(self):
        check_tasks([Task(str(i), "p", answer=g) for i, g in enumerate(
            ["1104", "-4", "\\frac{3}{5}", "5\\sqrt{2}", "0.12", "\\text{(B)}"])], MATH, "f")

    def test_the_code_verifier_on_a_generated_suite_is_refused_with_the_config(self):
        with pytest.raises(ConfigError, match="reward.verifier 'code' runs code tasks' tests, "
                           "and task.suite 'chain' has none"):
            config_from_dict({"task": {"suite": "chain"}, "reward": {"verifier": "code"}})


# --- hostile answers in every execution path ------------------------------------------------

PATHS = ("sync", "async", "areal", "replay")
EVERY = 5  # every fifth response scored is replaced by a power tower


class HostileModel:
    """Once armed, every EVERY-th response scored in this process (every mode scores here)
    becomes a hostile answer before the real verifier sees it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.monkeypatch, self.n, self.hostile = monkeypatch, 0, 0
        self._lock = threading.Lock()
        self._evaluate = reward.evaluate_response

    def _evaluate_some_hostile(self, text: str, task: Task, cfg: RewardConfig, slot: int = 0
                               ) -> dict[str, Any]:
        with self._lock:  # the reward pool's threads score at once
            self.n += 1
            if self.n % EVERY == 0:
                self.hostile += 1
                text = HOSTILE[0]
        return self._evaluate(text, task, cfg, slot)

    def arm(self) -> None:
        self.monkeypatch.setattr(reward, "evaluate_response", self._evaluate_some_hostile)


def math_config(model_dir: Path, mode: str) -> RunConfig:
    return config_from_dict(small_config(
        model_dir, mode=mode, reward={"verifier": "math", "timeout_sec": 1.0, "workers": 2},
        runtime={"progress_every": 0, "save_policy": False}))


@pytest.mark.slow
@pytest.mark.parametrize("path", PATHS)
def test_hostile_answers_score_0_and_are_counted_in_every_path(
        path: str, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    hostile = HostileModel(monkeypatch)
    out = tmp_path / "out"
    if path == "replay":
        run_mode(math_config(tiny_model_dir, "sync"), tmp_path / "original")
        hostile.arm()
        replay_run(tmp_path / "original", out, ["train.objective=behav_clip"])
    else:
        hostile.arm()
        run_mode(math_config(tiny_model_dir, path), out)
    summary = json.loads((out / "summary.json").read_text())
    validate_summary(summary)
    rows = list(read_jsonl(out / "samples.jsonl"))
    timed_out = [r for r in rows if "verify_error" in r]
    assert hostile.hostile > 0
    # every hostile answer scored is a row (a dropped one is still scored and recorded)
    assert len(timed_out) == hostile.hostile == summary["reward"]["verify_errors"]
    assert all(r["reward"] == 0.0 and r["pass"] is False for r in timed_out)
    assert all(r["verify_error"] == "no verdict within reward.timeout_sec=1 s"
               for r in timed_out)
    judged = [r for r in rows if "verify_error" not in r]
    # the other answers got math-verify's real verdicts, whichever thread scored them: the
    # same as scored again here, on the main thread, and not all 0 (verl's bug)
    tasks = {t.task_id: t for t in _train_tasks(tiny_model_dir)}
    for r in judged:
        again = evaluate_response(r["response"], tasks[r["task_id"]], MATH)
        assert again["reward"] == r["reward"], r
    assert sum(r["reward"] for r in judged) > 0


def _train_tasks(model_dir: Path) -> list[Task]:
    from rlcore.tasks.suites import load_suite

    return load_suite(math_config(model_dir, "sync").task).split("train")


SAMPLE = Path(__file__).resolve().parents[1] / "rlcore" / "tasks" / "data" / "gsm8k"


@pytest.mark.parametrize("mode", ["sync", "async", "areal"])
def test_the_gsm8k_sample_trains_and_scores_in_every_mode(mode: str, tiny_model_dir: Path,
                                                          tmp_path: Path):
    """The shipped GSM8K-format sample, judged by math-verify, end to end on the tiny model:
    the pipeline's path works (its quality is not the point)."""
    from rlcore.evaluation import evaluate_run

    cfg = config_from_dict(small_config(
        tiny_model_dir, mode=mode,
        task={"suite": "jsonl", "fields": "gsm8k", "train_path": str(SAMPLE / "train.jsonl"),
              "heldout_path": str(SAMPLE / "heldout.jsonl"),
              "prompt_template": "Question: {prompt}\nAnswer:"},
        rollout={"max_new_tokens": 8, "chunk_tokens": 4, "group_size": 2},
        train={"updates": 2, "update_batch_size": 4},
        reward={"verifier": "math", "timeout_sec": 5.0},
        runtime={"progress_every": 0, "save_policy": True}))
    run_mode(cfg, tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    validate_summary(summary)
    assert summary["updates"] == 2 and summary["reward"]["verify_errors"] == 0
    rows = read_jsonl(tmp_path / "run" / "samples.jsonl")
    train_ids = {f"train-{i}" for i in range(1, 10)}
    assert {r["task_id"] for r in rows} <= train_ids and len(rows) >= 8
    result, path = evaluate_run(tmp_path / "run")
    assert path.name == "eval.json"
    assert result["tasks"] == 4 and result["verify_errors"] == 0
    assert {t["task_id"] for t in result["per_task"]} == {f"heldout-{i}" for i in range(1, 5)}


def test_the_verifier_benchmark_judges_its_answers(cfg: RunConfig):
    """`rlcore bench --verifiers`: four answers in five are right; math-verify finds all of
    them, last_integer the integer golds only, exact none (each response has more than the
    answer in it)."""
    from rlcore.measure.bench import bench_verifiers

    result = bench_verifiers(cfg, 40, 1)
    assert result["passed_of_answers"] == {"last_integer": 8, "exact": 0, "math": 32}
    assert set(result["answers_per_s"]["math"]) == {"cold", "warm"}
