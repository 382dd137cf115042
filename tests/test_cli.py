"""The command line, in-process: bad input exits 2 with one message and writes nothing."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlcore.cli import main
from rlcore.config import run_config_schema
from rlcore.evaluation import run_config_of
from tests.conftest import small_config


def write_config(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def assert_one_error(capsys: pytest.CaptureFixture[str], *fragments: str) -> str:
    """stderr holds exactly one `rlcore: error:` line, naming every fragment; no traceback."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("rlcore: error: ")
    for fragment in fragments:
        assert fragment in lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def completed_run(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
                  ) -> tuple[Path, Path]:
    """(config file, run directory) of one successful tiny run, shared read-only."""
    root = tmp_path_factory.mktemp("cli_run")
    config = write_config(root / "run.yaml", small_config(tiny_model_dir))
    out = root / "run"
    assert main(["run", str(config), "--out", str(out)]) == 0
    return config, out


@pytest.fixture
def run_copy(completed_run: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path]:
    """A private copy of the completed run, for tests that write into it."""
    config, out = completed_run
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    return config, copy


class TestRunRejectsBadInput:
    def test_unknown_config_key(self, tmp_path: Path, tiny_model_dir: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
        config = write_config(tmp_path / "c.yaml",
                              small_config(tiny_model_dir, train={"learning_rate": 0.1}))
        out = tmp_path / "out"
        assert main(["run", str(config), "--out", str(out)]) == 2
        assert_one_error(capsys, "unknown config key", "learning_rate", "under 'train'")
        assert not out.exists()

    def test_wrong_type(self, tmp_path: Path, tiny_model_dir: Path,
                        capsys: pytest.CaptureFixture[str]) -> None:
        config = write_config(tmp_path / "c.yaml",
                              small_config(tiny_model_dir, train={"lr": "abc"}))
        out = tmp_path / "out"
        assert main(["run", str(config), "--out", str(out)]) == 2
        assert_one_error(capsys, "train.lr", '"abc"', "number")
        assert not out.exists()

    def test_wrong_type_from_an_override(self, tmp_path: Path, tiny_model_dir: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
        config = write_config(tmp_path / "c.yaml", small_config(tiny_model_dir))
        out = tmp_path / "out"
        argv = ["run", str(config), "--out", str(out), "--set", "train.updates=many"]
        assert main(argv) == 2
        assert_one_error(capsys, "train.updates", '"many"')
        assert not out.exists()

    def test_a_knob_that_means_nothing_for_the_objective(self, tmp_path: Path,
                                                        tiny_model_dir: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
        config = write_config(tmp_path / "c.yaml", small_config(tiny_model_dir))
        out = tmp_path / "out"
        argv = ["run", str(config), "--out", str(out), "--set", "train.dual_clip=3"]
        assert main(argv) == 2  # the default objective is pg
        assert_one_error(capsys, "train.dual_clip", "'pg'")
        assert not out.exists()

    def test_missing_config_file(self, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
        out = tmp_path / "out"
        assert main(["run", str(tmp_path / "absent.yaml"), "--out", str(out)]) == 2
        assert_one_error(capsys, "absent.yaml", "does not exist")
        assert not out.exists()

    def test_missing_model_directory(self, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
        empty = tmp_path / "no_model"
        empty.mkdir()
        config = write_config(tmp_path / "c.yaml", small_config(empty))
        out = tmp_path / "out"
        assert main(["run", str(config), "--out", str(out)]) == 2
        assert_one_error(capsys, "model.path", str(empty), "config.json")
        assert not out.exists()  # checked before anything is written

    def test_malformed_task_file_line(self, tmp_path: Path, tiny_model_dir: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
        train = tmp_path / "train.jsonl"
        train.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=", "answer"\n')
        heldout = tmp_path / "heldout.jsonl"
        heldout.write_text('{"prompt": "3+3=", "answer": "6"}\n')
        config = write_config(tmp_path / "c.yaml", small_config(
            tiny_model_dir, task={"suite": "jsonl", "train_path": str(train),
                                  "heldout_path": str(heldout)}))
        out = tmp_path / "out"
        assert main(["run", str(config), "--out", str(out)]) == 2
        assert_one_error(capsys, f"{train}:2:", "not valid JSON")
        assert not out.exists()


class TestRunOverACompleteRun:
    def test_refused_without_force_and_the_old_run_is_untouched(
            self, run_copy: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
        config, out = run_copy
        summary = (out / "summary.json").read_bytes()
        files = sorted(p.name for p in out.iterdir())
        assert main(["run", str(config), "--out", str(out)]) == 2
        assert_one_error(capsys, str(out), "already holds a complete run", "--force")
        assert (out / "summary.json").read_bytes() == summary
        assert sorted(p.name for p in out.iterdir()) == files

    def test_force_replaces_it(self, run_copy: tuple[Path, Path],
                               capsys: pytest.CaptureFixture[str]) -> None:
        config, out = run_copy
        assert json.loads((out / "summary.json").read_text())["seed"] == 0
        argv = ["run", str(config), "--out", str(out), "--force", "--set", "seed=1"]
        assert main(argv) == 0
        assert "run complete" in capsys.readouterr().out
        summary = json.loads((out / "summary.json").read_text())
        assert summary["seed"] == 1
        assert summary["updates"] == 4
        assert json.loads((out / "config.json").read_text())["config"]["seed"] == 1
        assert not list(out.glob("*.partial"))


class TestEval:
    def test_eval_writes_pass_rates(self, run_copy: tuple[Path, Path],
                                    capsys: pytest.CaptureFixture[str]) -> None:
        _, out = run_copy
        assert main(["eval", str(out)]) == 0
        result = json.loads((out / "eval.json").read_text())
        assert result["tasks"] == 30
        assert result["policy"] == "final"
        assert result["model_path"] == str(out / "policy")
        assert 0.0 <= result["greedy_pass_rate"] <= 1.0
        assert 0.0 <= result["sampled_pass_rate"] <= 1.0
        assert len(result["per_task"]) == 30
        # The reported rates are the per-task results summed, not made up separately.
        assert result["greedy_pass_rate"] == pytest.approx(
            sum(t["greedy_pass"] for t in result["per_task"]) / 30)
        assert result["sampled_pass_rate"] == pytest.approx(
            sum(t["sampled_passes"] for t in result["per_task"]) / (30 * 2))
        # every sampled response has a length, at least its stop token, at most the cut
        lengths = {int(k): n for k, n in result["sampled_lengths"].items()}
        assert sum(lengths.values()) == 30 * 2
        assert min(lengths) >= 1 and max(lengths) <= run_config_of(out).rollout.max_new_tokens
        assert "eval.json" in capsys.readouterr().out

    def test_base_weights_and_the_old_flag_that_named_them(
            self, run_copy: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
        _, out = run_copy
        assert main(["eval", str(out), "--weights", "base"]) == 0
        base = json.loads((out / "eval_base.json").read_text())
        assert base["policy"] == "base"  # the file keeps its field name
        captured = capsys.readouterr()
        assert "base weights on 30 held-out tasks" in captured.out and captured.err == ""
        (out / "eval_base.json").unlink()
        assert main(["eval", str(out), "--policy", "base"]) == 0  # deprecated, still works
        again = json.loads((out / "eval_base.json").read_text())
        assert {k: v for k, v in again.items() if not k.endswith("_s")} == \
            {k: v for k, v in base.items() if not k.endswith("_s")}  # the same, but its seconds
        assert "--policy is now --weights" in capsys.readouterr().err

    def test_eval_of_an_incomplete_directory(self, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
        run_dir = tmp_path / "half"
        run_dir.mkdir()
        (run_dir / "samples.jsonl.partial").write_text("")
        assert main(["eval", str(run_dir)]) == 2
        assert_one_error(capsys, str(run_dir), "summary.json")
        assert sorted(p.name for p in run_dir.iterdir()) == ["samples.jsonl.partial"]


class TestBuildBase:
    @pytest.mark.parametrize("force", [False, True])
    def test_refuses_a_foreign_non_empty_directory(
            self, tmp_path: Path, capsys: pytest.CaptureFixture[str], force: bool) -> None:
        target = tmp_path / "mine"
        target.mkdir()
        (target / "notes.txt").write_text("keep me")
        (target / "sub").mkdir()
        (target / "sub" / "data.bin").write_bytes(b"\x00\x01")
        argv = ["build-base", str(target)] + (["--force"] if force else [])
        assert main(argv) == 2
        assert_one_error(capsys, str(target), "not an rlcore base model directory")
        assert sorted(str(p.relative_to(target)) for p in target.rglob("*")) == [
            "notes.txt", "sub", "sub/data.bin"]
        assert (target / "notes.txt").read_text() == "keep me"
        assert (target / "sub" / "data.bin").read_bytes() == b"\x00\x01"
        assert not (tmp_path / "mine.tmp").exists()


def test_bench_refuses_a_directory_for_out_before_timing_anything(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the config does not exist either: the --out check comes first, and nothing is run
    assert main(["bench", str(tmp_path / "absent.yaml"), "--out", str(tmp_path)]) == 2
    assert_one_error(capsys, f"--out {tmp_path} is a directory", "bench.json")


def test_calibrate_refuses_drift_without_runs_to_fit_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p.yaml"
    assert main(["calibrate", "config/bench.yaml", "--drift", "--out", str(out)]) == 2
    assert_one_error(capsys, "--drift", "--from-runs RUN_DIR")
    assert not out.exists()


def test_config_schema_prints_the_schema_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config-schema"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == run_config_schema()
    assert captured.err == ""


def test_the_program_flushes_its_output_and_keeps_its_exit_code(tmp_path: Path):
    """The installed `rlcore` skips the interpreter's teardown at exit (cli.entry): what it
    printed still arrives whole through a pipe, and the exit code is main()'s."""
    program = Path(sys.executable).parent / "rlcore"
    ok = subprocess.run([str(program), "config-schema"], capture_output=True, text=True,
                        timeout=120)
    assert ok.returncode == 0 and json.loads(ok.stdout) == run_config_schema()
    bad = subprocess.run([str(program), "run", str(tmp_path / "missing.yaml"), "--out",
                          str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("rlcore: error: ")
    assert not (tmp_path / "out").exists()
