"""Low-rank adapters (`train.lora`): what trains, what is handed over, how sampling sees it.

The trainer trains the adapters with PEFT on a frozen base. Sampling runs a plain model whose
target weights are the base plus the adapters' product, merged once per policy version
(`Merged`): the static and captured decode steps then run unchanged, a token costs what it
costs without LoRA, and a version costs one rank-r product per target. The trainer's own
log-probabilities come from PEFT's unmerged forward.

Adapter tensors are named as PEFT saves them (`base_model.model.<module>.lora_A.weight`),
so a saved policy is a PEFT adapter directory as well as rlcore's.

  targets          the linear layers `train.lora.targets` names, checked against the model
  adapter_spec     the adapters' names, shapes and dtypes (what a weight slot holds)
  initial_adapter  version 0's adapters, the same in every role and process
  wrap             the trainer's PEFT model, with the initial adapters in it
  Merged           a sampling model's target weights as base + alpha / rank * B @ A
  rollout_merged   a rollout's merged sampling weights; merged_copy, a trainer's (sync)
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import re
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlcore.config import ConfigError
from rlcore.config.run import LoraConfig
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


def merge_elements(chosen: list[Target]) -> int:
    """The target weights' elements a merge writes (what `Merge` prices)."""
    return sum(t.in_features * t.out_features for t in chosen)


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


def wrap(model: torch.nn.Module, lora: LoraConfig, chosen: list[Target]) -> Any:
    """The trainer's PEFT model around `model` (changed in place: its targets become LoRA
    layers over the same frozen weights), holding the initial adapters."""
    from peft import get_peft_model

    device = next(model.parameters()).device
    # PEFT's own initialisation draws from the global generators; the adapters are replaced
    # at once, and nothing else a run draws may move
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), \
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
    return peft_model.train(False)  # PEFT makes its dropout modules in train mode


def adapter_params(peft_model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The PEFT model's trainable parameters, by their saved names."""
    return {_PEFT_NAME.sub(r".\1.", n): p for n, p in peft_model.named_parameters()
            if p.requires_grad}


def base_weights(model: torch.nn.Module, chosen: list[Target]) -> dict[str, torch.Tensor]:
    """The target layers' weights in `model` (by reference), by module path."""
    return {t.path: weight(model, t.path) for t in chosen}


def weight(model: torch.nn.Module, path: str) -> torch.Tensor:
    """The weight of the linear layer at `path`."""
    layer = model.get_submodule(path)
    assert isinstance(layer.weight, torch.Tensor)
    return layer.weight


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


class Merged:
    """The target weights of a sampling model, kept equal to base + scale * B @ A by `merge`
    (the model's weight tensors are written in place: a captured step reads them by
    address)."""

    def __init__(self, model: torch.nn.Module, chosen: list[Target],
                 adapter: Mapping[str, torch.Tensor], base: Mapping[str, torch.Tensor],
                 factor: float):
        self.model = model
        self.factor = factor
        self.adapter = dict(adapter)  # the live adapters it merges from (the same tensors)
        self._parts = [(weight(model, t.path).detach(), base[t.path].detach(),
                        adapter[t.a_name], adapter[t.b_name]) for t in chosen]

    def merge(self) -> None:
        with torch.no_grad():
            for out, w0, a, b in self._parts:
                if out.dtype == w0.dtype == a.dtype:
                    torch.addmm(w0, b, a, alpha=self.factor, out=out)
                else:  # held in another dtype: merged in the adapters' dtype, then cast
                    out.copy_(torch.addmm(w0.to(a.dtype), b, a, alpha=self.factor))

    def refresh(self) -> None:
        """As `SamplingCopy.refresh`: after the adapters changed."""
        self.merge()

    def base_state(self) -> dict[str, torch.Tensor]:
        """The base model's parameters by name: the unmerged weights for the targets."""
        base = {out.data_ptr(): w0 for out, w0, _, _ in self._parts}
        return {n: base.get(p.data_ptr(), p) for n, p in self.model.named_parameters()}


def rollout_merged(model: torch.nn.Module, lora: LoraConfig, chosen: list[Target],
                   device: torch.device) -> Merged:
    """A LoRA rollout's sampling weights: `model` frozen, its targets' base weights kept
    apart and version 0's adapters merged over them."""
    for p in model.parameters():
        p.requires_grad_(False)
    base = {path: w.detach().clone() for path, w in base_weights(model, chosen).items()}
    adapter = {n: t.to(device) for n, t in initial_adapter(chosen, lora.rank).items()}
    return Merged(model, chosen, adapter, base, scale(lora))


def merged_copy(peft_model: Any, lora: LoraConfig, chosen: list[Target],
                adapter: Mapping[str, torch.Tensor], dtype: torch.dtype) -> Merged:
    """A trainer's plain copy for sampling (sync) in `dtype`, its targets merged from the
    live adapters over the trainer's own frozen base weights."""
    plain = copy.deepcopy(peft_model).unload()
    hold(plain, dtype)
    base = {t.path: peft_model.get_submodule(f"{PREFIX}{t.path}").base_layer.weight
            for t in chosen}
    merged = Merged(plain, chosen, adapter, base, scale(lora))
    merged.merge()
    return merged


def peft_base_state(peft_model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The frozen base of a PEFT model by the plain model's parameter names."""
    return {n.removeprefix(PREFIX).replace(".base_layer.", "."): p
            for n, p in peft_model.named_parameters() if ".lora_" not in n}


def save_adapter(out_dir: Path, adapter: Mapping[str, torch.Tensor], lora: LoraConfig,
                 chosen: list[Target], base_path: str, base_digest: str) -> None:
    """A PEFT adapter directory (weights and config), and the digest of the base it needs."""
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    save_file({n: t.detach().to("cpu").contiguous() for n, t in adapter.items()},
              str(out_dir / ADAPTER_WEIGHTS))
    peft_config(lora, chosen, base_path).save_pretrained(str(out_dir))
    (out_dir / BASE_FILE).write_text(json.dumps(
        {"base_path": base_path, "base_digest": base_digest}, indent=2) + "\n")


def is_adapter_dir(path: Path) -> bool:
    return (path / ADAPTER_WEIGHTS).is_file() and (path / BASE_FILE).is_file()


def read_adapter(path: Path) -> tuple[dict[str, torch.Tensor], str]:
    """A saved adapter's tensors and the digest of the base it was trained on."""
    from safetensors.torch import load_file

    base = json.loads((path / BASE_FILE).read_text())["base_digest"]
    return load_file(str(path / ADAPTER_WEIGHTS)), base


__all__ = ["ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "BASE_FILE", "Merged", "Target",
           "adapter_params", "adapter_spec", "base_weights", "dropout_draws",
           "initial_adapter", "is_adapter_dir", "merge_elements", "merged_copy",
           "model_targets", "peft_base_state", "read_adapter", "rollout_merged", "save_adapter",
           "scale", "targets", "wrap"]
