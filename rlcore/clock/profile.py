"""Hardware profiles: the cost model that prices a role's work in seconds.

A profile is one YAML file under `config/hardware/` (or any path): per cost term, a few
coefficients with their units, and where they come from (`rlcore calibrate` on a machine,
or derived from published hardware figures; docs/virtual_clock.md). Every term is linear
in the sizes of `work.py`, so the price of a chunk or an update is one dot product.

`gil_share` is the fraction of a term's seconds spent holding Python's interpreter lock
(launching kernels, the sampling loop): under the threaded baseline the roles share one
interpreter, so those seconds of different roles cannot overlap (`virtual.py`).

`handoff`, when given, prices a rollout worker's handing of a batch to the controller, which
only a fit to live runs measures (a profile without it leaves that time out).

`cpu` says what the roles' computations share of the processors; `drift`, when given, that
their speed wanders about its mean as a live machine's does; `accelerator`, when given,
says that the rollout worker and the trainers compute on one accelerator, so that their
device work (`DEVICE_WORK`) slows each other's.

`decode_path`, `weight_transport` and `device_type` say what the costs are of: the decode
path and weight transport that were timed (or derived), on which kind of device. A virtual
run or plan whose config would take another path there says so (`profile_mismatch` in its
summary, rlcore/record/summary.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import typing
from pathlib import Path
from typing import Any

from rlcore.clock.work import (
    Adapters,
    AllReduce,
    Decode,
    Digest,
    Prefill,
    Reward,
    Update,
    Weights,
    Work,
    terms,
)
from rlcore.config.files import parse_yaml
from rlcore.config.run import LoraConfig
from rlcore.config.schema import schema_for, validation_errors
from rlcore.errors import ConfigError

# The shipped profiles: `runtime.hardware: NAME` reads config/hardware/NAME.yaml.
HARDWARE_DIR = Path(__file__).resolve().parents[2] / "config" / "hardware"


def _f(help: str, **constraints: Any) -> Any:
    return dataclasses.field(metadata={"help": help, **constraints})


_SHARE = dict(minimum=0, maximum=1)


@dataclasses.dataclass(frozen=True)
class DecodeCost:
    step_s: float = _f("seconds per sampling step, whatever the batch (softmax, draw, "
                       "Python loop)", minimum=0)
    per_row_s: float = _f("seconds per row of a decode forward pass", minimum=0)
    per_row_context_s: float = _f("seconds per row and KV-cache position of a decode "
                                  "forward pass (attention over the cache)", minimum=0)
    gil_share: float = _f("share of these seconds holding the interpreter lock", **_SHARE)


@dataclasses.dataclass(frozen=True)
class TokenCost:
    call_s: float = _f("seconds per call, whatever its size", minimum=0)
    per_token_s: float = _f("seconds per token (rows x padded width)", minimum=0)
    gil_share: float = _f("share of these seconds holding the interpreter lock", **_SHARE)


@dataclasses.dataclass(frozen=True)
class CopyCost:
    call_s: float = _f("seconds per copy, whatever its size", minimum=0)
    gb_per_s: float = _f("bandwidth of the copy, in 1e9 bytes per second", exclusiveMinimum=0)
    gil_share: float = _f("share of these seconds holding the interpreter lock", **_SHARE)


@dataclasses.dataclass(frozen=True)
class AdapterCost:
    call_s: float = _f("seconds per decode step, whatever its size (the small kernels each "
                       "target launches)", minimum=0)
    per_param_s: float = _f("seconds per adapter element per row (the two rank-r products)",
                            minimum=0)
    gil_share: float = _f("share of these seconds holding the interpreter lock", **_SHARE)


@dataclasses.dataclass(frozen=True)
class LoraView:
    adapter_elements: int | None = _f("the adapters' elements a row multiplies on the "
                                      "profile's model, at the run's rank and targets; "
                                      "null: the run's own", minimum=1)


@dataclasses.dataclass(frozen=True)
class RewardCost:
    answer_s: float = _f("seconds to score one answer with last_integer or exact (parse and "
                         "compare)", minimum=0)
    code_s: float = _f("seconds to score one code task (its tests in the sandbox)", minimum=0)
    math_s: float = _f("seconds to score one answer with math-verify (reward.verifier math: "
                       "a round trip to its worker process, parse and compare)", minimum=0)
    gil_share: float = _f("share of these seconds holding the interpreter lock", **_SHARE)


@dataclasses.dataclass(frozen=True)
class ControllerCost:
    message_s: float = _f("seconds to handle one message, whatever it holds", minimum=0)
    per_sample_s: float = _f("seconds per sample a message carries (filter, ledger row)",
                             minimum=0)


@dataclasses.dataclass(frozen=True)
class HandoffCost:
    call_s: float = _f("seconds per batch handed over, whatever its size", minimum=0)
    per_sample_s: float = _f("seconds per sample it carries (decoded to text, pickled)",
                             minimum=0)


@dataclasses.dataclass(frozen=True)
class CommitCost:
    call_s: float = _f("seconds for the parameter service to decide one commit", minimum=0)


@dataclasses.dataclass(frozen=True)
class CpuCost:
    cores: int | None = _f("processors the roles' computations share (each of n computing at "
                           "once gets min(1, cores / n) of one); null: each role has its own, "
                           "as with a GPU per role", minimum=1)
    concurrent_slowdown: float = _f(
        "how much each computation slows while k run at once on the shared processors "
        "(memory bandwidth, caches, sibling hyperthreads): speed 1 / (1 + s (k - 1))",
        minimum=0)


# What runs on a role's accelerator when the roles have one; the rest is host work.
DEVICE_WORK = (Decode, Prefill, Update, AllReduce, Adapters, Weights)


@dataclasses.dataclass(frozen=True)
class AcceleratorCost:
    concurrent_slowdown: float = _f(
        "how much each device computation slows per other one running at once on the one "
        "accelerator: speed 1 / (1 + s (k - 1)); 1 is strict time-slicing of a saturated "
        "device, 0 no contention", minimum=0)


@dataclasses.dataclass(frozen=True)
class DriftCost:
    sd: float = _f("standard deviation of the log of each role's speed about its mean "
                   "(`drift.py`): at 0.2 the same work takes 0.66-1.45 times its price 95 % "
                   "of the time", minimum=0)
    time_s: float = _f("correlation time of that speed, in seconds: how long a slow or fast "
                       "stretch lasts", exclusiveMinimum=0)


@dataclasses.dataclass(frozen=True)
class HardwareProfile:
    """Seconds per unit of work for each role's computations on one machine and model."""

    name: str = _f("the profile's name (its file name under config/hardware/)")
    machine: str = _f("the machine and model these costs hold for")
    source: str = _f("how the numbers were obtained: measured (by whom, when) or derived")
    model_bytes: int | None = _f(
        "bytes of one copy of the trainable state of the model these costs are for, which a "
        "weight copy moves; null: the run's own model's (a profile calibrated on that model)",
        minimum=1)
    decode: DecodeCost = _f("rollout: a decode step (`work.py::Decode`)")
    prefill: TokenCost = _f("rollout (re)prefill and the proximal recompute (`work.py::Prefill`)")
    update: TokenCost = _f("trainer: one update (`work.py::Update`)")
    weight_write: CopyCost = _f("trainer: writing its candidate state (`work.py::Weights`)")
    weight_read: CopyCost = _f("rollout or trainer: loading the published state")
    reward: RewardCost = _f("controller: scoring one response (`work.py::Reward`)")
    controller: ControllerCost = _f("controller: handling one message (`work.py::Handle`)")
    commit: CommitCost = _f("parameter service: deciding one commit (`work.py::Commit`)")
    cpu: CpuCost = _f("what the roles' computations share; not applied under the threaded "
                      "baseline, whose roles share the interpreter lock instead (`gil_share`)")
    accelerator: AcceleratorCost | None = dataclasses.field(default=None, metadata={
        "help": "the rollout worker and the trainers compute on one shared accelerator (their "
                "device work slows each other, as `cpu` does for cores); null or absent: each "
                "role has its own device"})
    handoff: HandoffCost | None = dataclasses.field(default=None, metadata={
        "help": "rollout: handing a finished batch over to the controller "
                "(`work.py::Handoff`), fitted by `rlcore calibrate --from-runs`; null or "
                "absent: free, as in a profile timed term by term"})
    drift: DriftCost | None = dataclasses.field(default=None, metadata={
        "help": "each role's speed drifts about its mean (`rlcore/clock/drift.py`), seeded "
                "by the run's seed; null or absent: every computation costs its price exactly"})
    host: str | None = dataclasses.field(default=None, metadata={
        "help": "the CPU the costs were measured on (`rlcore.kernels.cpu_name`); null or "
                "absent: derived, or not recorded"})
    kernels: str | None = dataclasses.field(default=None, metadata={
        "help": "the kernel level they were measured with (runtime.kernels: portable or "
                "native); null or absent: not recorded"})
    decode_path: str | None = dataclasses.field(default=None, metadata={
        "help": "the decode path `decode` and `prefill` price (model.decode as a run resolves "
                "it, rlcore/policy/decoders.py); null or absent: not recorded",
        "enum": ["hf", "static", "graph"]})
    weight_transport: str | None = dataclasses.field(default=None, metadata={
        "help": "the weight transport `weight_write` and `weight_read` price "
                "(runtime.weight_transport as a run resolves it); null or absent: not recorded",
        "enum": ["host", "pinned", "device"]})
    lora_update: TokenCost | None = dataclasses.field(default=None, metadata={
        "help": "trainer: one update of low-rank adapters on frozen base weights "
                "(train.lora: no weight gradients for the base, AdamW over the adapters "
                "alone); null or absent: the profile prices no LoRA run"})
    adapters: AdapterCost | None = dataclasses.field(default=None, metadata={
        "help": "rollout, and sync's sampling: the adapters' products a LoRA decode step "
                "adds, applied unmerged (`work.py::Adapters`); null or absent: the profile "
                "prices no LoRA run"})
    sha256: CopyCost | None = dataclasses.field(default=None, metadata={
        "help": "trainer and readers under train.lora: the sha256 of the adapters a version "
                "hands over, published with it and checked on arrival (`work.py::Digest`; "
                "from a GPU, their copy to the host included); null or absent: the profile "
                "prices no LoRA run"})
    allreduce: CopyCost | None = dataclasses.field(default=None, metadata={
        "help": "trainer ranks (runtime.trainer_ranks): summing their gradients once per "
                "optimizer step, a ring all-reduce in which each rank moves 2 (M - 1) / M of "
                "the trainable state's bytes (`work.py::AllReduce`), at gb_per_s between "
                "ranks; null or absent: the profile prices no run of several ranks"})
    kv_bytes_per_position: int | None = dataclasses.field(default=None, metadata={
        "help": "the K and V of every layer for one row at one position, at the dtype "
                "sampling holds, of the model these costs are for: the KV cache in a plan's "
                "memory per device (prices nothing); null or absent: no memory in the plan",
        "minimum": 1})
    host_links: int | None = dataclasses.field(default=None, metadata={
        "help": "weight copies through host memory (`weight_write`, `weight_read`) that run "
                "at full speed at once: the host's links to the GPUs (a PCIe switch's uplink "
                "serves the GPUs under it); more copies at once share them evenly; null or "
                "absent: every copy has a link of its own", "minimum": 1})
    linear_layers: dict[str, list[int]] | None = dataclasses.field(default=None, metadata={
        "help": "the linear layers of the model these costs are for, by the last part of "
                "their name: [in, out, how many]. A LoRA run's copies and adapter products "
                "are priced at that model's adapters at the run's rank and targets; null or "
                "absent: the run's own model's"})
    lora_view: LoraView | None = dataclasses.field(default=None, metadata={
        "help": "derived by `under`, never set in a file: the profile as a LoRA run sees "
                "it; null: as a run of every weight"})
    device_type: str | None = dataclasses.field(default=None, metadata={
        "help": "the kind of device the roles computed on: a virtual run or plan resolves its "
                "config's auto devices to it, to compare the decode path and transport it "
                "would take with those priced; null or absent: not recorded",
        "enum": ["cpu", "cuda"]})

    def prices(self, work: Work) -> bool:
        """Whether this profile prices `work` at all: not when it leaves the work's optional
        section out (`handoff`), which then costs nothing and is not listed as charged."""
        return all(getattr(self, key.split(".")[0]) is not None for key in terms(work))

    def seconds(self, work: Work) -> float:
        """The price of `work` on this hardware: each of its terms (`work.py::terms`) at the
        coefficient of the same name (0 for work it does not price)."""
        if isinstance(work, Adapters) and self.lora_view is not None \
                and self.lora_view.adapter_elements is not None:
            # the profile's model's adapters, not the run's, as `model_bytes` for a copy
            work = dataclasses.replace(work, params=self.lora_view.adapter_elements)
        if isinstance(work, AllReduce) and self.model_bytes is not None:
            work = dataclasses.replace(work, nbytes=self.model_bytes)  # as for a copy
        return self.seconds_of(terms(work))

    def seconds_of(self, work_terms: dict[str, float]) -> float:
        """The price of work given as its terms and quantities (a span's `work` in
        events.jsonl, `work.py::terms`); a section the profile leaves out costs nothing.
        Adapter products are priced at the elements recorded, not a `lora_view`'s."""
        return sum(self._term_s(key, quantity) for key, quantity in work_terms.items())

    def _term_s(self, key: str, quantity: float) -> float:
        section, coefficient = key.split(".")
        cost = getattr(self, section)
        if cost is None:  # an optional section left out (`prices`)
            return 0.0
        if coefficient == "per_gb":  # a copy: its gigabytes, at the profile's bandwidth
            gb = quantity if self.model_bytes is None else self.model_bytes / 1e9
            return float(gb / cost.gb_per_s)
        if coefficient == "per_ring_gb":  # what each rank moves (`seconds` sized it)
            return float(quantity / cost.gb_per_s)
        return float(getattr(cost, coefficient) * quantity)

    def gil_share(self, work: Work) -> float:
        """The share of `work`'s seconds that holds the interpreter lock."""
        match work:
            case Decode():
                return self.decode.gil_share
            case Prefill():
                return self.prefill.gil_share
            case Update():
                cost = self.lora_update if work.frozen_base else self.update
                return cost.gil_share if cost is not None else 1.0
            case Adapters():
                return self.adapters.gil_share if self.adapters is not None else 1.0
            case Digest():
                return self.sha256.gil_share if self.sha256 is not None else 1.0
            case AllReduce():
                return self.allreduce.gil_share if self.allreduce is not None else 1.0
            case Weights():
                return (self.weight_write if work.direction == "write"
                        else self.weight_read).gil_share
            case Reward():
                return self.reward.gil_share
        return 1.0  # the controller, the service and a hand-off are Python through and through

    @property
    def prices_captured_steps(self) -> bool:
        """Its decode prices are a captured step's, which computes its whole bucket."""
        return self.decode_path == "graph"

    def under(self, lora: LoraConfig | None) -> HardwareProfile:
        """The profile as a run with `lora` sees it: its copies are the adapters of the
        profile's model (`linear_layers`), and so are the adapters its decode steps multiply.
        Refuses a profile that cannot price a LoRA run, saying what it lacks."""
        if lora is None:
            return self
        lacks = [k for k in ("lora_update", "adapters", "sha256") if getattr(self, k) is None]
        if self.model_bytes is not None and self.linear_layers is None:
            lacks.append("linear_layers (its model_bytes are of a full model)")
        if lacks:
            raise ConfigError(f"hardware profile {self.name} cannot price train.lora: it has no "
                              f"{', '.join(lacks)}; fit one with `rlcore calibrate` on a config "
                              "that sets train.lora, or add them (docs/virtual_clock.md)")
        if self.linear_layers is None:
            return dataclasses.replace(self, lora_view=LoraView(None))
        missing = [t for t in lora.targets if t not in self.linear_layers]
        if missing:
            raise ConfigError(f"train.lora.targets names {missing}, which hardware profile "
                              f"{self.name}'s model has no linear layer of (its "
                              f"linear_layers: {sorted(self.linear_layers)})")
        chosen = [self.linear_layers[t] for t in lora.targets]
        elements = sum(lora.rank * (i + o) * n for i, o, n in chosen)
        return dataclasses.replace(self, model_bytes=4 * elements,  # fp32 adapters
                                   lora_view=LoraView(elements))

    def check_ranks(self, ranks: int) -> None:
        """Refuse to price a trainer of several ranks without an all-reduce term."""
        if ranks > 1 and self.allreduce is None:
            raise ConfigError(
                f"runtime.trainer_ranks ({ranks}): hardware profile {self.name} prices no "
                "gradient sum between ranks (no `allreduce` section); add one "
                "(docs/virtual_clock.md) or use a profile that has it")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def digest(self) -> str:
        """A short digest of the costs (not the prose, nor the labels of what they price),
        recorded with every virtual run."""
        # A run of every weight reads no LoRA term: its digest is the profile's without them
        skip = {"linear_layers", "lora_view"} | (set() if self.lora_view else set(LORA_KEYS))
        costs: dict[str, Any] = {k: v for k, v in self.to_dict().items()
                                 if isinstance(v, dict) and k not in skip}
        if self.host_links is not None:  # a count, not a section, that prices copies
            costs["host_links"] = self.host_links
        if self.lora_view is not None:
            costs["lora_view"] = {"model_bytes": self.model_bytes,
                                  **dataclasses.asdict(self.lora_view)}
        return hashlib.sha256(json.dumps(costs, sort_keys=True).encode()).hexdigest()[:16]


# The keys a profile file may leave out (null, as when absent); every other key is required.
OPTIONAL_KEYS = ("accelerator", "handoff", "drift", "host", "kernels", "decode_path",
                 "weight_transport", "device_type", "lora_update", "adapters", "sha256",
                 "allreduce", "host_links", "kv_bytes_per_position", "linear_layers",
                 "lora_view")
# what only a LoRA run's price reads
LORA_KEYS = ("lora_update", "adapters", "sha256", "linear_layers")


def optional_section(name: str) -> dict[str, float]:
    """An optional cost section of `OPTIONAL_KEYS` (e.g. `handoff`) with every coefficient
    0: what a fit fills in when its base profile leaves the section out."""
    tp = typing.get_type_hints(HardwareProfile)[name]
    cls = next(a for a in typing.get_args(tp) if a is not type(None))
    return {f.name: 0.0 for f in dataclasses.fields(cls)}


def profile_schema() -> dict[str, Any]:
    """JSON Schema of a hardware profile file; every key but `OPTIONAL_KEYS` is required."""
    schema = schema_for(HardwareProfile)

    def require_all(node: dict[str, Any]) -> None:
        node["required"] = [k for k in node["properties"] if k not in OPTIONAL_KEYS]
        for sub in node["properties"].values():
            for branch in sub.get("anyOf", [sub]):  # an optional section: its non-null branch
                if "properties" in branch:
                    require_all(branch)

    require_all(schema)
    return schema


def _build(cls: type, data: dict[str, Any]) -> Any:
    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        value = data.get(f.name)  # only an optional key may be absent (the schema checks)
        tp = hints[f.name]  # `X | None` is built as X, unless null
        tp = next((a for a in typing.get_args(tp) if a is not type(None)), tp)
        if value is not None and isinstance(tp, type) and dataclasses.is_dataclass(tp):
            value = _build(tp, value)
        values[f.name] = value
    return cls(**values)


def profile_path(name_or_path: str) -> Path:
    """The file `runtime.hardware` names: a shipped profile's name, or a path."""
    if name_or_path.endswith((".yaml", ".yml")) or "/" in name_or_path:
        path = Path(name_or_path)
    else:
        path = HARDWARE_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        shipped = sorted(p.stem for p in HARDWARE_DIR.glob("*.yaml"))
        raise ConfigError(f"runtime.hardware '{name_or_path}': no profile at {path}; give a "
                          f"YAML file's path or one of {', '.join(shipped)} "
                          "(`rlcore calibrate` writes one for this machine)")
    return path


def load_profile(name_or_path: str) -> HardwareProfile:
    """Read and validate a hardware profile; errors name the file and the key."""
    path = profile_path(name_or_path)
    try:
        data = parse_yaml(path.read_text())
    except ConfigError as e:
        raise ConfigError(f"hardware profile {path}: {e}") from e
    return profile_from_dict(data, str(path))


def profile_from_dict(data: dict[str, Any], where: str = "(in memory)") -> HardwareProfile:
    """A validated profile from its file's contents; errors name `where` and the key."""
    # a profile written while rollouts merged each version's adapters into their weights
    if isinstance(data, dict) and "merge" in data:
        raise ConfigError(f"hardware profile {where}: key merge is no longer read: sampling "
                          "applies LoRA adapters unmerged, priced per decode step by "
                          "`adapters` (call_s, per_param_s, gil_share); replace merge with "
                          "it (docs/virtual_clock.md) or refit with `rlcore calibrate`")
    errors = validation_errors(profile_schema(), data)
    if errors:
        raise ConfigError(f"hardware profile {where}: " + "; ".join(
            e.replace("config key", "key") for e in errors))
    return typing.cast(HardwareProfile, _build(HardwareProfile, data))
