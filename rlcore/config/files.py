"""Reading run configs: YAML or JSON files, and `section.key=value` overrides.

Numbers are read as YAML 1.2 reads them, so `lr: 1e-4` is a number and not a string.
"""

from __future__ import annotations

import json
import re
import typing
from pathlib import Path
from typing import Any

import yaml

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


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML or JSON run config, or a pipeline config's `run:` section, into a mapping."""
    p = Path(path)
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
    if "grid" in data and "run" in data:  # a pipeline config: its run section is the run config
        data = data["run"] or {}
        if not isinstance(data, dict):
            raise ConfigError(f"config file '{p}': the 'run' section must be a mapping")
    return data
