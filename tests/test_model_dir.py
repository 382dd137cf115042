"""An incomplete model directory is refused before anything is written, naming every file it
lacks (rlcore/policy/model_dir.py), in `rlcore run` and in the pipeline's planning."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from rlcore.cli import main
from rlcore.config import ConfigError
from rlcore.policy.model_dir import check_model_dir, missing_model_files
from rlcore.policy.stand_in import build_stand_in
from tests.conftest import small_config


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A whole local Qwen2-class directory, as the paper's setup reads one."""
    out = tmp_path_factory.mktemp("qwen") / "model"
    build_stand_in(out, "tiny")
    return out


def copy_without(src: Path, dst: Path, *names: str) -> Path:
    shutil.copytree(src, dst)
    for name in names:
        (dst / name).unlink()
    return dst


def test_whole_directories_pass(tiny_model_dir: Path, qwen_dir: Path):
    assert missing_model_files(tiny_model_dir) == []
    assert missing_model_files(qwen_dir) == []
    assert check_model_dir(qwen_dir) == qwen_dir


@pytest.mark.parametrize(("removed", "named"), [
    (["model.safetensors"], "model.safetensors (the weights"),
    (["tokenizer.json"], "tokenizer.json (the tokenizer"),
    (["tokenizer_config.json"], "tokenizer_config.json"),
    (["generation_config.json"], "generation_config.json (the stop tokens)"),
    (["config.json"], "config.json (the architecture)"),
], ids=["weights", "tokenizer", "tokenizer-config", "generation-config", "config"])
def test_run_refuses_a_directory_lacking_a_file(tiny_model_dir: Path, tmp_path: Path,
                                                capsys, removed: list[str], named: str):
    model = copy_without(tiny_model_dir, tmp_path / "model", *removed)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(small_config(model)))
    assert main(["run", str(config), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlcore: error: model.path") and named in err
    assert "hf download" in err
    assert not (tmp_path / "out").exists()


def test_every_missing_file_is_named_at_once(tiny_model_dir: Path, tmp_path: Path):
    model = copy_without(tiny_model_dir, tmp_path / "model", "model.safetensors",
                         "tokenizer.json", "generation_config.json")
    with pytest.raises(ConfigError) as e:
        check_model_dir(model)
    for name in ("model.safetensors", "tokenizer.json", "generation_config.json"):
        assert name in str(e.value)
    assert "config.json (the architecture)" not in str(e.value)


def test_a_bpe_tokenizer_may_come_as_vocab_and_merges(qwen_dir: Path, tmp_path: Path):
    """As in a downloaded Qwen2.5 directory, which has both forms (transformers 5 saves
    tokenizer.json alone)."""
    model = copy_without(qwen_dir, tmp_path / "model", "tokenizer.json")
    (model / "vocab.json").write_text("{}")
    (model / "merges.txt").write_text("#version: 0.2\n")
    assert missing_model_files(model) == []
    (model / "merges.txt").unlink()
    assert [m for m in missing_model_files(model) if m.startswith("tokenizer.json")]


def test_a_sharded_checkpoint_names_its_missing_shard(tiny_model_dir: Path, tmp_path: Path):
    model = copy_without(tiny_model_dir, tmp_path / "model")
    (model / "model.safetensors").rename(model / "model-00001-of-00002.safetensors")
    index = {"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                            "b": "model-00002-of-00002.safetensors"}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    assert missing_model_files(model) == [
        "model-00002-of-00002.safetensors (a shard named in model.safetensors.index.json)"]


def test_no_directory_at_all(tmp_path: Path):
    with pytest.raises(ConfigError, match="there is no directory there"):
        check_model_dir(tmp_path / "absent")


def test_the_missing_model_message_builds_the_base_of_the_config_run(tmp_path: Path, capsys):
    """The command it gives warm-starts the tiny model on the task this file (and these
    `--set`s) train on, not on the defaults'."""
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(small_config(tmp_path / "models" / "tiny")))
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out), "--set", "task.suite=chain"]) == 2
    err = capsys.readouterr().err
    assert (f"`rlcore build-base {tmp_path / 'models' / 'tiny'} --config {config} "
            "--set task.suite=chain`") in err
    assert not out.exists()


def test_a_base_warm_started_on_another_task_is_named_before_the_run(
        tiny_model_dir: Path, capsys):
    """After the run's checks pass (a config's error comes first), before anything runs."""
    from rlcore.config import config_from_dict
    from rlcore.runners.common import preflight

    built = json.loads((tiny_model_dir / "rlcore_base.json").read_text())["task"]
    other = "chain" if built["suite"] != "chain" else "arith"
    preflight(config_from_dict(small_config(tiny_model_dir)))
    assert "warm-started on another task" not in capsys.readouterr().err
    preflight(config_from_dict(small_config(tiny_model_dir, task={"suite": other})))
    err = capsys.readouterr().err
    assert f"task.suite {built['suite']!r} (this config: {other!r})" in err
    assert f"build-base {tiny_model_dir} --config CONFIG --force` (CONFIG: the file" in err
