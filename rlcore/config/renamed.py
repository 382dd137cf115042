"""Config keys a release renamed, still read for one release with a message saying what to write.

A rename is a place in a config (keys from the top, `*` for every item of a list), the old
name and the new. `upgrade` moves each old key it finds to its new name, in place, and
returns one message per move; the caller prints them, so reading a config writes nothing.
Release 0.2 drops the old names.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class Rename(NamedTuple):
    where: tuple[str, ...]  # the keys above the renamed one; "*": each item of a list
    old: str
    new: str
    why: str


# "Policy" named both the model and a set of staleness settings; the settings are presets now.
PRESET = "a set of staleness settings is a preset now; 'policy' is the model"

RUN_RENAMES = (Rename((), "policy_name", "preset_name", PRESET),)

PIPELINE_RENAMES = (
    Rename((), "policies", "presets", PRESET),
    Rename(("grid", "blocks", "*"), "policies", "presets", PRESET),
    Rename(("grid", "replays", "of"), "policies", "presets", PRESET),
    Rename(("figures", "trace"), "policy", "preset", PRESET),
    Rename(("figures", "k_axis"), "policy", "preset", PRESET),
    Rename(("run",), "policy_name", "preset_name", PRESET),
)


def upgrade(config: dict[str, Any], renames: tuple[Rename, ...], name: str = "config"
            ) -> list[str]:
    """Move every old key of `renames` in `config` to its new name (in place); a message per
    move, naming the key as `name` + its path.

    Where both names are set, the old one's value wins (a mapping is laid over the new one's):
    Snakemake lays a user's `--configfile` over the shipped config/config.yaml, which has
    only the new names, so an old name there is the user's own setting."""
    messages = []
    for rename in renames:
        for path, mapping in _places(config, rename.where, name):
            if rename.old not in mapping:
                continue
            value = mapping.pop(rename.old)
            under = mapping.get(rename.new)
            mapping[rename.new] = {**under, **value} if isinstance(under, dict) and \
                isinstance(value, dict) else value
            laid = "" if under is None else f", laid over the {rename.new} also set there"
            messages.append(f"{path}.{rename.old} is now {path}.{rename.new} ({rename.why}); "
                            f"read as {rename.new}{laid}. The old name is read in this "
                            "release only: rename it")
    return messages


def _places(node: Any, where: tuple[str, ...], path: str) -> list[tuple[str, dict[str, Any]]]:
    """The mappings at `where` below `node`, each with its printed path."""
    if not where:
        return [(path, node)] if isinstance(node, dict) else []
    head, rest = where[0], where[1:]
    if head == "*":
        items = node if isinstance(node, list) else []
        return [p for i, item in enumerate(items) for p in _places(item, rest, f"{path}[{i}]")]
    if isinstance(node, dict) and head in node:
        return _places(node[head], rest, f"{path}.{head}")
    return []
