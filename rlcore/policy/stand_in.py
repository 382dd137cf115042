"""A locally built stand-in for a downloaded Qwen2.5-Instruct directory, nothing downloaded.

The same classes and files as the paper's model: Qwen2ForCausalLM saved in bf16, a
byte-level BPE Qwen2Tokenizer with Qwen's special tokens and a ChatML chat template, and
Qwen's two stop ids in generation_config.json. Two sizes:
  tiny   a one-layer model over a few hundred tokens, for tests of the loading path;
  0.5b   Qwen2.5-0.5B-Instruct's exact architecture (494,032,768 parameters, randomly
         initialised), with the special tokens at Qwen's own ids, for `rlcore smoke`.
The weights are random, so the 0.5b stand-in measures cost, never quality.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any, Literal

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM, Qwen2Tokenizer

Size = Literal["tiny", "0.5b"]

# Qwen2.5-0.5B-Instruct's config.json, as Qwen2Config arguments.
QWEN25_05B: dict[str, Any] = {
    "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864,
    "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
    "max_position_embeddings": 32768, "tie_word_embeddings": True, "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
    "max_window_layers": 21, "use_sliding_window": False, "hidden_act": "silu",
}
TINY: dict[str, Any] = {
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
    "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 128,
    "tie_word_embeddings": True,
}
# Qwen2.5's added tokens, in id order from QWEN_SPECIAL_BASE (its tokenizer.json).
SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
    "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>",
    "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
    "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
)
QWEN_SPECIAL_BASE = 151643
# ChatML; like Qwen2.5's own template, a conversation without a system turn gets one.
CHATML = (
    "{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\n"
    "You are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
BUILD_INFO = "rlcore_stand_in.json"  # written last: its presence means the directory is complete


def _corpus() -> list[str]:
    sums = [f"{a}+{b}={a + b}" for a in range(100) for b in range(0, 100, 7)]
    chat = ["system\nYou are a helpful assistant.\nuser\nWhat is 3+4? Answer with the number."
            "\nassistant\nThe answer is 7.\n"] * 20
    return sums + chat


def build_tokenizer(size: Size) -> Qwen2Tokenizer:
    """A byte-level BPE Qwen2Tokenizer; for 0.5b, unused filler tokens put the special
    tokens at Qwen's ids (so the stop ids, the pad id and the vocabulary size are Qwen's)."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(_corpus(), trainers.BpeTrainer(
        vocab_size=320 if size == "tiny" else 2000,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    vocab = bpe.get_vocab()
    merges = [tuple(m) for m in json.loads(bpe.to_str())["model"]["merges"]]
    if size == "0.5b":
        # Never produced by the merges, so never encoded; a sampled one decodes as its name.
        vocab.update({f"<|filler_{i}|>": i for i in range(len(vocab), QWEN_SPECIAL_BASE)})
    base = len(vocab)
    vocab.update({tok: base + i for i, tok in enumerate(SPECIAL_TOKENS)})
    tok = Qwen2Tokenizer(vocab=vocab, merges=merges, eos_token="<|im_end|>",
                         pad_token="<|endoftext|>", unk_token=None)
    tok.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS[1:])})
    tok.chat_template = CHATML
    return tok


def build_model(size: Size, tok: Qwen2Tokenizer, seed: int = 0) -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2ForCausalLM of the given size, with Qwen's stop ids."""
    end, im_end = tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
    arch = QWEN25_05B if size == "0.5b" else {**TINY, "vocab_size": len(tok)}
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(Qwen2Config(**arch, pad_token_id=end, bos_token_id=end,
                                         eos_token_id=im_end))
    # Qwen2.5-Instruct's generation_config.json: both stop ids, and its sampling defaults
    # (rlcore samples with its own settings; HF `generate` reads these).
    model.generation_config = GenerationConfig(
        eos_token_id=[im_end, end], pad_token_id=end, bos_token_id=end, do_sample=True,
        temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05)
    return model


def is_complete(out_dir: str | Path) -> bool:
    """True if out_dir holds a finished stand-in build."""
    return (Path(out_dir) / BUILD_INFO).is_file()


def build_stand_in(out_dir: str | Path, size: Size = "tiny", seed: int = 0) -> dict[str, Any]:
    """Build and save the stand-in into out_dir (through a temporary directory, so a killed
    build leaves nothing that looks whole); an existing complete build is kept."""
    out = Path(out_dir)
    if is_complete(out):
        info = json.loads((out / BUILD_INFO).read_text())
        if info["size"] == size:
            return info
    if out.exists():
        raise FileExistsError(f"'{out}' exists and is not a {size} stand-in built by rlcore; "
                              "choose another directory or remove it")
    start = time.perf_counter()
    tok = build_tokenizer(size)
    model = build_model(size, tok, seed)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    # Qwen2.5 ships bf16 weights; rlcore loads them as fp32, as it does the real ones.
    model.to(torch.bfloat16).save_pretrained(str(tmp))
    tok.save_pretrained(str(tmp))
    info = {"size": size, "seed": seed, "params": sum(p.numel() for p in model.parameters()),
            "tokenizer_size": len(tok), "build_s": time.perf_counter() - start}
    (tmp / BUILD_INFO).write_text(json.dumps(info, indent=2))
    tmp.rename(out)
    return info
