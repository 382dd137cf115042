"""Reading run configs: YAML or JSON files, and `section.key=value` overrides.

Numbers are read as YAML 1.2 reads them, so `lr: 1e-4` is a number and not a string.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import typing
from pathlib import Path
from typing import Any

import yaml

from rlcore.config.run import RunConfig
from rlcore.errors import ConfigError


class _Yaml12Loader(yaml.SafeLoader):
    """SafeLoader that reads 1e-4 as a number (YAML 1.2), not as the string '1e-4'."""


_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$"),
    list("-+0123456789."),
)


def parse_yaml(text: str) -> Any:
    """YAML with numbers read as YAML 1.2 does; errors become ConfigError."""
    try:
        return yaml.load(text, Loader=_Yaml12Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        raise ConfigError(f"not valid YAML: {e}") from e


def apply_overrides(data: dict[str, Any], overrides: typing.Iterable[str]) -> dict[str, Any]:
    """Apply `dotted.key=value` overrides (value parsed as YAML) to a nested mapping."""
    out = json.loads(json.dumps(data))
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' must look like section.key=value")
        dotted, raw = item.split("=", 1)
        node = out
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override '{item}': '{p}' is not a section")
        try:
            node[leaf] = parse_yaml(raw)
        except ConfigError as e:
            raise ConfigError(f"override '{item}': the value is {e}") from e
    return out


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`extra` over a deep copy of `base`, section by section (as Snakemake lays config files
    over each other)."""
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def overlay_base(path: Path, data: dict[str, Any]) -> Path | None:
    """The file a pipeline overlay is laid over (its `overlays`, relative to its own
    directory), or None for a file that names none."""
    base = data.get("overlays")
    if base is None:
        return None
    resolved = (path.parent / str(base)).resolve()
    if not resolved.is_file():
        raise ConfigError(f"config file '{path}': overlays: {base} is no file beside it")
    return resolved


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The run config a file holds, in any shape `read_run_config` takes."""
    return read_run_config(path)[0]


def read_run_config(path: str | Path) -> tuple[dict[str, Any], str | None]:
    """The run config a YAML or JSON file holds, in each shape a user has: a run config; a
    pipeline config (its `run:` section), or an overlay of one (its `run:` laid over its
    base's); a run directory, or its `config.json` (the config the run recorded). Also one
    line saying which part was taken (None for a run config)."""
    return _read_run_config(Path(path), ())


def _read_run_config(p: Path, seen: tuple[Path, ...]) -> tuple[dict[str, Any], str | None]:
    """read_run_config, below the overlays `seen` on the way to this file."""
    if p.is_dir() and (p / "config.json").is_file():
        p = p / "config.json"
    if not p.is_file():
        raise ConfigError(f"config file '{p}' does not exist")
    text = p.read_text()
    try:
        data = json.loads(text) if p.suffix == ".json" else parse_yaml(text)
    except (json.JSONDecodeError, ConfigError) as e:
        raise ConfigError(f"config file '{p}' is not valid {p.suffix.lstrip('.')}: {e}") from e
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file '{p}' must hold a mapping at the top level")
    if isinstance(data.get("config"), dict) and "environment" in data:
        return data["config"], f"{p} is a run's record: running the config it recorded"
    base = overlay_base(p, data)
    if base is not None:
        if base in seen:
            raise ConfigError(f"config file '{p}': overlays: a cycle through '{base}'")
        below, _ = _read_run_config(base, (*seen, p.resolve()))
        if not isinstance(data.get("run") or {}, dict):
            raise ConfigError(f"config file '{p}': the 'run' section must be a mapping")
        return (merge(below, data.get("run") or {}),
                f"{p}: running its 'run:' section laid over that of {data['overlays']}")
    if "run" not in data:
        return data, None
    if not isinstance(data["run"] or {}, dict):
        raise ConfigError(f"config file '{p}': the 'run' section must be a mapping")
    # `run:` is not a run-config key, so the file has a pipeline config's shape: a run key
    # beside it would be silently lost, anything else is the pipeline's own
    run_keys = {f.name for f in dataclasses.fields(RunConfig)}
    if stray := sorted(run_keys & set(data)):
        raise ConfigError(f"config file '{p}' has a 'run:' section and run keys beside it "
                          f"({', '.join(stray)}): move them into 'run:'")
    others = sorted(set(data) - {"run"})
    ignored = f" ({', '.join(others)}: the pipeline's, ignored here)" if others else ""
    return data["run"] or {}, f"{p}: running its 'run:' section{ignored}"
