"""The run configuration: one frozen, typed object, validated once at the boundary.

Each key's type, default, constraints and help line live on the dataclasses below, from which
`rlcore.config.schema` derives the validation schema and the reference. `rlcore.config.load`
builds the config from a mapping or a file (read, with `--set` overrides, by
`rlcore.config.files`).
"""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any, Literal

from rlcore.algo import registry as objectives
from rlcore.config.schema import field as _f
from rlcore.config.schema import reference_markdown, schema_for
from rlcore.config.schema import section as _section
from rlcore.config.task import EvalConfig, RewardConfig, TaskConfig

__all__ = ["LORA_TARGETS", "MODES", "LoraConfig", "RunConfig", "config_reference_markdown",
           "run_config_schema"]

Mode = Literal["sync", "async", "areal"]
# The runners, in the order of every table and figure: the paper's names, used as the config's
# `mode`, the grid's wildcard and the run directory's first level.
MODES: tuple[Mode, ...] = typing.get_args(Mode)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    path: str = _f(
        "models/tiny",
        "Local Hugging Face model directory (config.json + weights); build the embedded tiny "
        "model there with `rlcore build-base DIR`, or point at e.g. a Qwen2.5-0.5B-Instruct copy.",
    )
    dtype: Literal["fp32", "fp16"] = _f(
        "fp32", "fp32 weights; fp16 = fp32 weights with fp16 autocast (CUDA only, as on V100)."
    )
    rollout_weights: Literal["compute", "fp32"] = _f(
        "compute",
        "The dtype sampling holds its weights in: compute = the dtype it computes in (fp16 "
        "under model.dtype fp16 on CUDA, cast once per policy version rather than at every "
        "step; sync keeps a copy for sampling; fp32 elsewhere); fp32 = the fp32 weights, "
        "autocast at every step (the reference). The trainer's weights stay fp32.",
    )
    attn_implementation: Literal["eager", "sdpa"] = _f(
        "sdpa", "Attention kernel passed to from_pretrained; FlashAttention is deliberately absent."
    )
    decode: Literal["auto", "hf", "static", "graph"] = _f(
        "auto",
        "How sampling runs the model a token at a time: hf = transformers' forward with a "
        "growing cache (the reference); static = the same arithmetic over the model's "
        "parameters with a KV cache allocated once, equal to hf bit for bit on CPU (Qwen2 "
        "models under sdpa); graph = static at fixed shapes captured as CUDA graphs (CUDA "
        "only; not bit for bit); auto = graph on CUDA and static elsewhere where they apply, "
        "else hf.",
    )
    rollout_device: str = _f(
        "auto", "Device of the rollout role: auto (cuda:0 if present, else cpu), cpu, cuda:N.",
        pattern=r"^(auto|cpu|cuda(:[0-9]+)?)$",
    )
    trainer_device: str = _f(
        "auto", "Device of the trainer role: auto (cuda:1, or cuda:0 with one GPU, else cpu).",
        pattern=r"^(auto|cpu|cuda(:[0-9]+)?)$",
    )
    rollout_devices: tuple[str, ...] = _f(
        (), "areal/async: a device per rollout worker (cpu, cuda:N), in order, in place of "
        "rollout_device; empty: every worker on rollout_device, or with auto devices on a "
        "machine with a GPU for every rollout worker and trainer rank, each on its own "
        "(docs/placement.md).",
    )
    trainer_devices: tuple[str, ...] = _f(
        (), "areal: a device per trainer rank (rank 0 first), in place of trainer_device; "
        "empty: every rank on trainer_device (or, as rollout_devices says, each on its own). "
        "Ranks on GPUs need one GPU each (NCCL).",
    )
    prompt_format: Literal["raw", "chat"] = _f(
        "raw", "raw: the task prompt as is; chat: wrapped in the tokenizer's chat template."
    )


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    max_new_tokens: int = _f(6, "Longest response, in tokens.", minimum=1)
    temperature: float = _f(
        1.0, "Sampling temperature; log-probabilities are those of this distribution.",
        exclusiveMinimum=0,
    )
    chunk_tokens: int = _f(
        2, "Tokens generated between two checks of the policy version (interrupt points).",
        minimum=1,
    )
    group_size: int = _f(
        4, "Samples drawn per prompt; group_mean baselines compare within a group.", minimum=1
    )


# Every linear layer of a Qwen2/Llama decoder's attention and MLP (the LM head stays frozen).
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    rank: int = _f(8, "r: the adapter's rank (each target gains r x in and out x r).",
                   minimum=1)
    alpha: float = _f(
        32.0, "Scale numerator: the adapter's product is multiplied by alpha / rank (32, as "
        "LoRA Without Regret and Tinker use).", exclusiveMinimum=0,
    )
    dropout: float = _f(
        0.0, "Dropout on the adapter's input in the update's forward only (sampling and "
        "log-probability recomputation never drop); its masks are drawn from the update's "
        "policy version and step, so a replay draws the same.", minimum=0, exclusiveMaximum=1,
    )
    targets: tuple[str, ...] = _f(
        LORA_TARGETS, "Linear layers that get an adapter, by the last part of their module "
        "name; each must name at least one linear layer of the model.", minItems=1,
        uniqueItems=True,
    )


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    updates: int = _f(400, "Number of policy updates (policy versions) in a run.", minimum=1)
    update_batch_size: int = _f(
        32, "B: samples per update, in whole groups (down to B - group_size + 1 when groups "
        "lost members); a multiple of rollout.group_size.", minimum=1
    )
    minibatches: int = _f(
        1, "Optimizer steps per update batch (one policy version per batch).", minimum=1
    )
    objective: str = _f(
        "pg", objectives.described, enum=objectives.names,  # the registry's, when asked
    )
    clip_eps: float = _f(0.2, "PPO clip range epsilon.", exclusiveMinimum=0, maximum=1)
    clip_eps_high: float | None = _f(
        None, "Upper clip range (DAPO clip-higher, AReaL eps_clip_higher): the ratio is clipped "
        "to [1 - clip_eps, 1 + clip_eps_high]; null: clip_eps.", exclusiveMinimum=0,
    )
    dual_clip: float | None = _f(
        None, "Dual clip c > 1 (AReaL c_clip): a token's loss is at most c * abs(A) (binds for "
        "A < 0), applied before the behaviour weight; null: off.", exclusiveMinimum=1,
    )
    behav_weight_cap: float | None = _f(
        None, "decoupled, a3po: cap on the behaviour weight pi_prox/pi_behav (AReaL "
        "behav_imp_weight_cap); null: off.", exclusiveMinimum=0,
    )
    behav_weight_mode: Literal["mask", "clamp"] = _f(
        "mask", "Over the cap: mask (weight 0, the token stays in the mean's denominator, "
        "AReaL) or clamp (the weight truncated to the cap: truncated IS)."
    )
    kl_coef: float = _f(
        0.0, "Weight of the non-negative k3 KL term (clipped objectives).", minimum=0
    )
    advantage_baseline: Literal["batch_mean", "group_mean", "none"] = _f(
        "group_mean", "Advantage = reward minus this baseline."
    )
    normalize_advantage: bool = _f(False, "Divide advantages by their batch std (+1e-6).")
    lr: float = _f(3e-4, "AdamW learning rate.", exclusiveMinimum=0)
    betas: tuple[float, float] = _f((0.9, 0.999), "AdamW betas.", minItems=2, maxItems=2)
    weight_decay: float = _f(0.0, "AdamW weight decay.", minimum=0)
    adam_eps: float = _f(1e-8, "AdamW epsilon.", exclusiveMinimum=0)
    max_grad_norm: float = _f(1.0, "Gradient-norm clip; 0 disables.", minimum=0)
    lora: LoraConfig | None = _f(
        None, "Low-rank adapters (train.lora.* below): only they train and only they are "
        "handed to the rollout each version, on a frozen base; null: every weight trains.",
    )


@dataclasses.dataclass(frozen=True)
class StalenessConfig:
    staleness_k: int = _f(
        0, "Accept a sample iff staleness = v_current - v_rollout <= K (sync is always 0).",
        minimum=0,
    )
    interrupt: Literal["resubmit", "continue", "keep_kv"] = _f(
        "resubmit",
        "On a newer policy mid-generation: resubmit the task (paper); continue the partial "
        "response under the new weights after re-prefilling it (AReaL); or keep_kv: load the "
        "new weights and keep decoding on the old KV cache (SkyRL, PipelineRL).",
    )
    max_retries: int = _f(
        2, "Resubmissions of an interrupted task before it is dropped as interrupted.", minimum=0
    )
    staleness_control: Literal["filter", "throttle", "both"] = _f(
        "filter", "filter: drop stale samples; throttle: bound dispatch (AReaL eq. 1); both."
    )
    rollout_train_ratio: float | None = _f(
        None, "If set, samples generated per applied update are held at this ratio x B, "
        "except where holding would stall both sides (a starving trainer, or nothing in "
        "flight).",
        exclusiveMinimum=0,
    )


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
    threads_per_role: int = _f(
        1, "torch CPU threads for each role (rollout, trainer); matched across modes.", minimum=1
    )
    kernels: Literal["portable", "native"] = _f(
        "portable",
        "CPU kernels: portable pins torch's own to AVX2, MKL to its strict reproducibility "
        "mode on the AVX2 branch (Intel's code, on AMD too) and oneDNN to AVX2, so that a CPU "
        "run gives the same bits on any x86-64 CPU with AVX2, Intel or AMD; native lets each "
        "library pick the fastest code for this CPU, whose numbers then differ between CPU "
        "models (docs/reproducibility.md).",
    )
    progress_every: int = _f(
        10, "Print a progress line every this many updates; 0 silences it.", minimum=0
    )
    save_policy: bool = _f(True, "Save the final policy in the run directory (for eval).")
    tensorboard: bool = _f(
        False,
        "Write every update's scalars (by policy version and wall time) and the final "
        "held-out eval as TensorBoard event files under the run directory; watch a grid with "
        "`tensorboard --logdir results/runs`.",
    )
    pin_cpus: bool = _f(
        True,
        "areal/async, roles on CPU: give each rollout worker and each trainer its own "
        "threads_per_role cores of those this process may use (controller and parameter "
        "service float); skipped when there are too few cores.",
    )
    weight_transport: Literal["auto", "host", "pinned", "device"] = _f(
        "auto",
        "areal/async: where the weight slots live. host: host memory shared between the "
        "processes (the only path on CPU); pinned: the same, page-locked for fast copies to "
        "and from the GPUs; device: on the rollout's GPU, shared with the trainer by CUDA IPC; "
        "auto: device where the rollout runs on CUDA, else host.",
    )
    rollout_workers: int = _f(1, "areal/async: rollout workers.", minimum=1)
    trainer_workers: int = _f(
        1, "areal/async: trainer workers (commits from a stale base are skipped).", minimum=1
    )
    trainer_ranks: int = _f(
        1, "areal: data-parallel ranks of the trainer, each a process holding the whole "
        "policy: they split every batch by whole groups, balanced by tokens, and sum their "
        "gradients before each optimizer step (gloo on CPU; on the virtual clock one process, "
        "priced as the ranks; docs/placement.md). With one trainer only. sync, on the virtual "
        "clock only: the devices that generate each batch side by side, then train it as as "
        "many ranks.", minimum=1,
        maximum=64,
    )
    collective_timeout_s: float = _f(
        60.0, "areal, trainer_ranks above 1: longest wait of a rank for the others, at their "
        "rendezvous and at every gradient sum; past it the run fails, naming the rank.",
        exclusiveMinimum=0,
    )
    start_timeout_s: float = _f(
        600.0, "areal/async: longest wait for every worker to load its model.", exclusiveMinimum=0
    )
    clock: Literal["wall", "virtual"] = _f(
        "wall",
        "wall: this machine's time decides when things happen; virtual: the roles run one at "
        "a time and each computation is charged its price on runtime.hardware, so that the "
        "run is a function of its config (docs/virtual_clock.md).",
    )
    hardware: str = _f(
        "cpu-2core",
        "clock virtual: the hardware profile that prices the roles' work: a name under "
        "config/hardware/ or a YAML file's path.",
        minLength=1,
    )


@dataclasses.dataclass(frozen=True)
class BaseModelConfig:
    hidden_size: int = _f(64, "tiny model: width of the Qwen2 decoder.", minimum=8)
    num_layers: int = _f(2, "tiny model: decoder layers.", minimum=1)
    num_heads: int = _f(4, "tiny model: attention heads (2 key/value heads, grouped).", minimum=2)
    intermediate_size: int = _f(256, "tiny model: MLP width.", minimum=8)
    warm_start_steps: int = _f(
        1500, "Supervised steps on the train split, so RL starts weak but not at zero.", minimum=0
    )
    warm_start_batch: int = _f(64, "Supervised batch size (sequences).", minimum=1)
    warm_start_lr: float = _f(3e-3, "Supervised AdamW learning rate.", exclusiveMinimum=0)
    warm_start_label_noise: float = _f(
        0.5,
        "Fraction of warm-start answers replaced by a wrong number: the model learns the skill "
        "but samples it unreliably, the regime where RL sharpens a policy.",
        minimum=0, maximum=0.95,
    )
    seed: int = _f(0, "Seed of the initial weights and of the warm-start order.", minimum=0)
    threads: int = _f(
        2, "torch CPU threads of the warm start: fixed rather than the host's core count, "
        "since a parallel reduction's order follows the thread count.", minimum=1,
    )


@dataclasses.dataclass(frozen=True)
class RunConfig:
    mode: Mode = _f(
        "sync", "Runner: sync (sync_train), async (threaded), areal (multi-process)."
    )
    seed: int = _f(0, "Seed of sampling, task order and training.", minimum=0)
    preset_name: str | None = _f(
        None,
        "The name of the staleness preset these settings came from (the pipeline's "
        "`presets:` key): it names the run in summary.json's `run` and changes nothing else.",
        pattern="^[a-z][a-z0-9_]*$",
    )
    model: ModelConfig = _section(ModelConfig, "The policy model and where it runs.")
    task: TaskConfig = _section(TaskConfig, "The task suite.")
    rollout: RolloutConfig = _section(RolloutConfig, "Generation settings.")
    train: TrainConfig = _section(TrainConfig, "Updates, optimizer and objective.")
    staleness: StalenessConfig = _section(StalenessConfig, "Bounded staleness and interruption.")
    reward: RewardConfig = _section(RewardConfig, "Reward harness.")
    eval: EvalConfig = _section(EvalConfig, "Held-out evaluation and thresholds.")
    runtime: RuntimeConfig = _section(RuntimeConfig, "Threads, progress and outputs.")
    base: BaseModelConfig = _section(
        BaseModelConfig, "The embedded tiny model that `rlcore build-base` makes."
    )

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data (tuples as lists) that config_from_dict accepts back."""
        return json.loads(json.dumps(dataclasses.asdict(self)))


def run_config_schema() -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of a run config: what `rlcore config-schema` prints."""
    schema = schema_for(RunConfig)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "rlcore run config"
    return schema


def config_reference_markdown() -> str:
    """config/README.md's generated part: every key with its default, allowed values and help."""
    return reference_markdown(run_config_schema(), RunConfig().to_dict(),
                              {"train.lora": dataclasses.asdict(LoraConfig())})
