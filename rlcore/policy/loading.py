"""Loading a model directory's weights and tokenizer, and a prompt's token ids as a policy
samples from them (`hf_policy.py::HFPolicy`; the planner counts prompt tokens with the same
function, without loading a model)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from rlcore.config import ConfigError

# from_pretrained is not thread-safe (concurrent loads were seen to leave tied embeddings
# untied and re-initialised); the threaded runner loads its roles' models concurrently.
_LOAD_LOCK = threading.Lock()


LOAD_DTYPE = torch.float32  # what every role loads in, before sampling may hold another


def load_model(path: str | Path, attn_implementation: str = "sdpa") -> PreTrainedModel:
    """from_pretrained in fp32, one load at a time within a process."""
    with _LOAD_LOCK:
        return AutoModelForCausalLM.from_pretrained(
            str(path), dtype=LOAD_DTYPE, attn_implementation=attn_implementation)


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """Load the tokenizer saved beside a model.

    A character tokenizer saved next to a Qwen2 config is loaded as PreTrainedTokenizerFast
    on purpose (transformers 5 saves it as the generic TokenizersBackend): AutoTokenizer may
    pick Qwen2Tokenizer from the model type, which would drop spaces and newlines.
    """
    p = Path(path)
    cfg_file = p / "tokenizer_config.json"
    tok_class = None
    if cfg_file.is_file():
        tok_class = json.loads(cfg_file.read_text()).get("tokenizer_class")
    if tok_class in ("PreTrainedTokenizerFast", "TokenizersBackend"):
        return PreTrainedTokenizerFast.from_pretrained(str(p))
    return AutoTokenizer.from_pretrained(str(p))


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str, *, chat: bool,
                  system: str | None = None) -> list[int]:
    """A prompt's token ids as the policy samples from them (chat-templated when `chat`, after
    a system message when `system` is set)."""
    if chat:
        messages = [{"role": "user", "content": prompt}]
        if system is not None:
            messages.insert(0, {"role": "system", "content": system})
        return list(tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False,
        ))
    if system is not None:  # config validation refuses this; never drop it silently
        raise ConfigError("a system prompt needs model.prompt_format 'chat'")
    return list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
