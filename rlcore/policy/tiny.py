"""The embedded default policy: a character tokenizer and a small Qwen2 causal LM.

It is built from real transformers classes (Qwen2Config, Qwen2ForCausalLM,
PreTrainedTokenizerFast) and saved with `save_pretrained`, so every other part of rlcore
loads it with `from_pretrained` exactly as it would a downloaded Qwen2.5 directory. A short
supervised warm start on the train split leaves it weak but not at zero, which is where RL
has something to improve.
"""

from __future__ import annotations

import functools
import json
import random
import shutil
import string
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from rlcore.config import BaseModelConfig, RunConfig
from rlcore.kernels import pin
from rlcore.policy.model_dir import BUILD_INFO
from rlcore.tasks.chain import is_chain, slip
from rlcore.tasks.suites import Task, load_suite

SPECIALS = ["<pad>", "<eos>", "<unk>"]
# Printable ASCII and newline: enough for arithmetic, word problems and small code tasks.
CHARS = sorted(set(string.printable) - set("\t\r\x0b\x0c"))


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character; decoding fuses characters back without separators."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )


def build_model(cfg: BaseModelConfig, tokenizer: PreTrainedTokenizerFast,
                max_positions: int = 256) -> Qwen2ForCausalLM:
    """A freshly initialised Qwen2 decoder sized by cfg."""
    torch.manual_seed(cfg.seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=max(1, cfg.num_heads // 2),
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    return Qwen2ForCausalLM(config)


def _noisy_answer(answer: str, rng: random.Random) -> str:
    """A wrong answer of the same kind: an integer stays an integer, a worked chain a chain
    with one slip carried through."""
    if is_chain(answer):
        return slip(answer, rng)
    if answer.lstrip("-").isdigit():
        value = int(answer)
        wrong = value
        while wrong == value:
            wrong = max(0, value + rng.randint(-10, 10))
        return str(wrong)
    return answer[::-1] if len(answer) > 1 else answer + answer


def _sft_batch(tasks: list[Task], tokenizer: PreTrainedTokenizerFast,
               encode: Callable[[str], list[int]], noise: float, rng: random.Random
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and labels for prompt -> answer<eos>; the prompt is not trained on."""
    rows, labels = [], []
    for t in tasks:
        answer = str(t.answer)
        if noise and rng.random() < noise:
            answer = _noisy_answer(answer, rng)
        p = encode(t.prompt)
        a = [*encode(answer), tokenizer.eos_token_id]
        rows.append(p + a)
        labels.append([-100] * len(p) + a)
    width = max(map(len, rows))
    pad = tokenizer.pad_token_id
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    lab = torch.tensor([r + [-100] * (width - len(r)) for r in labels])
    return ids, lab


def warm_start(model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast, tasks: list[Task],
               cfg: BaseModelConfig) -> list[float]:
    """Short supervised training on (prompt, answer) pairs; returns the loss per step."""
    answered = [t for t in tasks if t.answer is not None]
    if not answered or cfg.warm_start_steps == 0:
        return []
    rng = random.Random(cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.warm_start_lr)
    model.train()
    losses = []
    # Each text tokenized once: a warm start draws the same prompts thousands of times.
    encode = functools.cache(lambda text: tokenizer(text, add_special_tokens=False)["input_ids"])
    for _ in range(cfg.warm_start_steps):
        ids, lab = _sft_batch(rng.sample(answered, min(cfg.warm_start_batch, len(answered))),
                              tokenizer, encode, cfg.warm_start_label_noise, rng)
        loss = model(input_ids=ids, attention_mask=(ids != tokenizer.pad_token_id).long(),
                     labels=lab, use_cache=False).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.train(False)
    return losses


def is_complete(out_dir: str | Path) -> bool:
    """True if out_dir holds a finished build-base output."""
    return (Path(out_dir) / BUILD_INFO).is_file()


def build_base(out_dir: str | Path, cfg: RunConfig, force: bool = False) -> dict[str, Any]:
    """Build, warm-start and save the tiny model into out_dir (atomically); returns build info."""
    out = Path(out_dir)
    if is_complete(out) and not force:
        return json.loads((out / BUILD_INFO).read_text())
    if out.exists() and any(out.iterdir()) and not is_complete(out):
        # We build into a temporary directory and rename, so this is not a half-written
        # build of ours: never delete what we did not make, even with force.
        raise FileExistsError(f"'{out}' exists and is not an rlcore base model directory; "
                              "choose another directory or remove it")
    start = time.perf_counter()
    # base.threads, not the host's core count: the weights are then the same on every host.
    pin(cfg, threads=cfg.base.threads)
    tokenizer = build_char_tokenizer()
    model = build_model(cfg.base, tokenizer)
    train = load_suite(cfg.task).split("train")
    losses = warm_start(model, tokenizer, train, cfg.base)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    info = {
        "params": sum(p.numel() for p in model.parameters()),
        "base": cfg.to_dict()["base"],
        "task": cfg.to_dict()["task"],
        "warm_start_final_loss": losses[-1] if losses else None,
        "build_s": time.perf_counter() - start,
    }
    (tmp / BUILD_INFO).write_text(json.dumps(info, indent=2))
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return info
