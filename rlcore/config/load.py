"""Building a `RunConfig` from a mapping or a file: validate against the schema, apply the
rules that cross fields, and refuse a bad config with a message naming the key."""

from __future__ import annotations

import dataclasses
import re
import string
import sys
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlcore.algo import registry as objectives
from rlcore.config.files import apply_overrides, read_config_file
from rlcore.config.renamed import RUN_RENAMES, upgrade
from rlcore.config.run import RunConfig, run_config_schema
from rlcore.config.schema import validation_errors
from rlcore.errors import ConfigError
from rlcore.tasks.registry import SUITES


def _validate_ranks(cfg: RunConfig, smallest: int) -> None:
    """A data-parallel trainer: one trainer of processes on CPU (or sync on as many devices,
    on the virtual clock), and a group for every rank in each minibatch of the smallest batch
    the run may train."""
    rt, t = cfg.runtime, cfg.train
    if rt.trainer_ranks == 1:
        return
    where = f"runtime.trainer_ranks ({rt.trainer_ranks})"
    if cfg.mode == "sync" and rt.clock == "wall":
        raise ConfigError(f"{where}: sync on several devices runs on the virtual clock only "
                          "so far: set runtime.clock to virtual, or trainer_ranks to 1")
    if cfg.mode == "async":
        raise ConfigError(f"{where} needs mode 'areal' (one process per rank) or sync on the "
                          "virtual clock; the threaded baseline trains in one thread: set "
                          "trainer_ranks to 1")
    if rt.trainer_workers > 1:
        raise ConfigError(f"{where} and runtime.trainer_workers ({rt.trainer_workers}) do not "
                          "combine: racing trainers each propose their own updates, a "
                          "trainer's ranks one; set one of them to 1")
    part = smallest // t.minibatches
    groups = -(-part // cfg.rollout.group_size)
    if groups < rt.trainer_ranks:
        raise ConfigError(
            f"{where}: the smallest minibatch this run may train ({part} samples = (update_"
            f"batch_size - group_size + 1) // minibatches) may hold only {groups} groups of "
            f"up to {cfg.rollout.group_size}, and every rank needs one: raise "
            "train.update_batch_size or lower train.minibatches or trainer_ranks")


DEVICE = re.compile(r"^(cpu|cuda(:[0-9]+)?)$")


def _validate_devices(cfg: RunConfig) -> None:
    """A device list names one device per rollout worker or trainer rank, each cpu or cuda:N."""
    m, rt = cfg.model, cfg.runtime
    for key, devices, count, what in (
            ("rollout_devices", m.rollout_devices, rt.rollout_workers, "runtime.rollout_workers"),
            ("trainer_devices", m.trainer_devices, rt.trainer_ranks, "runtime.trainer_ranks")):
        bad = [d for d in devices if not DEVICE.match(d)]
        if bad:
            raise ConfigError(f"model.{key} names {bad}: each entry is cpu or cuda:N")
        if devices and len(devices) != count:
            raise ConfigError(f"model.{key} names {len(devices)} devices for {what} = {count}: "
                              "name one for each, or none")
    if m.trainer_devices and rt.trainer_workers > 1:
        raise ConfigError("model.trainer_devices places a trainer's ranks; racing trainers "
                          f"(runtime.trainer_workers = {rt.trainer_workers}) share "
                          "model.trainer_device: leave the list empty")


def _validate_semantics(cfg: RunConfig) -> None:
    """Rules that cross fields and so cannot live in the schema."""
    t = cfg.train
    if t.update_batch_size % cfg.rollout.group_size:
        raise ConfigError(
            f"train.update_batch_size ({t.update_batch_size}) must be a multiple of "
            f"rollout.group_size ({cfg.rollout.group_size})"
        )
    if t.update_batch_size % t.minibatches:
        raise ConfigError(
            f"train.update_batch_size ({t.update_batch_size}) must be divisible by "
            f"train.minibatches ({t.minibatches})"
        )
    smallest = t.update_batch_size - cfg.rollout.group_size + 1  # of whole groups
    if cfg.mode != "sync" and t.minibatches > smallest:
        raise ConfigError(
            f"train.minibatches ({t.minibatches}) is more than the smallest batch of whole "
            f"groups ({smallest} = update_batch_size - group_size + 1) mode '{cfg.mode}' "
            "may train: a minibatch would be empty"
        )
    _validate_ranks(cfg, smallest)
    reads_files = SUITES.get(cfg.task.suite).reads_files
    if reads_files and not (cfg.task.train_path and cfg.task.heldout_path):
        raise ConfigError(f"task.suite '{cfg.task.suite}' reads task files: set "
                          "task.train_path and task.heldout_path")
    _validate_task_prompts(cfg, reads_files)
    # A generated suite writes answer tasks; code tasks come only from files.
    if cfg.reward.verifier == "code" and not reads_files:
        raise ConfigError(f"reward.verifier 'code' runs code tasks' tests, and task.suite "
                          f"'{cfg.task.suite}' has none: set reward.verifier to last_integer, "
                          "stated, exact or math, or task.suite to jsonl with code task files")
    if cfg.task.min_terms > cfg.task.max_terms:
        raise ConfigError(f"task.min_terms ({cfg.task.min_terms}) is more than task.max_terms "
                          f"({cfg.task.max_terms})")
    chosen = objectives.objective(t.objective)
    for knob in objectives.CORRECTIONS:
        if getattr(t, knob) is not None and knob not in chosen.corrections:
            takers = [n for n in objectives.names() if knob in objectives.objective(n).corrections]
            raise ConfigError(f"train.{knob} corrects a clipped ratio or a behaviour weight, "
                              f"which train.objective '{t.objective}' does not have: choose "
                              f"{_either(takers)}, or unset it")
    if t.behav_weight_mode != "mask" and t.behav_weight_cap is None:
        raise ConfigError(f"train.behav_weight_mode '{t.behav_weight_mode}' needs "
                          "train.behav_weight_cap: set the cap, or leave the mode at 'mask'")
    if cfg.mode == "sync" and cfg.staleness.staleness_k != 0:
        raise ConfigError(
            f"mode 'sync' is on-policy: staleness.staleness_k must be 0, got "
            f"{cfg.staleness.staleness_k}"
        )


def _validate_task_prompts(cfg: RunConfig, reads_files: bool) -> None:
    """task.fields, task.prompt_template and task.system_prompt: refused where they would be
    silently ignored, and a template checked here rather than at its first prompt."""
    t = cfg.task
    # The generated suites write their own prompts (arith_form, the chain format); a setting
    # that changed nothing there would mislead the reader of the config.
    if not reads_files:
        for key, default in (("fields", "rlcore"), ("prompt_template", "{prompt}"),
                             ("system_prompt", None)):
            if getattr(t, key) != default:
                raise ConfigError(f"task.{key} applies to task files (task.suite 'jsonl'), "
                                  f"not to the generated suite '{t.suite}': unset it")
    try:
        parts = list(string.Formatter().parse(t.prompt_template))
    except ValueError as e:
        raise ConfigError(f"task.prompt_template {t.prompt_template!r}: {e}; write literal "
                          "braces as {{ and }}") from e
    names = [name for _, name, _, _ in parts if name is not None]
    if "prompt" not in names or any(n != "prompt" for n in names):
        raise ConfigError(f"task.prompt_template {t.prompt_template!r} must contain {{prompt}} "
                          "and no other field; write literal braces as {{ and }} (e.g. "
                          "'\\\\boxed{{}}')")
    # A raw prompt has no roles: the system text would have to be glued onto the prompt,
    # which task.prompt_template already does openly. Refusing beats dropping it silently.
    if t.system_prompt is not None and cfg.model.prompt_format != "chat":
        raise ConfigError("task.system_prompt needs model.prompt_format 'chat' (a raw prompt "
                          "has no system role): set it, or put the text in "
                          "task.prompt_template")


def _coerce(tp: Any, value: Any) -> Any:
    """Schema-valid data into the field's Python type (the schema has already checked it)."""
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _build(tp, value)
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and value is not None:
        members = [a for a in typing.get_args(tp) if a is not type(None)]
        return _coerce(members[0], value) if len(members) == 1 else value
    if typing.get_origin(tp) is tuple:
        return tuple(value)
    if tp is int and isinstance(value, float):
        return int(value)  # JSON Schema counts 4.0 as an integer; Python's range() does not
    return value


def _build(cls: type, data: Mapping[str, Any]) -> Any:
    hints = typing.get_type_hints(cls)
    kwargs = {f.name: _coerce(hints[f.name], data[f.name])
              for f in dataclasses.fields(cls) if f.name in data}
    return cls(**kwargs)


def config_from_dict(data: Mapping[str, Any]) -> RunConfig:
    """Validate a (possibly partial) mapping and return the full config with defaults filled;
    a key renamed this release is read under its new name, with a message on stderr."""
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"a config must be a mapping of keys to values, got {type(data).__name__}"
        )
    data = dict(data)
    for message in upgrade(data, RUN_RENAMES):
        print(f"rlcore: {message}", file=sys.stderr)
    errors = validation_errors(run_config_schema(), data)
    if errors:
        raise ConfigError("; ".join(errors))
    cfg = _build(RunConfig, data)
    _validate_semantics(cfg)
    _validate_devices(cfg)
    return cfg


def load_config(path: str | Path, overrides: typing.Iterable[str] = ()) -> RunConfig:
    """Load, override and validate a config file: the one entry point used by the CLI."""
    return config_from_dict(apply_overrides(read_config_file(path), overrides))


def _either(names: list[str]) -> str:
    """'a', 'a or b', 'a, b or c'."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
