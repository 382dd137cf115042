"""The pipeline's grid: which runs and replays a pipeline config asks for, and each run's
settings.

The pipeline config (`config/config.yaml`, schema `workflow/schemas/config.schema.yaml`)
declares blocks of (clock, modes, presets, ks, objectives, seeds); every combination is a
grid point, named as `rlcore/record/identity.py::RunId` names a run (the seed included).
The Snakefile's rules expand these points into paths; the checks (`checks.py`) and the
tests call the same functions without Snakemake.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from rlcore.algo.registry import OBJECTIVES
from rlcore.code_digest import plugin_digest
from rlcore.config import ModelConfig, RuntimeConfig, config_from_dict
from rlcore.config.files import merge, overlay_base
from rlcore.errors import ConfigError
from rlcore.record.identity import WALL_CLOCK, RunId
from rlcore.runners.asynchronous.layout import each_on_its_own
from rlcore.tasks.registry import SUITES

Point = dict[str, Any]  # clock, mode, preset, k, objective, seed (and replayed, for a replay)


def clock_name(clock: str) -> str:
    """The clock level of a block's `clock` setting: `wall`, or NAME of `virtual:NAME`."""
    return clock.removeprefix("virtual:")


def grid_points(config: dict[str, Any]) -> list[Point]:
    """Every (clock, mode, preset, k, objective, seed) of the grid once, in the blocks'
    order."""
    g = config["grid"]
    points: dict[tuple[Any, ...], Point] = {}
    for block in g["blocks"]:
        for mode in block["modes"]:
            for preset in block["presets"]:
                for k in block["ks"]:
                    for objective in block["objectives"]:
                        for seed in block.get("seeds", g["seeds"]):
                            point = {"clock": clock_name(block["clock"]),
                                     "mode": mode, "preset": preset, "k": k,
                                     "objective": objective, "seed": seed}
                            points[tuple(point.values())] = point
    return list(points.values())


def wall_points(config: dict[str, Any]) -> list[Point]:
    """The grid points timed by the wall clock."""
    return [p for p in grid_points(config) if p["clock"] == WALL_CLOCK]


def block_priorities(config: dict[str, Any]) -> dict[str, int]:
    """The order of the wall-clock runs, as Snakemake priorities (the highest runs first):
    block by block, a block being one seed's runs in the grid's order (sync seed 0, AReaL-style
    seed 0, threaded seed 0, ..., then seed 1), so that the arms a live claim compares run
    back to back and the machine's drift between hours falls between blocks, not between
    arms. Keyed by the run's path (`RunId.path`); every other job keeps priority 0."""
    walls = sorted(wall_points(config), key=lambda p: p["seed"])  # stable: grid order within
    return {RunId(**p).path(): len(walls) - rank for rank, p in enumerate(walls)}


def replay_points(config: dict[str, Any]) -> list[Point]:
    """Every replay: a grid point selected by grid.replays.of (on its clock), with the
    objective it is replayed under (`replayed`)."""
    replays = config["grid"].get("replays")
    if not replays:
        return []
    of = replays["of"]
    return [
        {**p, "replayed": objective}
        for p in grid_points(config)
        if p["clock"] == clock_name(of["clock"]) and p["mode"] in of["modes"]
        and p["preset"] in of["presets"] and p["k"] in of["ks"]
        and p["objective"] in of["objectives"]
        for objective in replays["objectives"]
    ]


def run_settings(config: dict[str, Any], point: Point) -> dict[str, Any]:
    """The full, validated run config of one grid point: `run:`, then its staleness
    preset, then the point itself. The point's clock is its block's, whatever `run` or
    the preset say."""
    if point["clock"] == WALL_CLOCK:
        runtime = {"clock": "wall"}
    else:
        runtime = {"clock": "virtual", "hardware": point["clock"]}
    settings = merge(config["run"], config["presets"][point["preset"]])
    settings = merge(settings, {
        "mode": point["mode"], "seed": int(point["seed"]), "preset_name": point["preset"],
        "staleness": {"staleness_k": int(point["k"])},
        "train": {"objective": point["objective"]}, "runtime": runtime})
    return config_from_dict(settings).to_dict()


def plugin_code(objectives: Sequence[str], suite: str | None) -> str:
    """The digest of the installed plugins that registered these objectives and suite (what
    a job of them imports); '' for built-ins. A job's code parameter adds it, so that
    editing a plugin reruns what uses it."""
    origins = [OBJECTIVES.origin(o) for o in objectives]
    origins.append(SUITES.origin(suite) if suite is not None else None)
    return plugin_digest(o for o in origins if o is not None)


# Where `auto` puts each role when GPUs are present (rlcore/policy/device.py::resolve_device):
# rollout cuda:0, trainer cuda:1, the paper's pair.
AUTO_GPU = {"rollout_device": "cuda:0", "trainer_device": "cuda:1"}


def gpus_named(model: dict[str, Any], runtime: dict[str, Any] | None = None) -> int:
    """How many GPUs a run's `model` section (and `runtime`'s workers and ranks) puts its
    roles on: distinct CUDA devices among the rollout workers' and the trainer ranks'
    (`auto` as on a machine with a GPU for each of R rollout workers and M ranks where R + M
    is above 2, else with two; `cpu` none), as rlcore/runners/asynchronous/layout.py lays
    them out."""
    m, rt = ModelConfig(**model), RuntimeConfig(**(runtime or {}))  # validated already
    if each_on_its_own(m, rt):
        return rt.rollout_workers + rt.trainer_ranks
    lists = {"rollout_device": model.get("rollout_devices") or [],
             "trainer_device": model.get("trainer_devices") or []}
    devices = set()
    for key, auto in AUTO_GPU.items():
        named = lists[key] or [model.get(key, "auto")]
        for device in (auto if d == "auto" else d for d in named):
            if device.startswith("cuda"):
                devices.add(device if ":" in device else "cuda:0")
    return len(devices)


def _whole(data: dict[str, Any], schema: str | Path) -> bool:
    """`data` sets every top-level key the pipeline schema requires."""
    return all(key in data for key in yaml.safe_load(Path(schema).read_text())["required"])


def stands_alone(configfiles: Sequence[str | Path], schema: str | Path) -> bool:
    """The first of the command line's config files is a whole pipeline config: it sets every
    key the pipeline schema requires (config/paper.yaml does; an overlay such as
    config/resolve.yaml does not), so the workflow's default config is no base for it."""
    return bool(configfiles) and _whole(
        yaml.safe_load(Path(configfiles[0]).read_text()) or {}, schema)


def _laid(configfiles: Sequence[str | Path], root: Path, replaced: bool
          ) -> tuple[list[tuple[Path, dict[str, Any]]], list[str]]:
    """`config_files`, each file with what it holds (read once)."""
    default = (root / "config" / "config.yaml").resolve()
    laid: list[tuple[Path, dict[str, Any]]] = []
    added: list[str] = []

    def lay(path: Path, chain: tuple[Path, ...]) -> None:
        if path in chain:
            raise ConfigError(f"overlays: a cycle: {' over '.join(map(str, chain + (path,)))}")
        data = yaml.safe_load(path.read_text()) or {}
        base = overlay_base(path, data)
        if base is not None and base not in (p for p, _ in laid):
            lay(base, (*chain, path))
            if base != default:  # the default lies under an overlay given alone anyway
                added.append(f"{_shown(path, root)} is laid over {_shown(base, root)}: "
                             "reading that first")
        laid.append((path, data))

    for file in configfiles:
        lay(Path(file).resolve(), ())
    if (laid and not replaced and default not in (p for p, _ in laid)
            and not _whole(laid[0][1], root / "workflow" / "schemas" / "config.schema.yaml")):
        laid.insert(0, (default, yaml.safe_load(default.read_text()) or {}))
    return laid, added


def config_files(configfiles: Sequence[str | Path], root: Path, *, replaced: bool
                 ) -> tuple[list[Path], list[str]]:
    """The files a pipeline config is built from, in the order they are laid over each
    other, and a line for each base laid under an overlay that came without it.

    Each overlay's base (`overlays`, followed as a chain) goes before it unless already
    there; below the first file lies the workflow's config/config.yaml, unless `replaced`
    or that file is a whole pipeline config (`stands_alone`), whose keys it would mix."""
    laid, added = _laid(configfiles, root, replaced)
    return [path for path, _ in laid], added


def build_config(configfiles: Sequence[str | Path], root: Path, *, replaced: bool,
                 overrides: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[str]]:
    """The pipeline config the files hold, laid over each other as `config_files` orders
    them, then `overrides` (Snakemake's --config); and the lines `config_files` says."""
    laid, added = _laid(configfiles, root, replaced)
    config: dict[str, Any] = {}
    for _, data in laid:
        config = merge(config, data)
    return merge(config, overrides or {}), added


def _shown(path: Path, root: Path) -> str:
    """A path as a user would type it, from the workflow's directory."""
    root = root.resolve()
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
