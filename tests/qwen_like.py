"""A locally built stand-in for a downloaded Qwen2.5-Instruct directory.

Same classes as the paper's model (Qwen2ForCausalLM, Qwen2Tokenizer with a byte-level BPE,
a ChatML chat template, two stop tokens in generation_config), only tiny, so the path that
loads a real model directory is exercised without a download.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM, Qwen2Tokenizer

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def build_qwen_like(out: Path) -> Path:
    """Save a tiny Qwen2-class model with a Qwen2Tokenizer and chat template into out."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    corpus = [f"{a}+{b}={a + b}" for a in range(30) for b in range(30)]
    corpus += ["user\nassistant\nWhat is 3+4? The answer is 7.\n"] * 20
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    merges = [tuple(m) for m in json.loads(bpe.to_str())["model"]["merges"]]
    tok = Qwen2Tokenizer(vocab=bpe.get_vocab(), merges=merges, eos_token="<|im_end|>",
                         pad_token="<|endoftext|>", unk_token=None)
    tok.chat_template = CHATML
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
        tie_word_embeddings=True, pad_token_id=tok.pad_token_id,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"), bos_token_id=None))
    model.generation_config = GenerationConfig(
        eos_token_id=[tok.convert_tokens_to_ids("<|im_end|>"),
                      tok.convert_tokens_to_ids("<|endoftext|>")],
        pad_token_id=tok.pad_token_id)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return out
