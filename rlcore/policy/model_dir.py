"""What a Hugging Face model directory must hold before a job reads it, checked without
importing torch (the pipeline checks it too, before any job starts).

A copy of a model that stopped half way, or one made with only some of its files, would
otherwise fail deep inside `from_pretrained`, in a worker process, minutes into a grid.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlcore.config import ConfigError

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
BUILD_INFO = "rlcore_base.json"  # written last by build-base: its presence means it is complete


def build_command(path: str | Path, config_file: str | None = None,
                  overrides: Sequence[str] = ()) -> str:
    """The `rlcore build-base` command that warm-starts the tiny model at `path` on the task a
    config trains on (its `task` and `base` sections): the file and `--set`s a run was given,
    and the program as it was called (`.venv/bin/rlcore`) where it was called by a path."""
    config = f" --config {shlex.quote(config_file)}" if config_file else " --config CONFIG"
    sets = "".join(f" --set {shlex.quote(s)}" for s in overrides)
    called = sys.argv[0] if sys.argv and Path(sys.argv[0]).name == "rlcore" else "rlcore"
    return f"{shlex.quote(called)} build-base {shlex.quote(str(path))}{config}{sets}"


def how_to_get(path: str | Path, config_file: str | None = None,
               overrides: Sequence[str] = ()) -> str:
    """What a missing model's message tells the reader to do."""
    build = build_command(path, config_file, overrides)
    return (f"Build the embedded tiny model for the config with `{build}` (it is warm-started "
            "on the config's task), or copy a whole model directory there, e.g. "
            "`.venv/bin/hf download Qwen/Qwen2.5-0.5B-Instruct --local-dir "
            "models/Qwen2.5-0.5B-Instruct`.")


def _missing_weights(p: Path) -> list[str]:
    """The weights, whole or sharded (an index naming its shards)."""
    if any((p / name).is_file() for name in WEIGHT_FILES):
        return []
    for name in WEIGHT_FILES:
        index = p / f"{name}.index.json"
        if index.is_file():
            try:
                shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            except (ValueError, KeyError, AttributeError) as e:
                return [f"{index.name} (unreadable: {e})"]
            return [f"{s} (a shard named in {index.name})" for s in shards
                    if not (p / s).is_file()]
    return ["model.safetensors (the weights; or pytorch_model.bin, or a sharded index)"]


def missing_model_files(path: str | Path) -> list[str]:
    """Every file the directory lacks for a model, its tokenizer and its stop tokens."""
    p = Path(path)
    missing = []
    if not (p / "config.json").is_file():
        missing.append("config.json (the architecture)")
    missing += _missing_weights(p)
    if not (p / "tokenizer.json").is_file() and not (
            (p / "vocab.json").is_file() and (p / "merges.txt").is_file()):
        missing.append("tokenizer.json (the tokenizer; or vocab.json and merges.txt)")
    if not (p / "tokenizer_config.json").is_file():
        missing.append("tokenizer_config.json (the tokenizer's settings and chat template)")
    if not (p / "generation_config.json").is_file():
        missing.append("generation_config.json (the stop tokens)")
    return missing


def check_model_dir(path: str | Path, key: str = "model.path", config_file: str | None = None,
                    overrides: Sequence[str] = ()) -> Path:
    """The model directory, or a ConfigError naming every missing file and how to get them
    (for the config file and `--set`s given, where known)."""
    p = Path(path)
    how = how_to_get(p, config_file, overrides)
    if not p.is_dir():
        raise ConfigError(f"{key} '{p}' is not a Hugging Face model directory: there is no "
                          f"directory there. {how}")
    missing = missing_model_files(p)
    if missing:
        raise ConfigError(f"{key} '{p}' is not a Hugging Face model directory: it lacks "
                          f"{'; '.join(missing)}. {how}")
    return p


def warm_started_for(path: str | Path, task: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{key: (built on, this config)} for each task setting a base that `rlcore build-base`
    warm-started differs in from `task` (a config's `task` section); {} for another model."""
    info = Path(path) / BUILD_INFO
    if not info.is_file():
        return {}
    built = json.loads(info.read_text()).get("task", {})
    mine = json.loads(json.dumps(dict(task)))  # tuples as JSON has them
    return {k: (built.get(k), mine.get(k)) for k in sorted(set(built) | set(mine))
            if built.get(k) != mine.get(k)}


def base_mismatch_warning(path: str | Path, task: Mapping[str, Any]) -> str | None:
    """The line that says a base model was warm-started on another task than the run's, with
    the command that builds the one it needs; None where it fits (or was not built here)."""
    differ = warm_started_for(path, task)
    if not differ:
        return None
    what = ", ".join(f"task.{k} {a!r} (this config: {b!r})" for k, (a, b) in differ.items())
    return (f"warning: the base model '{path}' was warm-started on another task: {what}. A "
            "run may earn no reward and its weights not move; build the base this config "
            f"needs with `{build_command(path)} --force` (CONFIG: the file this run was "
            "given, with its --set options)")
