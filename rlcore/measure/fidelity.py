"""The emulator's validation split (`config/fidelity.yaml`): the configs a profile is fitted
to and the held-out configs it is judged on, each a base config with `--set` overrides.

The split is what keeps the validation honest, so it is checked when read: the two sets
share no name and no config, and every config loads.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal

from rlcore.config import RunConfig, load_config
from rlcore.config.files import parse_yaml
from rlcore.errors import ConfigError

Part = Literal["fit", "heldout"]


@dataclasses.dataclass(frozen=True)
class FidelitySplit:
    """Named override lists on one base config, for fitting and for judging a profile."""

    base: Path
    updates: int
    repeats: int
    fit: dict[str, tuple[str, ...]]
    heldout: dict[str, tuple[str, ...]]

    def configs(self, part: Part) -> list[tuple[str, RunConfig]]:
        """The named configs of one part, in the file's order."""
        out = []
        for name, sets in getattr(self, part).items():
            try:
                out.append((name, load_config(self.base, sets)))
            except ConfigError as e:
                raise ConfigError(f"{part}.{name} ({self.base} with {', '.join(sets)}): {e}"
                                  ) from e
        return out


def _overrides(path: Path, part: str, raw: Any) -> dict[str, tuple[str, ...]]:
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"{path}: `{part}` must map names to lists of KEY=VALUE overrides")
    out = {}
    for name, sets in raw.items():
        if not isinstance(sets, list) or not all(isinstance(s, str) and "=" in s for s in sets):
            raise ConfigError(f"{path}: {part}.{name} must be a list of KEY=VALUE overrides "
                              "(as `rlcore run --set` takes them)")
        out[str(name)] = tuple(sets)
    return out


def load_split(path: str | Path) -> FidelitySplit:
    """The split in `path`, refused with the fix when its parts overlap or a config does not
    load; a relative `base` is read from the working directory, as `rlcore` reads configs."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such file (the shipped split is config/fidelity.yaml)")
    data = parse_yaml(path.read_text())
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping with base, updates, repeats, fit and "
                          "heldout")
    missing = {"base", "updates", "repeats", "fit", "heldout"} - set(data)
    if missing:
        raise ConfigError(f"{path}: missing {', '.join(sorted(missing))}")
    split = FidelitySplit(base=Path(data["base"]), updates=int(data["updates"]),
                          repeats=int(data["repeats"]),
                          fit=_overrides(path, "fit", data["fit"]),
                          heldout=_overrides(path, "heldout", data["heldout"]))
    both = set(split.fit) & set(split.heldout)
    if both:
        raise ConfigError(f"{path}: {', '.join(sorted(both))} is in both fit and heldout: a "
                          "held-out config must not be fitted to")
    fitted = dict(split.configs("fit"))
    for name, cfg in split.configs("heldout"):
        same = [f for f, c in fitted.items() if c == cfg]
        if same:
            raise ConfigError(f"{path}: heldout.{name} is the same config as fit.{same[0]}: "
                              "change one of them")
    return split
