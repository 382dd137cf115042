"""Task files as datasets ship them: the gsm8k and math field presets, their answer extraction,
per-line errors, Parquet files, the prompt template and system prompt, and the shipped
samples."""

from __future__ import annotations

import ast
import json
import typing
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlcore.config import TaskConfig, config_from_dict
from rlcore.tasks.fields import PRESETS, FieldError, boxed_answer, gsm8k_answer
from rlcore.tasks.suites import TaskFileError, load_suite, read_task_file

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "rlcore" / "tasks" / "data"


def write_lines(path: Path, lines: list[Any]) -> Path:
    """Write one line per item: dicts as JSON, strings verbatim."""
    path.write_text("".join((json.dumps(x) if isinstance(x, dict) else x) + "\n"
                            for x in lines))
    return path


def write_parquet(path: Path, rows: pa.Table | list[dict[str, Any]]) -> Path:
    """Write rows (or a table, for explicit column types) as one Parquet file; a column some
    rows lack is null in those rows."""
    if not isinstance(rows, pa.Table):
        columns = list(dict.fromkeys(k for row in rows for k in row))
        rows = pa.table({c: [row.get(c) for row in rows] for c in columns})
    pq.write_table(rows, path)
    return path


def file_config(train: Path, heldout: Path, **task: Any) -> TaskConfig:
    model = {"prompt_format": "chat"} if task.get("system_prompt") else {}
    return config_from_dict({"model": model, "task": {
        "suite": "jsonl", "train_path": str(train), "heldout_path": str(heldout), **task}}).task


class TestGsm8kAnswer:
    @pytest.mark.parametrize(("text", "gold"), [
        ("She has 3 + 4 = <<3+4=7>>7 apples.\n#### 7", "7"),
        ("1,000 + 234 = 1,234\n#### 1,234", "1234"),
        ("#### 1,234,567", "1234567"),
        ("It fell 4 - 11 = -7.\n#### -7", "-7"),
        ("7 / 4 = 1.75\n#### 1.75", "1.75"),
        ("#### 12,000.5", "12000.5"),
        ("####  42  \n", "42"),
        ("#### 1\n#### 2", "2"),  # the last marker is the answer
    ])
    def test_the_tail_number_without_separators(self, text: str, gold: str) -> None:
        assert gsm8k_answer(text) == gold

    @pytest.mark.parametrize(("text", "fragment"), [
        ("The answer is 7.", "no '#### '"),
        ("", "no '#### '"),
        ("reasoning\n#### ", "got ''"),
        ("#### seven", "got 'seven'"),
        ("#### 1,5", "got '1,5'"),  # not a thousands separator: refused, not read as 15
        ("#### 7\nso the answer is seven", "got '7\\nso the answer"),
        ("#### $7", "got '$7'"),
    ])
    def test_malformed_answers_raise_a_clear_error(self, text: str, fragment: str) -> None:
        with pytest.raises(FieldError, match="####") as info:
            gsm8k_answer(text)
        assert fragment in str(info.value)


class TestBoxedAnswer:
    @pytest.mark.parametrize(("text", "gold"), [
        (r"So $x = \boxed{5}$.", "5"),
        (r"$\boxed{\frac{1}{2}}$", r"\frac{1}{2}"),
        (r"$\boxed{\frac{\sqrt{3}}{2}}$", r"\frac{\sqrt{3}}{2}"),
        (r"first \boxed{1}, then \boxed{-2}", "-2"),  # the last one
        (r"$\fbox{\sqrt{2}}$", r"\sqrt{2}"),
        (r"\boxed{1} or \fbox{3}", "3"),
        (r"\boxed { 0.25 }", "0.25"),
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),  # escaped braces do not group
        (r"\boxed{1{,}048}", "1{,}048"),
        (r"\boxed{\text{(B)}}", r"\text{(B)}"),
    ])
    def test_the_last_boxed_content(self, text: str, gold: str) -> None:
        assert boxed_answer(text) == gold

    @pytest.mark.parametrize(("text", "fragment"), [
        ("The answer is 5.", r"no \boxed{...}"),
        (r"\boxedx{5}", r"no \boxed{...}"),
        (r"$\boxed{\frac{1}{2}$", "unbalanced braces"),
        (r"\boxed{1} and \boxed{2", "unbalanced braces"),
        (r"\boxed{\}", "unbalanced braces"),
        (r"\boxed{ }", "empty"),
        (r"\boxed 5", "not followed by '{'"),
        ("ends with \\boxed", "not followed by '{'"),
    ])
    def test_malformed_solutions_raise_a_clear_error(self, text: str, fragment: str) -> None:
        with pytest.raises(FieldError) as info:
            boxed_answer(text)
        assert fragment in str(info.value)


def test_the_config_names_every_preset() -> None:
    hints = typing.get_type_hints(TaskConfig)
    assert set(typing.get_args(hints["fields"])) == {"rlcore", *PRESETS}


GSM = {"question": "Tom has 2 bags of 3 apples. How many apples?",
       "answer": "2 * 3 = <<2*3=6>>6\n#### 6"}
MATH = {"problem": r"Compute $\frac{1}{2} + \frac{1}{4}$.", "level": "Level 1",
        "type": "Prealgebra", "solution": r"It is $\boxed{\frac{3}{4}}$."}


class TestPresetFiles:
    def test_gsm8k_lines_load(self, tmp_path: Path) -> None:
        path = write_lines(tmp_path / "train.jsonl", [
            GSM, {"id": "q7", "question": "Q?", "answer": "so\n#### -1,500"}])
        tasks = read_task_file(path, "gsm8k")
        assert [(t.task_id, t.prompt, t.answer, t.kind) for t in tasks] == [
            ("train-1", GSM["question"], "6", "answer"), ("q7", "Q?", "-1500", "answer")]
        assert tasks[0].meta == {} and tasks[0].system is None

    def test_math_lines_load_and_keep_their_other_columns(self, tmp_path: Path) -> None:
        tasks = read_task_file(write_lines(tmp_path / "m.jsonl", [MATH]), "math")
        assert (tasks[0].prompt, tasks[0].answer) == (MATH["problem"], r"\frac{3}{4}")
        assert tasks[0].meta == {"level": "Level 1", "type": "Prealgebra"}

    @pytest.mark.parametrize(("fields", "bad", "fragment"), [
        ("gsm8k", {"answer": "#### 1"}, "'question' is a required property"),
        ("gsm8k", {"question": "Q?"}, "'answer' is a required property"),
        ("gsm8k", {"prompt": "Q?", "answer": "4"}, "'question' is a required property"),
        ("gsm8k", {"question": 5, "answer": "#### 5"}, "question: 5 is not of type 'string'"),
        ("gsm8k", {"question": "", "answer": "#### 5"}, "question: "),
        ("gsm8k", {"question": "Q?", "answer": 5}, "answer: 5 is not of type 'string'"),
        ("gsm8k", {"question": "Q?", "answer": "it is 5"}, "answer: no '#### '"),
        ("gsm8k", {"question": "Q?", "answer": "#### five"}, "answer: the answer after"),
        ("math", {"problem": "P?"}, "'solution' is a required property"),
        ("math", {"problem": ["P?"], "solution": r"\boxed{1}"}, "problem: ['P?'] is not of"),
        ("math", {"problem": "P?", "solution": "it is 1"}, r"solution: no \boxed{...}"),
        ("math", {"problem": "P?", "solution": r"\boxed{\frac{1}{2}"},
         "solution: unbalanced braces"),
        ("math", {"question": "Q?", "answer": "#### 1"}, "'problem' is a required property"),
        ("math", '{"problem": "P?"', "not valid JSON"),
        ("math", '["P?"]', "is not of type 'object'"),
    ])
    def test_one_error_names_file_line_and_column(self, tmp_path: Path, fields: str, bad: Any,
                                                  fragment: str) -> None:
        good = GSM if fields == "gsm8k" else MATH
        path = write_lines(tmp_path / "tasks.jsonl",
                           [good, {**good, "id": "second"}, "", bad, good])
        with pytest.raises(TaskFileError) as info:
            read_task_file(path, fields)
        msg = str(info.value)
        assert msg.startswith(f"{path}:4: ")
        assert fragment in msg

    def test_a_missing_column_says_what_the_preset_reads(self, tmp_path: Path) -> None:
        path = write_lines(tmp_path / "t.jsonl", [{"prompt": "2+2=", "answer": "4"}])
        with pytest.raises(TaskFileError, match="task.fields 'gsm8k' reads the prompt from "
                                                "'question' and the answer from 'answer'"):
            read_task_file(path, "gsm8k")

    @pytest.mark.parametrize("fields", ["gsm8k", "math"])
    def test_an_empty_file_names_the_file(self, tmp_path: Path, fields: str) -> None:
        path = write_lines(tmp_path / "empty.jsonl", ["", " "])
        with pytest.raises(TaskFileError, match=r"empty\.jsonl' holds no tasks"):
            read_task_file(path, fields)

    def test_a_dataset_row_is_refused_under_the_default_preset(self, tmp_path: Path) -> None:
        path = write_lines(tmp_path / "t.jsonl", [GSM])
        with pytest.raises(TaskFileError, match=r"t\.jsonl:1: "):
            read_task_file(path)


class TestParquetFiles:
    """A `.parquet` file's rows go through the same checks as JSONL lines, named by row."""

    @pytest.mark.parametrize(("fields", "rows"), [
        ("gsm8k", [GSM, {"id": "q7", "question": "Q?", "answer": "so\n#### -1,500"}]),
        ("math", [MATH, {**MATH, "problem": "P?", "solution": r"\boxed{\sqrt{2}}"}]),
        ("rlcore", [{"prompt": "2+2=", "answer": "4"}, {"prompt": "3+3=", "answer": "6"}]),
    ])
    def test_rows_load_as_the_same_tasks_as_jsonl_lines(self, tmp_path: Path, fields: str,
                                                         rows: list[dict[str, Any]]) -> None:
        (tmp_path / "pq").mkdir()
        tasks = read_task_file(write_parquet(tmp_path / "pq" / "train.parquet", rows), fields)
        assert tasks == read_task_file(write_lines(tmp_path / "train.jsonl", rows), fields)
        assert len(tasks) == 2 and tasks[0].task_id == "train-1"

    def test_a_hub_download_loads_with_its_preset(self, tmp_path: Path) -> None:
        path = tmp_path / "main" / "train-00000-of-00001.parquet"
        path.parent.mkdir()
        write_parquet(path, [GSM, {"question": "Q?", "answer": "1,000 + 234\n#### 1,234"}])
        tasks = read_task_file(path, "gsm8k")
        assert [(t.task_id, t.prompt, t.answer) for t in tasks] == [
            ("train-00000-of-00001-1", GSM["question"], "6"),
            ("train-00000-of-00001-2", "Q?", "1234")]
        math = read_task_file(write_parquet(tmp_path / "m.parquet", [MATH]), "math")
        assert (math[0].answer, math[0].meta) == (r"\frac{3}{4}",
                                                  {"level": "Level 1", "type": "Prealgebra"})

    def test_values_are_python_objects(self, tmp_path: Path) -> None:
        table = pa.table({"id": pa.array([7, 8], pa.int32()), "prompt": ["a=", "b="],
                          "answer": pa.array([1.5, 2.0], pa.float32()),
                          "meta": [{"k": 1}, {"k": 2}]})
        tasks = read_task_file(write_parquet(tmp_path / "t.parquet", table))
        assert [(t.task_id, t.answer, t.meta) for t in tasks] == [
            ("7", "1.5", {"k": 1}), ("8", "2.0", {"k": 2})]
        assert type(tasks[0].meta["k"]) is int

    def test_a_null_cell_is_an_absent_field(self, tmp_path: Path) -> None:
        """Parquet gives every row every column: a code task's `answer` is null, not absent."""
        rows = [{"id": None, "prompt": "2+2=", "answer": "4", "tests": None,
                 "entry_point": None},
                {"id": "code", "prompt": "def f():", "answer": None,
                 "tests": ["assert f() == 1"], "entry_point": "f"}]
        tasks = read_task_file(write_parquet(tmp_path / "mixed.parquet", rows))
        assert [(t.task_id, t.kind, t.answer, t.tests) for t in tasks] == [
            ("mixed-1", "answer", "4", None), ("code", "code", None, ["assert f() == 1"])]

    @pytest.mark.parametrize(("fields", "table", "fragment"), [
        # a missing column: the first row already lacks it
        ("gsm8k", pa.table({"question": ["Q1?", "Q2?", "Q3?"]}),
         "row 1: 'answer' is a required property (task.fields 'gsm8k' reads the prompt from "
         "'question' and the answer from 'answer')"),
        ("math", pa.table({"question": ["Q?"], "answer": ["#### 1"]}),
         "row 1: 'problem' is a required property"),
        # a non-string prompt: an int column
        ("gsm8k", pa.table({"question": [1, 2, 3], "answer": ["#### 1"] * 3}),
         "row 1: question: 1 is not of type 'string'"),
        ("rlcore", pa.table({"prompt": pa.array([5], pa.int64()), "answer": ["5"]}),
         "row 1: prompt: 5 is not of type 'string'"),
        # null values
        ("gsm8k", pa.table({"question": ["Q1?", "Q2?", None], "answer": ["#### 1"] * 3}),
         "row 3: question: null, a missing value"),
        ("math", pa.table({"problem": ["P1?", "P2?", "P3?"],
                           "solution": [r"\boxed{1}", None, r"\boxed{3}"]}),
         "row 2: solution: null, a missing value"),
        ("rlcore", pa.table({"prompt": ["a=", None], "answer": ["1", "2"]}),
         "row 2: prompt: null, a missing value"),
        ("rlcore", pa.table({"prompt": ["a="], "answer": pa.array([None], pa.string())}),
         "row 1: a task needs exactly one of 'answer' or 'tests'"),
        # the per-row checks JSONL lines have
        ("gsm8k", pa.table({"question": ["Q1?", "Q2?", "Q3?"],
                            "answer": ["#### 1", "#### 2", "it is 3"]}),
         "row 3: answer: no '#### '"),
        ("gsm8k", pa.table({"question": ["Q1?", ""], "answer": ["#### 1", "#### 2"]}),
         "row 2: question: '' should be non-empty"),
        ("rlcore", pa.table({"id": ["a", "a"], "prompt": ["x=", "y="], "answer": ["1", "2"]}),
         "row 2: duplicate task id 'a'"),
        ("rlcore", pa.table({"prompt": ["x="], "answer": ["1"], "level": ["hard"]}),
         "row 1: Additional properties are not allowed ('level' was unexpected)"),
    ])
    def test_one_error_names_file_row_and_column(self, tmp_path: Path, fields: str,
                                                 table: pa.Table, fragment: str) -> None:
        path = write_parquet(tmp_path / "train.parquet", table)
        with pytest.raises(TaskFileError) as info:
            read_task_file(path, fields)
        assert str(info.value).startswith(f"{path}: {fragment}")

    @pytest.mark.parametrize(("content", "reason"), [
        (b'{"question": "Q?", "answer": "#### 1"}\n', "magic bytes not found"),
        (b"", "file size is 0 bytes"),
        (b"PAR1 and then not a parquet file at all PAR1", ""),
    ])
    def test_a_file_that_is_not_parquet_names_the_file(self, tmp_path: Path, content: bytes,
                                                       reason: str) -> None:
        path = tmp_path / "train.parquet"
        path.write_bytes(content)
        with pytest.raises(TaskFileError) as info:
            read_task_file(path, "gsm8k")
        msg = str(info.value)
        assert msg.startswith(f"{path}: not a readable Parquet file (") and reason in msg
        assert "<Buffer>" not in msg

    def test_a_table_with_no_rows_holds_no_tasks(self, tmp_path: Path) -> None:
        table = pa.table({"question": pa.array([], pa.string()),
                          "answer": pa.array([], pa.string())})
        path = write_parquet(tmp_path / "empty.parquet", table)
        with pytest.raises(TaskFileError, match=r"empty\.parquet' holds no tasks"):
            read_task_file(path, "gsm8k")

    def test_only_the_parquet_suffix_selects_parquet(self, tmp_path: Path) -> None:
        upper = write_parquet(tmp_path / "t.PARQUET", [GSM])
        assert [t.answer for t in read_task_file(upper, "gsm8k")] == ["6"]
        other = write_parquet(tmp_path / "t.pq", [GSM])  # read as JSONL
        with pytest.raises(TaskFileError) as info:
            read_task_file(other, "gsm8k")
        assert str(info.value).startswith(f"{other}: not UTF-8 text (")
        assert str(info.value).endswith("a Parquet file's name must end in '.parquet'")

    def test_a_suite_mixes_parquet_and_jsonl_splits(self, tmp_path: Path) -> None:
        train = write_parquet(tmp_path / "train.parquet", [GSM])
        heldout = write_lines(tmp_path / "heldout.jsonl", [{"question": "Q?",
                                                            "answer": "#### 1"}])
        suite = load_suite(file_config(train, heldout, fields="gsm8k",
                                       prompt_template="Q: {prompt}"))
        assert [(t.prompt, t.answer) for t in suite.split("train")] == [
            ("Q: " + GSM["question"], "6")]
        assert [(t.prompt, t.answer) for t in suite.split("heldout")] == [("Q: Q?", "1")]


class TestPromptTemplateAndSystemPrompt:
    def test_the_default_settings_leave_rlcore_tasks_as_they_were(self, tmp_path: Path) -> None:
        rows = [{"id": "a", "prompt": "2+2=", "answer": "4", "meta": {"k": 1}},
                {"prompt": "def f():", "tests": ["assert f() == 1"], "entry_point": "f"}]
        train = write_lines(tmp_path / "train.jsonl", rows)
        heldout = write_lines(tmp_path / "heldout.jsonl", [{"prompt": "3+3=", "answer": 6}])
        suite = load_suite(file_config(train, heldout))
        assert suite.split("train") == read_task_file(train)
        assert suite.split("heldout") == read_task_file(heldout)
        assert all(t.system is None for t in suite.split("train") + suite.split("heldout"))

    def test_template_and_system_prompt_reach_both_splits(self, tmp_path: Path) -> None:
        train = write_lines(tmp_path / "train.jsonl", [GSM])
        heldout = write_lines(tmp_path / "heldout.jsonl", [{"question": "Q?",
                                                            "answer": "#### 1"}])
        cfg = file_config(train, heldout, fields="gsm8k", system_prompt="Think first.",
                          prompt_template="{prompt}\nPut the final answer in \\boxed{{}}.")
        suite = load_suite(cfg)
        (t,), (h,) = suite.split("train"), suite.split("heldout")
        assert t.prompt == GSM["question"] + "\nPut the final answer in \\boxed{}."
        assert h.prompt == "Q?\nPut the final answer in \\boxed{}."
        assert (t.system, h.system) == ("Think first.", "Think first.")
        assert (t.answer, h.answer) == ("6", "1")

    def test_a_template_is_not_a_way_around_disjoint_splits(self, tmp_path: Path) -> None:
        train = write_lines(tmp_path / "train.jsonl", [GSM])
        heldout = write_lines(tmp_path / "heldout.jsonl", [{**GSM, "id": "other"}])
        with pytest.raises(TaskFileError, match="disjoint"):
            load_suite(file_config(train, heldout, fields="gsm8k", prompt_template="Q: {prompt}"))


class TestShippedSamples:
    @pytest.mark.parametrize(("fields", "answers"), [
        ("gsm8k", {"14", "1500", "-7", "7.5", "12000", "-15", "1104", "1.75", "-13"}),
        ("math", {r"\frac{3}{4}", r"\sqrt{2}", "-4", "0.12", r"5\sqrt{2}", "1{,}048", "11",
                  r"\frac{1}{2}", r"3\sqrt{2}", "2.25", "9"}),
    ])
    def test_they_load_with_their_preset(self, fields: str, answers: set[str]) -> None:
        cfg = file_config(DATA / fields / "train.jsonl", DATA / fields / "heldout.jsonl",
                          fields=fields)
        suite = load_suite(cfg)  # JsonlSuite refuses a prompt in both splits
        train, heldout = suite.split("train"), suite.split("heldout")
        assert len(train) >= 8 and len(heldout) >= 4
        assert not {t.prompt for t in train} & {t.prompt for t in heldout}
        assert answers <= {t.answer for t in train + heldout}
        assert all(t.kind == "answer" and t.answer for t in train + heldout)

    @pytest.mark.parametrize("fields", ["gsm8k", "math"])
    def test_they_are_refused_under_the_other_preset(self, fields: str) -> None:
        other = "math" if fields == "gsm8k" else "gsm8k"
        with pytest.raises(TaskFileError, match=r"train\.jsonl:1: .*required property"):
            read_task_file(DATA / fields / "train.jsonl", other)


class TestSystemPromptEncoding:
    def test_the_system_message_comes_before_the_prompt(self) -> None:
        from rlcore.policy.loading import encode_prompt
        from rlcore.policy.stand_in import build_tokenizer

        tok = build_tokenizer("tiny")
        text = tok.decode(encode_prompt(tok, "What is 2+3?", chat=True, system="Be brief."))
        assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
                        "What is 2+3?<|im_end|>\n<|im_start|>assistant\n")
        default = tok.decode(encode_prompt(tok, "What is 2+3?", chat=True))
        assert "You are a helpful assistant." in default  # the template's own, unchanged
        with pytest.raises(ValueError, match="prompt_format 'chat'"):
            encode_prompt(tok, "2+3=", chat=False, system="Be brief.")

    def test_every_encoding_of_a_task_passes_its_system_prompt(self) -> None:
        """Runners, eval, replay, measurements and the planner encode a task's prompt in
        different places; each must hand over its system message too."""
        missing = []
        for path in sorted((ROOT / "rlcore").rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.Call):
                    continue
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                # policy.encode_prompt(prompt, system), or encode_prompt(..., system=...)
                passes = any(k.arg == "system" for k in node.keywords) or (
                    isinstance(func, ast.Attribute) and len(node.args) >= 2)
                if name == "encode_prompt" and not passes:
                    missing.append(f"{path.relative_to(ROOT)}:{node.lineno}")
        assert missing == []


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_chat_run_on_a_gsm8k_file_encodes_the_system_prompt(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """The stand-in Qwen directory: the policy's prompt cache keeps prompts apart by system
    message, and a run encodes every templated prompt with the system prompt (async: through
    the rollout worker's prompt slots)."""
    from rlcore.policy.hf_policy import HFPolicy
    from rlcore.policy.stand_in import build_stand_in
    from rlcore.runners.sync import sync_train
    from rlcore.runners.threaded import async_train
    from tests.conftest import small_config

    model_dir = tmp_path / "qwen-like"
    build_stand_in(model_dir, "tiny")
    cfg = config_from_dict(small_config(
        model_dir, mode=mode, model={"path": str(model_dir), "prompt_format": "chat"},
        task={"suite": "jsonl", "fields": "gsm8k", "system_prompt": "Think first.",
              "prompt_template": "{prompt} Answer with a number.",
              "train_path": str(DATA / "gsm8k" / "train.jsonl"),
              "heldout_path": str(DATA / "gsm8k" / "heldout.jsonl")},
        rollout={"max_new_tokens": 4, "chunk_tokens": 2, "group_size": 2},
        train={"updates": 1, "update_batch_size": 4}, eval={"heldout_tasks": 2,
                                                            "samples_per_task": 1}))
    policy = HFPolicy(cfg.model, cfg.train)
    decode = policy.tokenizer.decode
    assert decode(policy.encode_prompt("Q?", "Think first.")).startswith(
        "<|im_start|>system\nThink first.<|im_end|>\n<|im_start|>user\nQ?<|im_end|>")
    assert "Think twice." in decode(policy.encode_prompt("Q?", "Think twice."))  # not cached
    assert "You are a helpful assistant." in decode(policy.encode_prompt("Q?"))
    encoded: list[tuple[str, str | None]] = []
    original = HFPolicy.encode_prompt

    def spy(self: HFPolicy, prompt: str, system: str | None = None) -> list[int]:
        encoded.append((prompt, system))
        return original(self, prompt, system)

    monkeypatch.setattr(HFPolicy, "encode_prompt", spy)
    summary = (sync_train if mode == "sync" else async_train)(cfg, tmp_path / "run")
    assert summary["updates"] == 1
    assert len(encoded) >= 4
    assert all(p.endswith(" Answer with a number.") and s == "Think first." for p, s in encoded)
