"""The weights sampling computes with (`model.rollout_weights`).

Under `model.dtype: fp16` on CUDA every op autocasts its fp32 weights to fp16, and a captured
decode step (whose cast cache must stay off) casts every weight at every token: for a
0.5B-parameter model that is more memory traffic than the step's own products. Held in the
dtype it computes in, a rollout casts each policy version once, as it arrives. The trainer
keeps its fp32 weights and recomputes its log-probabilities itself; only the behaviour
log-probabilities come from the sampling weights, and they are those of the policy that
sampled.

  sampling_dtype  the dtype a role's sampling weights are held in, from the config
  hold            cast a model's parameters (not its buffers) to that dtype, in place
  SamplingCopy    a copy in that dtype of a model that also trains (sync), refreshed after
                  each update (under LoRA: its adapters, kept fp32 and applied unmerged)
"""

from __future__ import annotations

import copy

import torch

from rlcore.config.run import ModelConfig

DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16"}  # as model.dtype names them


def sampling_dtype(model_cfg: ModelConfig, device: torch.device) -> torch.dtype:
    """fp16 where the rollout computes in fp16 (model.dtype fp16 on CUDA) and
    model.rollout_weights is `compute`; fp32 otherwise."""
    if (model_cfg.rollout_weights == "compute" and model_cfg.dtype == "fp16"
            and device.type == "cuda"):
        return torch.float16
    return torch.float32


def hold(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Cast `model`'s parameters to `dtype` in place; the Parameter objects stay (so do tied
    weights), and buffers such as the rotary frequencies keep their precision. LoRA adapters
    (PEFT's `lora_A`, `lora_B`) stay fp32, as the trainer's: PEFT casts their input to it."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dtype != dtype and ".lora_" not in name:
                p.data = p.data.to(dtype)


class SamplingCopy:
    """A copy of a training model held in `dtype` for sampling; `refresh` copies the model's
    current trainable weights into it (all of them, or under LoRA the adapters: the base is
    frozen), casting, with the copy's storage kept (a captured decode step reads it by
    address)."""

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype):
        self.model = copy.deepcopy(model)
        hold(self.model, dtype)
        pairs = [(p.detach(), q.detach()) for p, q in zip(model.parameters(),
                                                          self.model.parameters(), strict=True)
                 if p.requires_grad]
        self._src = [p for p, _ in pairs]
        self._dst = [q for _, q in pairs]

    def refresh(self) -> None:
        with torch.no_grad():
            torch._foreach_copy_(self._dst, self._src)


__all__ = ["DTYPE_NAMES", "SamplingCopy", "hold", "sampling_dtype"]
