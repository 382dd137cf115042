"""Named extension points (objectives, task suites): one registration each, built-in entries
first, with plugins added by the modules an entry-point group names (docs/extending.md).

An entry names its implementation as "module:attribute", imported at first use, so that
reading a registry imports no torch: the config reads the registries, and torch must not be
imported before the kernels are pinned.
"""

from __future__ import annotations

import importlib
from functools import cache
from importlib.metadata import entry_points
from typing import Any, Generic, Protocol, TypeVar

from rlcore.errors import ConfigError


class Named(Protocol):
    """What a registry holds: a name and a one-line description."""

    @property
    def name(self) -> str: ...

    @property
    def help(self) -> str: ...


E = TypeVar("E", bound=Named)


@cache
def resolve(ref: str) -> Any:
    """The attribute `ref` ("module:attribute") names, imported at first use."""
    module, _, name = ref.partition(":")
    value = getattr(importlib.import_module(module), name, None)
    if value is None or not callable(value):
        raise ConfigError(f"{ref!r}: {module} has no function or class {name!r}")
    return value


class Registry(Generic[E]):
    """Entries by name, for the config setting `setting`; plugins from entry-point `group`."""

    def __init__(self, kind: str, setting: str, group: str):
        self.kind, self.setting, self.group = kind, setting, group
        self._entries: dict[str, E] = {}
        self._built_in: frozenset[str] = frozenset()
        self._plugins_loaded = False
        self._origin: dict[str, str] = {}  # a plugin entry's name -> its entry point's module

    def register(self, entry: E) -> E:
        """Add an entry under its name (a name another entry holds is refused)."""
        name = entry.name
        if not (name[:1].isalpha() and name.islower() and name.replace("_", "").isalnum()):
            raise ValueError(f"{self.kind} name {name!r}: lower-case letters, digits and _, "
                             "starting with a letter (it names run directories)")
        held = self._entries.get(name)
        if held is not None and held != entry:
            raise ValueError(f"{self.kind} {name!r} is registered already")
        self._entries[name] = entry
        return entry

    def seal(self) -> None:
        """Mark the entries registered so far as built in (they cannot be unregistered)."""
        self._built_in = frozenset(self._entries)

    def unregister(self, name: str) -> None:
        """Remove a registration (a test's or an interactive session's own)."""
        if name in self._built_in:
            raise ValueError(f"{self.kind} {name!r} is built in")
        self._entries.pop(name, None)

    def _load_plugins(self) -> None:
        """Import the modules the entry points of `group` name, once per process."""
        if not self._plugins_loaded:
            self._plugins_loaded = True
            for ep in entry_points(group=self.group):
                before = set(self._entries)
                ep.load()
                self._origin.update(dict.fromkeys(set(self._entries) - before, ep.module))

    def names(self) -> tuple[str, ...]:
        """Every registered name, the built-in ones first."""
        self._load_plugins()
        return tuple(self._entries)

    def get(self, name: str) -> E:
        """The entry registered as `name`; a ConfigError lists those there are."""
        self._load_plugins()
        try:
            return self._entries[name]
        except KeyError:
            raise ConfigError(f"{self.setting} {name!r} is not a registered {self.kind}; "
                              f"registered: {', '.join(self._entries)} "
                              "(docs/extending.md)") from None

    def origin(self, name: str) -> str | None:
        """The module whose entry point registered `name` (a plugin's); None for a built-in
        entry or one registered by hand."""
        self._load_plugins()
        return self._origin.get(name)

    def described(self) -> str:
        """`name: help` of every entry, for the config reference."""
        return "; ".join(f"{n}: {self.get(n).help}" for n in self.names())
