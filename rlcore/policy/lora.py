"""Low-rank adapters (`train.lora`): what trains, what is handed over, how sampling sees it.

The trainer trains the adapters with PEFT on a frozen base; a rollout wraps its model with the
same LoRA layers, over its base held in the sampling dtype, with the adapters in fp32. Every
forward applies the adapters unmerged, base output + alpha / rank * B (A x): PEFT's own
forward for prompts, and the static and captured decode steps (`decode_step.py::linear`) for
each next token, reading A and B from the same tensors, which a version's load overwrites in
place. So a small update is never rounded onto an fp16 base's grid, nothing is merged or
recaptured when a version arrives, and a token costs two rank-r products per target more.

Adapter tensors are named as PEFT saves them (`base_model.model.<module>.lora_A.weight`),
so a saved policy is a PEFT adapter directory as well as rlcore's.

  targets          the linear layers `train.lora.targets` names, checked against the model
  adapter_spec     the adapters' names, shapes and dtypes (what a weight slot holds)
  initial_adapter  version 0's adapters, the same in every role and process
  wrap             the trainer's PEFT model, with the initial adapters in it
  rollout_wrap     a rollout's model, adapted the same way, frozen, its base held to sample
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import threading
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlcore.config import ConfigError
from rlcore.config.run import LoraConfig
from rlcore.policy.digest import state_digest
from rlcore.policy.sampling_weights import hold

PREFIX = "base_model.model."  # PEFT's name for the wrapped model, in its saved adapters
ADAPTER_WEIGHTS = "adapter_model.safetensors"  # PEFT's file names, so PEFT can load ours
ADAPTER_CONFIG = "adapter_config.json"
BASE_FILE = "rlcore_adapter.json"  # the base the adapter sits on, by digest
# Version 0's adapters are a property of the model, not of a run's seed, as its base weights
# are: every seed starts from the same policy.
INIT_SEED = 0

_PEFT_NAME = re.compile(r"\.(lora_[AB])\.default\.")


@dataclass(frozen=True)
class Target:
    """One adapted linear layer: its module path in the plain model and its widths."""

    path: str
    in_features: int
    out_features: int

    @property
    def a_name(self) -> str:
        return f"{PREFIX}{self.path}.lora_A.weight"

    @property
    def b_name(self) -> str:
        return f"{PREFIX}{self.path}.lora_B.weight"


def scale(lora: LoraConfig) -> float:
    """The factor on the adapters' product (PEFT's, without rsLoRA)."""
    return lora.alpha / lora.rank


def targets(model: torch.nn.Module, lora: LoraConfig) -> list[Target]:
    """The linear layers `lora.targets` names in `model`, in module order; refuses a target
    the model lacks and a rank above a layer's narrower width, naming the key."""
    output_embeddings = getattr(model, "get_output_embeddings", None)
    head = output_embeddings() if output_embeddings is not None else None
    linear = {n: m for n, m in model.named_modules()
              if isinstance(m, torch.nn.Linear) and m is not head}
    last = {n.rsplit(".", 1)[-1] for n in linear}
    missing = [t for t in lora.targets if t not in last]
    if missing:
        raise ConfigError(f"train.lora.targets names {missing}, which the model has no linear "
                          f"layer of; its linear layers are named {sorted(last)}")
    chosen = [Target(n, m.in_features, m.out_features) for n, m in linear.items()
              if n.rsplit(".", 1)[-1] in lora.targets]
    narrowest = min(chosen, key=lambda t: min(t.in_features, t.out_features))
    width = min(narrowest.in_features, narrowest.out_features)
    if lora.rank > width:
        raise ConfigError(
            f"train.lora.rank {lora.rank} is above the width of {narrowest.path} "
            f"({narrowest.in_features} in, {narrowest.out_features} out), so its adapter "
            f"would be no lower in rank than the layer: set train.lora.rank to at most {width}")
    return chosen


def model_targets(model_dir: str | Path, lora: LoraConfig) -> list[Target]:
    """`targets` from the model's config file alone (on the meta device: no weights)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(model_dir))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return targets(model, lora)


def adapter_spec(chosen: list[Target], rank: int) -> list[tuple[str, tuple[int, ...],
                                                                 torch.dtype]]:
    """Names, shapes and dtypes of the adapters: A is rank x in, B is out x rank, in fp32."""
    spec: list[tuple[str, tuple[int, ...], torch.dtype]] = []
    for t in chosen:
        spec += [(t.a_name, (rank, t.in_features), torch.float32),
                 (t.b_name, (t.out_features, rank), torch.float32)]
    return spec


def adapter_elements(chosen: list[Target], rank: int) -> int:
    """The adapters' elements a row multiplies in a forward pass (what `Adapters` prices)."""
    return sum(rank * (t.in_features + t.out_features) for t in chosen)


def initial_adapter(chosen: list[Target], rank: int) -> dict[str, torch.Tensor]:
    """Version 0: A uniform in +-1/sqrt(in) (PEFT's Kaiming init), B zero, so the adapted
    model starts as the base; drawn from its own generator, on CPU, in target order."""
    gen = torch.Generator().manual_seed(INIT_SEED)
    state = {}
    for t in chosen:
        bound = 1.0 / math.sqrt(t.in_features)
        state[t.a_name] = (torch.rand(rank, t.in_features, generator=gen) * 2 - 1) * bound
        state[t.b_name] = torch.zeros(t.out_features, rank)
    return state


def peft_config(lora: LoraConfig, chosen: list[Target], base_path: str = "") -> Any:
    """PEFT's LoraConfig for these targets (named in full: no other layer matches)."""
    from peft import LoraConfig as PeftLoraConfig

    # PEFT annotates lora_alpha as int and divides by r: a float scales as it says
    return PeftLoraConfig(r=lora.rank, lora_alpha=lora.alpha,  # type: ignore[arg-type]
                          lora_dropout=lora.dropout, target_modules=[t.path for t in chosen],
                          bias="none", task_type="CAUSAL_LM",
                          base_model_name_or_path=base_path)


_WRAP_LOCK = threading.Lock()


def wrap(model: torch.nn.Module, lora: LoraConfig, chosen: list[Target]) -> Any:
    """The trainer's PEFT model around `model` (changed in place: its targets become LoRA
    layers over the same frozen weights), holding the initial adapters."""
    from peft import get_peft_model

    device = next(model.parameters()).device
    # PEFT's own initialisation draws from the global generators; the adapters are replaced
    # at once, and nothing else a run draws may move. The generators' state and the warning
    # filters are the process's: the threaded runner's roles wrap at once, and each restores
    # what it saved, so one at a time, or one would restore over the other's.
    with _WRAP_LOCK, torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), \
            warnings.catch_warnings():
        # PEFT asks transformers 5 a question by its old name; the answer is the same
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated",
                                FutureWarning)
        peft_model = get_peft_model(model, peft_config(lora, chosen,
                                                       getattr(model, "name_or_path", "")))
    params = adapter_params(peft_model)
    with torch.no_grad():
        for name, tensor in initial_adapter(chosen, lora.rank).items():
            params[name].copy_(tensor)
    # PEFT makes its new dropout layers in training mode; sampling and recompute must not drop
    return peft_model.train(False)


def adapter_params(peft_model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The PEFT model's trainable parameters, by their saved names."""
    return {_PEFT_NAME.sub(r".\1.", n): p for n, p in peft_model.named_parameters()
            if p.requires_grad}


@contextlib.contextmanager
def dropout_draws(peft_model: torch.nn.Module, seed: int) -> Iterator[None]:
    """The adapters' dropout on, drawing from `seed`, for one forward; off again after."""
    drops = [m for n, m in peft_model.named_modules() if n.rsplit(".", 1)[-1] == "lora_dropout"]
    device = next(peft_model.parameters()).device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        for m in drops:
            m.train(True)
        try:
            yield
        finally:
            for m in drops:
                m.train(False)


def rollout_wrap(model: torch.nn.Module, lora: LoraConfig, chosen: list[Target],
                 dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """A rollout's model with PEFT's LoRA layers over its base (changed in place, frozen),
    the base then held in `dtype` and the adapters in fp32; returns the live adapters, which
    each version's load overwrites and every forward and decode step applies unmerged."""
    peft_model = wrap(model, lora, chosen)
    adapter = adapter_params(peft_model)
    for p in model.parameters():
        p.requires_grad_(False)
    hold(model, dtype)
    return adapter


def peft_base_state(peft_model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The frozen base of a model, PEFT-wrapped or not, by the plain model's parameter
    names."""
    return {n.removeprefix(PREFIX).replace(".base_layer.", "."): p
            for n, p in peft_model.named_parameters() if ".lora_" not in n}


@dataclass(frozen=True)
class BaseId:
    """The base the adapters sit on: the digest of its weights as loaded, the dtype that
    digest was taken in and the model directory's weight files (compared first, to say
    which of them differs)."""

    digest: str
    dtype: str
    files: tuple[str, ...]

    @classmethod
    def of(cls, model: torch.nn.Module, model_dir: str | Path) -> BaseId:
        """The base of `model` (PEFT-wrapped or not) as loaded from `model_dir`: uncast, so
        every role, save and load agrees on it whatever dtype a role holds it in."""
        state = peft_base_state(model)
        dtypes = sorted({str(t.dtype).removeprefix("torch.") for t in state.values()})
        files = tuple(sorted(p.name for p in Path(model_dir).glob("*.safetensors")))
        return cls(state_digest(state), "+".join(dtypes), files)

    def differs(self, saved: Mapping[str, Any]) -> str | None:
        """What differs between this base and one an adapter recorded; None if nothing."""
        if saved.get("base_digest") == self.digest:
            return None
        dtype, files = saved.get("base_dtype"), saved.get("base_files")
        if dtype is None or files is None:
            return ("its digest differs, and it records neither the dtype nor the files it "
                    "was taken of (an earlier rlcore hashed the base in the dtype the saving "
                    "role held it in, fp16 in an fp16 rollout): retrain, or point model.path "
                    "at the base the run trained on")
        if dtype != self.dtype:
            return (f"its digest was taken of {dtype} weights, this one of {self.dtype}: "
                    "load the base in the dtype the run loaded it in")
        if tuple(files) != self.files:
            return (f"it was trained on weight files {list(files)}, and model.path holds "
                    f"{list(self.files)}: point model.path at the base the run trained on")
        return ("the weight files have the same names, but their weights differ: model.path "
                "holds another checkpoint; point it at the base the run trained on")


def save_adapter(out_dir: Path, adapter: Mapping[str, torch.Tensor], lora: LoraConfig,
                 chosen: list[Target], base_path: str, base: BaseId) -> None:
    """A PEFT adapter directory (weights and config), and the base it needs."""
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    save_file({n: t.detach().to("cpu").contiguous() for n, t in adapter.items()},
              str(out_dir / ADAPTER_WEIGHTS))
    peft_config(lora, chosen, base_path).save_pretrained(str(out_dir))
    (out_dir / BASE_FILE).write_text(json.dumps(
        {"base_path": base_path, "base_digest": base.digest, "base_dtype": base.dtype,
         "base_files": list(base.files)}, indent=2) + "\n")


def is_adapter_dir(path: Path) -> bool:
    return (path / ADAPTER_WEIGHTS).is_file() and (path / BASE_FILE).is_file()


def read_adapter(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """A saved adapter's tensors and what it records of its base (`base_digest`, and from
    this rlcore on `base_dtype` and `base_files`)."""
    from safetensors.torch import load_file

    base = json.loads((path / BASE_FILE).read_text())
    return load_file(str(path / ADAPTER_WEIGHTS)), base


__all__ = ["ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "BASE_FILE", "BaseId", "Target",
           "adapter_elements", "adapter_params", "adapter_spec", "dropout_draws",
           "initial_adapter", "is_adapter_dir",
           "model_targets", "peft_base_state", "read_adapter", "rollout_wrap", "save_adapter",
           "scale", "targets", "wrap"]
