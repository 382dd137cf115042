"""Task suites: the generated arithmetic split and user JSONL files with per-line errors."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from rlcore.config import ConfigError, TaskConfig, config_from_dict
from rlcore.tasks.suites import ArithSuite, JsonlSuite, TaskFileError, load_suite, read_task_file

PROBLEM = re.compile(r"^(\d+)([+\-*])(\d+)=$")


def arith(**task: Any) -> ArithSuite:
    cfg = config_from_dict({"task": {"max_operand": 9, "heldout_size": 20, **task}}).task
    return ArithSuite(cfg)


def problem_count(max_operand: int, operators: list[str]) -> int:
    n = max_operand + 1
    per_op = {"+": n * n, "*": n * n, "-": n * (n + 1) // 2}
    return sum(per_op[op] for op in operators)


def jsonl_config(train: Path, heldout: Path) -> TaskConfig:
    return config_from_dict({"task": {"suite": "jsonl", "train_path": str(train),
                                      "heldout_path": str(heldout)}}).task


def write_lines(path: Path, lines: list[Any]) -> Path:
    """Write one line per item: dicts as JSON, strings verbatim."""
    path.write_text("".join((json.dumps(x) if isinstance(x, dict) else x) + "\n"
                            for x in lines))
    return path


class TestArithDeterminism:
    def test_same_seed_gives_the_same_tasks_in_the_same_order(self) -> None:
        a, b = arith(split_seed=5), arith(split_seed=5)
        for split in ("train", "heldout"):
            assert a.split(split) == b.split(split)

    def test_another_seed_gives_another_split(self) -> None:
        a, b = arith(split_seed=5), arith(split_seed=6)
        assert [t.task_id for t in a.split("heldout")] != [t.task_id for t in b.split("heldout")]
        # Same problems overall, only split differently.
        assert ({t.task_id for t in a.split("train") + a.split("heldout")}
                == {t.task_id for t in b.split("train") + b.split("heldout")})

    def test_load_suite_picks_arith(self) -> None:
        suite = load_suite(config_from_dict({"task": {"max_operand": 3,
                                                      "heldout_size": 4}}).task)
        assert suite.name == "arith"
        assert len(suite.split("heldout")) == 4


class TestArithSplit:
    @pytest.mark.parametrize("operators", [["+"], ["-"], ["*"], ["+", "-", "*"]])
    def test_disjoint_and_sizes_add_up(self, operators: list[str]) -> None:
        suite = arith(max_operand=6, operators=operators, heldout_size=10)
        train, heldout = suite.split("train"), suite.split("heldout")
        assert len(heldout) == 10
        assert len(train) + len(heldout) == problem_count(6, operators)
        assert not {t.prompt for t in train} & {t.prompt for t in heldout}
        ids = [t.task_id for t in train + heldout]
        assert len(ids) == len(set(ids))

    def test_answers_are_correct(self) -> None:
        suite = arith(max_operand=12, operators=["+", "-", "*"], heldout_size=50)
        tasks = suite.split("train") + suite.split("heldout")
        for t in tasks:
            m = PROBLEM.match(t.prompt)
            assert m, t.prompt
            a, op, b = int(m[1]), m[2], int(m[3])
            assert 0 <= a <= 12 and 0 <= b <= 12
            expected = {"+": a + b, "-": a - b, "*": a * b}[op]
            assert t.answer == str(expected), t.prompt
            assert t.kind == "answer"

    def test_subtraction_never_goes_negative_and_keeps_every_valid_pair(self) -> None:
        suite = arith(max_operand=9, operators=["-"], heldout_size=5)
        tasks = suite.split("train") + suite.split("heldout")
        assert all(int(t.answer) >= 0 for t in tasks)
        pairs = {tuple(map(int, PROBLEM.match(t.prompt).group(1, 3))) for t in tasks}
        assert pairs == {(a, b) for a in range(10) for b in range(a + 1)}

    @pytest.mark.parametrize("heldout_size", [100, 101])
    def test_heldout_as_large_as_the_problem_set_is_rejected(self, heldout_size: int) -> None:
        with pytest.raises(ConfigError, match="task.heldout_size") as info:
            arith(max_operand=9, heldout_size=heldout_size)
        assert "100" in str(info.value)

    def test_one_training_task_left_is_enough(self) -> None:
        suite = arith(max_operand=9, heldout_size=99)
        assert len(suite.split("train")) == 1

    def test_repeated_operator_cannot_leak_heldout_into_train(self) -> None:
        try:
            suite = arith(max_operand=3, operators=["+", "+"], heldout_size=5)
        except ConfigError:
            return
        assert not ({t.prompt for t in suite.split("train")}
                    & {t.prompt for t in suite.split("heldout")})


class TestJsonlGoodFile:
    def test_answer_and_code_tasks_load(self, tmp_path: Path) -> None:
        path = write_lines(tmp_path / "train.jsonl", [
            {"id": "q1", "prompt": "2+2=", "answer": "4"},
            {"prompt": "Capital of France?", "answer": "Paris", "meta": {"src": "geo"}},
            {"id": 7, "prompt": "6*7=", "answer": 42},
            {"id": "c1", "prompt": "def add(a, b):", "tests": ["assert add(1, 2) == 3"],
             "entry_point": "add"},
        ])
        tasks = read_task_file(path)
        assert [t.task_id for t in tasks] == ["q1", "train-2", "7", "c1"]
        assert [t.kind for t in tasks] == ["answer", "answer", "answer", "code"]
        assert tasks[0].answer == "4" and tasks[0].tests is None
        assert tasks[1].meta == {"src": "geo"}
        assert tasks[2].answer == "42"  # numbers become reference strings
        assert tasks[3].answer is None
        assert tasks[3].tests == ["assert add(1, 2) == 3"]
        assert tasks[3].entry_point == "add"

    def test_blank_lines_are_skipped_but_counted(self, tmp_path: Path) -> None:
        path = write_lines(tmp_path / "t.jsonl", [
            "", {"prompt": "1+1=", "answer": "2"}, "   ", {"prompt": "1+2=", "answer": "3"}, "",
        ])
        tasks = read_task_file(path)
        assert [t.prompt for t in tasks] == ["1+1=", "1+2="]
        # Default ids come from the real line number, blank lines included.
        assert [t.task_id for t in tasks] == ["t-2", "t-4"]

    def test_suite_from_two_files(self, tmp_path: Path) -> None:
        train = write_lines(tmp_path / "train.jsonl", [{"prompt": "1+1=", "answer": "2"},
                                                       {"prompt": "2+2=", "answer": "4"}])
        heldout = write_lines(tmp_path / "heldout.jsonl", [{"prompt": "3+3=", "answer": "6"}])
        suite = load_suite(jsonl_config(train, heldout))
        assert isinstance(suite, JsonlSuite)
        assert [t.prompt for t in suite.split("train")] == ["1+1=", "2+2="]
        assert [t.prompt for t in suite.split("heldout")] == ["3+3="]

    def test_unicode_line_separator_inside_a_string(self, tmp_path: Path) -> None:
        path = tmp_path / "u.jsonl"
        rows = [{"prompt": "a\u2028b=", "answer": "1"}, {"prompt": "c=", "answer": "2"}]
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                        encoding="utf-8")
        assert [t.prompt for t in read_task_file(path)] == ["a\u2028b=", "c="]


GOOD = {"prompt": "1+1=", "answer": "2"}


class TestJsonlBadLines:
    @pytest.mark.parametrize(("bad", "fragment"), [
        ('{"prompt": "2+2=", "answer": "4"', "not valid JSON"),
        ({"answer": "4"}, "'prompt' is a required property"),
        ({"prompt": "2+2=", "answer": "4", "tests": ["assert True"]},
         "exactly one of 'answer' or 'tests'"),
        ({"prompt": "2+2="}, "exactly one of 'answer' or 'tests'"),
        ({"prompt": "2+2=", "answer": "4", "difficulty": 3}, "difficulty"),
        ({"prompt": "", "answer": "4"}, "prompt"),
        ({"prompt": "2+2=", "tests": []}, "tests"),
        ('["prompt", "answer"]', "object"),
    ], ids=["malformed-json", "no-prompt", "answer-and-tests", "neither", "unknown-field",
            "empty-prompt", "empty-tests", "not-an-object"])
    def test_bad_third_line(self, tmp_path: Path, bad: Any, fragment: str) -> None:
        path = write_lines(tmp_path / "tasks.jsonl",
                           [GOOD, {"prompt": "1+2=", "answer": "3"}, bad, GOOD])
        with pytest.raises(TaskFileError) as info:
            read_task_file(path)
        msg = str(info.value)
        assert msg.startswith(f"{path}:3: ")
        assert fragment in msg[len(f"{path}:3: "):]

    def test_duplicate_id_reports_the_second_line(self, tmp_path: Path) -> None:
        path = write_lines(tmp_path / "tasks.jsonl", [
            {"id": "a", "prompt": "1+1=", "answer": "2"},
            {"id": "b", "prompt": "1+2=", "answer": "3"},
            {"id": "a", "prompt": "1+3=", "answer": "4"},
        ])
        with pytest.raises(TaskFileError, match=r"tasks\.jsonl:3: duplicate task id 'a'"):
            read_task_file(path)

    def test_line_number_counts_blank_lines(self, tmp_path: Path) -> None:
        path = write_lines(tmp_path / "tasks.jsonl", [GOOD, "", "", "{oops"])
        with pytest.raises(TaskFileError, match=r"tasks\.jsonl:4: not valid JSON"):
            read_task_file(path)

    def test_task_file_error_is_a_config_error(self, tmp_path: Path) -> None:
        path = write_lines(tmp_path / "tasks.jsonl", ["{oops"])
        with pytest.raises(ConfigError):
            read_task_file(path)

    def test_file_of_only_blank_lines_holds_no_tasks(self, tmp_path: Path) -> None:
        path = write_lines(tmp_path / "empty.jsonl", ["", "  "])
        with pytest.raises(TaskFileError, match="holds no tasks"):
            read_task_file(path)

    def test_missing_file(self, tmp_path: Path) -> None:
        with pytest.raises(TaskFileError, match="does not exist") as info:
            read_task_file(tmp_path / "absent.jsonl")
        assert "absent.jsonl" in str(info.value)

    def test_missing_heldout_file_through_the_suite(self, tmp_path: Path) -> None:
        train = write_lines(tmp_path / "train.jsonl", [GOOD])
        with pytest.raises(TaskFileError, match="heldout.jsonl"):
            load_suite(jsonl_config(train, tmp_path / "heldout.jsonl"))

    def test_bad_line_in_heldout_file_names_that_file(self, tmp_path: Path) -> None:
        train = write_lines(tmp_path / "train.jsonl", [GOOD])
        heldout = write_lines(tmp_path / "heldout.jsonl",
                              [{"prompt": "5+5=", "answer": "10"}, {"prompt": "x"}])
        with pytest.raises(TaskFileError, match=r"heldout\.jsonl:2: "):
            load_suite(jsonl_config(train, heldout))


class TestJsonlSplitOverlap:
    def test_prompt_in_both_files_is_rejected(self, tmp_path: Path) -> None:
        train = write_lines(tmp_path / "train.jsonl", [
            {"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4"},
        ])
        heldout = write_lines(tmp_path / "heldout.jsonl", [
            {"prompt": "3+3=", "answer": "6"}, {"id": "other", "prompt": "2+2=", "answer": "4"},
        ])
        with pytest.raises(TaskFileError, match="1 prompt") as info:
            JsonlSuite(jsonl_config(train, heldout))
        assert "'2+2='" in str(info.value)
        assert "disjoint" in str(info.value)
