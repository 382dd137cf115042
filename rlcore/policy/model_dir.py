"""What a Hugging Face model directory must hold before a job reads it, checked without
importing torch (the pipeline checks it too, before any job starts).

A copy of a model that stopped half way, or one made with only some of its files, would
otherwise fail deep inside `from_pretrained`, in a worker process, minutes into a grid.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlcore.config import ConfigError

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
HOW_TO_GET = ("Build the embedded tiny model with `rlcore build-base models/tiny`, or copy a "
              "whole model directory there, e.g. `hf download Qwen/Qwen2.5-0.5B-Instruct "
              "--local-dir models/Qwen2.5-0.5B-Instruct`.")


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


def check_model_dir(path: str | Path, key: str = "model.path") -> Path:
    """The model directory, or a ConfigError naming every missing file and how to get them."""
    p = Path(path)
    if not p.is_dir():
        raise ConfigError(f"{key} '{p}' is not a Hugging Face model directory: there is no "
                          f"directory there. {HOW_TO_GET}")
    missing = missing_model_files(p)
    if missing:
        raise ConfigError(f"{key} '{p}' is not a Hugging Face model directory: it lacks "
                          f"{'; '.join(missing)}. {HOW_TO_GET}")
    return p
