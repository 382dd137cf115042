"""Which device each rollout worker and each trainer rank computes on, and whether that
layout can work, decided before anything is written (docs/placement.md).

`model.rollout_devices` and `model.trainer_devices` name a device per rollout worker and
per trainer rank. Without them every rollout worker is on `model.rollout_device` and every
rank on `model.trainer_device`; and where both are `auto` and the machine has a GPU for
each of R rollout workers and M ranks, each gets its own, as `rlcore plan --gpus` plans
them: rollout worker i on cuda:i, rank r on cuda:R + r. The paper's pair (R = M = 1) is
cuda:0 and cuda:1 either way.

A layout is refused when a device does not exist, when two ranks share a GPU (NCCL runs one
rank per GPU), when ranks mix CPU and GPU, or when what its roles hold on a GPU does not fit
in it: each rollout worker's weights and KV cache, each rank's weights, gradients and Adam
state, and the weight slots on the rollout's GPU, with the arithmetic in the message.
Activations and the allocator's slack are not counted: a layout that fits may still run out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlcore.config import ModelConfig, RunConfig, RuntimeConfig
from rlcore.errors import ConfigError
from rlcore.runners.asynchronous.contexts import rank_name

GIB = 2**30


@dataclass(frozen=True)
class Layout:
    """The device of each rollout worker, and of each trainer rank (rank 0 first; racing
    trainers, `runtime.trainer_workers`, all share rank 0's)."""

    rollout: tuple[torch.device, ...]
    trainer: tuple[torch.device, ...]
    racing: int = 1  # runtime.trainer_workers

    def roles(self) -> dict[str, torch.device]:
        """Each worker's device, by its name (trainer0 for rank 0)."""
        return {**{f"rollout{i}": d for i, d in enumerate(self.rollout)},
                **{f"trainer{i}": self.trainer[0] for i in range(self.racing)},
                **{rank_name(r): d for r, d in enumerate(self.trainer) if r > 0}}


def resolve_layout(cfg: RunConfig, resolve: Callable[[str, str], torch.device],
                   gpus: int) -> Layout:
    """The layout of `cfg` on a machine of `gpus` GPUs; `resolve` turns a device setting
    into a device, refusing one that does not exist (`rlcore/policy/device.py`)."""
    m, rt = cfg.model, cfg.runtime
    r, ranks = rt.rollout_workers, rt.trainer_ranks
    if each_on_its_own(m, rt) and 0 < r + ranks <= gpus:
        rollout = tuple(resolve(f"cuda:{i}", "rollout") for i in range(r))
        trainer = tuple(resolve(f"cuda:{r + i}", "trainer") for i in range(ranks))
    else:
        rollout = tuple(resolve(s, "rollout") for s in m.rollout_devices) or \
            (resolve(m.rollout_device, "rollout"),) * r
        trainer = tuple(resolve(s, "trainer") for s in m.trainer_devices) or \
            (resolve(m.trainer_device, "trainer"),) * ranks
    check_ranks(trainer)
    return Layout(rollout, trainer, rt.trainer_workers)


def each_on_its_own(m: ModelConfig, rt: RuntimeConfig) -> bool:
    """Whether the config asks for a GPU for each rollout worker and trainer rank (auto
    devices, no lists, more than the paper's pair), where the machine has enough."""
    return (not m.rollout_devices and not m.trainer_devices and m.rollout_device == "auto"
            and m.trainer_device == "auto" and rt.rollout_workers + rt.trainer_ranks > 2)


def check_ranks(trainer: Sequence[torch.device]) -> None:
    """Ranks on one kind of device, and on GPUs one rank per GPU."""
    if len(trainer) < 2:
        return
    kinds = {d.type for d in trainer}
    if len(kinds) > 1:
        raise ConfigError(f"the trainer ranks are on {[str(d) for d in trainer]}: all on CPU "
                          "(gloo) or all on GPUs (NCCL), not both")
    if kinds == {"cuda"}:
        seen: dict[torch.device, int] = {}
        for rank, d in enumerate(trainer):
            if d in seen:
                raise ConfigError(
                    f"trainer ranks {seen[d]} and {rank} are both on {d}: NCCL runs one rank "
                    "per GPU; give each its own in model.trainer_devices, or fewer ranks")
            seen[d] = rank


@dataclass(frozen=True)
class ModelSize:
    """What the memory check reads of a model: its parameters, the trainable ones, and the
    KV cache's bytes per row and position at the dtype sampling holds."""

    params: int
    trainable: int
    kv_bytes_per_position: int


def role_bytes(size: ModelSize, cfg: RunConfig, prompt_tokens: int, slot_bytes: int
               ) -> dict[str, dict[str, int]]:
    """What each kind of role holds on its device, term by term: a rollout worker its fp32
    weights and a KV cache for a batch of update_batch_size rows of `prompt_tokens` (the
    longest prompt) plus max_new_tokens; a rank its weights, fp32 gradients and Adam's two
    moments of the trainable tensors; the weight slots (on the rollout's GPU under
    transport device) one copy of the trainable state per slot."""
    positions = cfg.train.update_batch_size * (prompt_tokens + cfg.rollout.max_new_tokens)
    return {
        "rollout": {"weights": 4 * size.params,
                    "kv cache": size.kv_bytes_per_position * positions},
        "trainer": {"weights": 4 * size.params, "gradients": 4 * size.trainable,
                    "adam": 8 * size.trainable},
        "slots": {"slots": slot_bytes},
    }


def check_memory(layout: Layout, needs: Mapping[str, Mapping[str, int]],
                 capacity: Callable[[torch.device], int], slots_on: torch.device | None
                 ) -> None:
    """Refuse a layout whose roles hold more on a GPU than it has (`capacity`, in bytes),
    saying for each overfull device what each role holds."""
    held: dict[torch.device, list[tuple[str, str, int]]] = {}
    for name, d in layout.roles().items():
        kind = "rollout" if name.startswith("rollout") else "trainer"
        for term, n in needs[kind].items():
            held.setdefault(d, []).append((name, term, n))
    if slots_on is not None:
        held.setdefault(slots_on, []).append(("weight slots", "slots", needs["slots"]["slots"]))
    for d, parts in held.items():
        if d.type != "cuda":
            continue
        total, have = sum(n for _, _, n in parts), capacity(d)
        if total > have:
            lines = "; ".join(f"{who} {term} {n / GIB:.2f}" for who, term, n in parts)
            raise ConfigError(
                f"{d} has {have / GIB:.2f} GiB and this layout puts {total / GIB:.2f} GiB on "
                f"it before any activation ({lines}, in GiB): give the roles more GPUs "
                "(model.rollout_devices, model.trainer_devices), fewer workers on it, or a "
                "smaller train.update_batch_size")


def kv_bytes_per_position(config: Any, dtype_bytes: int) -> int:
    """K and V of every layer for one row at one position (a Hugging Face model config)."""
    layers, heads = int(config.num_hidden_layers), int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def model_size(cfg: RunConfig, trainable_bytes: int) -> ModelSize:
    """The run's model's size from its config alone (a meta-device model: no weights read),
    its trainable tensors' fp32 bytes given, and the KV cache at the dtype sampling holds
    (fp16 under model.dtype fp16)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(cfg.model.path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    params = sum(p.numel() for p in model.parameters())
    kv = kv_bytes_per_position(config, 2 if cfg.model.dtype == "fp16" else 4)
    return ModelSize(params, trainable_bytes // 4, kv)


def longest_prompt_tokens(cfg: RunConfig, prompts: Sequence[tuple[str, str | None]]) -> int:
    """Tokens of the longest of `prompts` (prompt, system) as the rollout encodes them; the
    longest by characters stands for the longest in tokens, give or take a few."""
    from transformers import AutoTokenizer

    from rlcore.policy.loading import encode_prompt

    if not prompts:
        return 0
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
    longest = sorted(prompts, key=lambda p: len(p[0]) + len(p[1] or ""))[-8:]
    return max(len(encode_prompt(tokenizer, p, chat=cfg.model.prompt_format == "chat",
                                 system=s)) for p, s in longest)


def gpu_bytes(device: torch.device) -> int:
    """A GPU's memory, all of it."""
    return int(torch.cuda.get_device_properties(device).total_memory)

