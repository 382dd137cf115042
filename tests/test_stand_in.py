"""The locally built Qwen2.5-Instruct stand-in (rlcore/policy/stand_in.py): Qwen's architecture,
special-token ids, chat template and stop ids, with nothing downloaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlcore.policy.loading import load_tokenizer
from rlcore.policy.stand_in import QWEN25_05B, build_model, build_stand_in, build_tokenizer


def test_the_05b_architecture_has_qwen25_05b_parameter_count():
    """By hand: embeddings 151936 * 896 = 136,134,656 (tied, counted once); per layer q
    896*896+896, k and v 896*128+128 each, o 896*896, MLP 3*896*4864, two norms 2*896:
    14,912,384, times 24 = 357,897,216; final norm 896. Sum 494,032,768."""
    with torch.device("meta"):
        model = Qwen2ForCausalLM(Qwen2Config(**QWEN25_05B))
    assert sum(p.numel() for p in model.parameters()) == 494_032_768
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_the_05b_tokenizer_puts_the_special_tokens_at_qwens_ids():
    tok = build_tokenizer("0.5b")
    assert len(tok) == 151665  # Qwen2.5's tokenizer size; the model's vocab pads to 151936
    ids = tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    assert ids == [151643, 151644, 151645]
    assert (tok.eos_token_id, tok.pad_token_id) == (151645, 151643)
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is 2+3?"}],
                                     add_generation_prompt=True, tokenize=True,
                                     return_dict=False)
    assert prompt[0] == 151644 and prompt.count(151645) == 2  # system and user turns close
    assert tok.decode(prompt).endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert tok.decode(tok("12+30=42")["input_ids"]) == "12+30=42"


def test_the_05b_generation_config_stops_on_both_of_qwens_stop_ids():
    tok = build_tokenizer("tiny")
    model = build_model("tiny", tok)
    stops = tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert model.generation_config.eos_token_id == stops
    assert model.config.eos_token_id == stops[0] and model.config.pad_token_id == stops[1]


def test_a_built_stand_in_loads_as_the_real_directory_does(tmp_path: Path):
    out = tmp_path / "qwen"
    info = build_stand_in(out, "tiny")
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"  # as shipped
    assert type(load_tokenizer(out)).__name__ == "Qwen2Tokenizer"
    assert build_stand_in(out, "tiny") == info  # a complete build is kept, not redone
    assert not (tmp_path / "qwen.tmp").exists()


def test_a_directory_it_did_not_build_is_never_replaced(tmp_path: Path):
    out = tmp_path / "models"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a tiny stand-in"):
        build_stand_in(out, "tiny")
    assert (out / "notes.txt").read_text() == "mine"
