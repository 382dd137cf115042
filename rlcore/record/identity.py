"""A run's name: which grid point it is, decided in one place.

A run is named by its clock (`wall`, or the hardware profile that prices it), mode, staleness
preset, K, objective and seed; a replay also by the objective it is replayed under. This
module formats the name as a directory below `runs/` or `replays/`, as the stem of its config
and log files, and as an arm of the claims config (the name without its seed); it parses
arms; and `RunId.of` derives the name from a run's config, so that summary.json carries it
(`run`) and nothing reads a path back.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from rlcore.config import RunConfig
from rlcore.errors import ConfigError

WALL_CLOCK = "wall"  # the clock level of a run timed by this machine's clock

# Snakemake's wildcards are these fields' names, so the patterns are its rules' too. The
# clock comes first, so that a wall and a virtual run of the same point never share a path.
RUN_PATTERN = "{clock}/{mode}/{preset}/k{k}/{objective}/seed{seed}"
REPLAY_PATTERN = RUN_PATTERN + "/{replayed}"
FILE_PATTERN = "{clock}/{mode}-{preset}-k{k}-{objective}-seed{seed}"
RUN_GLOB = RUN_PATTERN.format(clock="*", mode="*", preset="*", k="*", objective="*", seed="*")


@dataclass(frozen=True)
class RunId:
    """One run (or replay) of a study."""

    clock: str  # WALL_CLOCK, or the name of the hardware profile of a virtual-clock run
    mode: str
    preset: str  # the staleness preset: its key in the pipeline's `presets:`
    k: int
    objective: str
    seed: int
    replayed: str | None = None  # a replay: the objective it is replayed under

    @classmethod
    def of(cls, cfg: RunConfig, clock: dict[str, Any]) -> RunId:
        """The name of a run of `cfg` timed by `clock` (summary.json's `clock`); a config
        without `preset_name` names its preset `custom`."""
        return cls(clock=clock_level(clock), mode=cfg.mode, preset=cfg.preset_name or "custom",
                   k=cfg.staleness.staleness_k, objective=cfg.train.objective, seed=cfg.seed)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunId:
        """The inverse of `to_dict` (summary.json's `run`, where runs written before the
        rename of staleness policies to presets say `policy`)."""
        data = dict(data)
        if "policy" in data:
            data["preset"] = data.pop("policy")
        return cls(**data)

    def replayed_under(self, objective: str) -> RunId:
        """The name of this run's replay under `objective`."""
        return replace(self, replayed=objective)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def is_replay(self) -> bool:
        return self.replayed is not None

    def path(self) -> str:
        """Its directory below `runs/` (a replay's, below `replays/`)."""
        return (REPLAY_PATTERN if self.is_replay else RUN_PATTERN).format(**asdict(self))

    def file_stem(self) -> str:
        """The stem of its config and log files below `configs/` and `logs/`."""
        stem = FILE_PATTERN.format(**asdict(self))
        return f"{stem}-{self.replayed}" if self.is_replay else stem

    def arm(self) -> str:
        """The arm it belongs to in the claims config: its name without the seed."""
        return format_arm(self.clock, self.mode, self.preset, self.k, self.objective,
                          self.replayed)


def clock_level(clock: dict[str, Any]) -> str:
    """A run's clock level from its summary's `clock`: WALL_CLOCK, or the profile's name."""
    return WALL_CLOCK if clock["kind"] == "wall" else str(clock["hardware"])


def format_arm(clock: str, mode: str, preset: str, k: int, objective: str,
               replayed: str | None = None) -> str:
    """CLOCK/MODE/PRESET/kK/OBJECTIVE[/REPLAYED]."""
    arm = f"{clock}/{mode}/{preset}/k{k}/{objective}"
    return f"{arm}/{replayed}" if replayed is not None else arm


def parse_arm(text: str) -> dict[str, Any]:
    """An arm of the claims config, CLOCK/MODE/PRESET/kK/OBJECTIVE[/REPLAYED], as the
    fields of `RunId` less the seed."""
    parts = text.split("/")
    k = parts[3].removeprefix("k") if len(parts) > 3 else ""
    if len(parts) not in (5, 6) or not all(parts) or not parts[3].startswith("k") \
            or not k.isdigit():
        raise ConfigError(f"claims arm '{text}': write it as CLOCK/MODE/PRESET/kK/OBJECTIVE "
                          "(a run) or CLOCK/MODE/PRESET/kK/OBJECTIVE/REPLAYED (a replay), "
                          "e.g. wall/areal/paper/k1/pg")
    clock, mode, preset, _, objective, *replayed = parts
    return {"clock": clock, "mode": mode, "preset": preset, "k": int(k),
            "objective": objective, "replayed": replayed[0] if replayed else None}
