# The grid, the resolved run settings of each grid point, and the input functions.
import copy
import json
import os
from pathlib import Path
from types import SimpleNamespace

from snakemake.utils import validate

from rlcore.clock.profile import HARDWARE_DIR, load_profile, profile_path
from rlcore.code_digest import (
    analysis_files,
    base_files,
    digest,
    plan_files,
    runtime_files,
)
from rlcore.config import MODES, config_from_dict
from rlcore.errors import ConfigError
from rlcore.policy.model_dir import missing_model_files
from rlcore.record.identity import (
    FILE_PATTERN,
    REPLAY_PATTERN,
    RUN_PATTERN,
    WALL_CLOCK,
    RunId,
    parse_arm,
)

validate(config, "../schemas/config.schema.yaml")
# The run section resolved in full once (defaults filled in, errors raised before any job
# starts), so the report's front page shows every value the runs used.
config["run"] = config_from_dict(config["run"]).to_dict()

R = config["results"]  # every output lives below this directory

# How run and replay jobs start (`python -m rlcore.launcher`, docs/launcher.md): forked from
# a warm server, or cold. An RLCORE_LAUNCHER already in the environment wins. The jobs
# inherit it; their shell commands stay the same, so switching reruns nothing.
os.environ.setdefault("RLCORE_LAUNCHER", config["launcher"])

# Each rule's code digest is a parameter, so an edit reruns exactly what it can change: the
# base part for the base model, the runtime part for runs and replays, the analysis part
# (plus the rule's script) for tables and figures (rlcore/code_digest.py says which files
# each part holds).
SOURCES = Path(workflow.basedir)
BASE_CODE = digest(SOURCES, base_files(SOURCES))
RUNTIME_CODE = digest(SOURCES, runtime_files(SOURCES))
PLAN_CODE = digest(SOURCES, plan_files(SOURCES))


def analysis_code(script):
    """The digest of the analysis package and one of workflow/scripts/."""
    return digest(
        SOURCES, [*analysis_files(SOURCES), SOURCES / "workflow" / "scripts" / script]
    )


def _merge(base, extra):
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


# A run's directory below runs/, a replay's below replays/, and the stem of a run's config
# and log files are rlcore.record.identity's patterns, whose fields are the wildcards; the
# clock level is WALL_CLOCK for this machine's clock, else the hardware profile's name.


def clock_name(clock):
    """The clock wildcard of a block's `clock` setting: `wall`, or NAME of `virtual:NAME`."""
    return clock.removeprefix("virtual:")


def grid_points():
    """Every (clock, mode, policy, k, objective, seed) of the grid once, in the blocks'
    order, as wildcard dicts."""
    g = config["grid"]
    points = {}
    for block in g["blocks"]:
        for mode in block["modes"]:
            for policy in block["policies"]:
                for k in block["ks"]:
                    for objective in block["objectives"]:
                        for seed in block.get("seeds", g["seeds"]):
                            point = dict(
                                clock=clock_name(block["clock"]),
                                mode=mode,
                                policy=policy,
                                k=k,
                                objective=objective,
                                seed=seed,
                            )
                            points[tuple(point.values())] = point
    return list(points.values())


def wall_points():
    """The grid points timed by the wall clock."""
    return [p for p in grid_points() if p["clock"] == WALL_CLOCK]


def trace_modes():
    """The modes the trace figures draw: those with a wall-clock run, in the order they
    first appear."""
    return list(dict.fromkeys(p["mode"] for p in wall_points()))


def replay_points():
    """Every replay: a grid point selected by grid.replays.of (on its clock), with the
    objective it is replayed under (`replayed`)."""
    replays = config["grid"].get("replays")
    if not replays:
        return []
    of = replays["of"]
    return [
        {**p, "replayed": objective}
        for p in grid_points()
        if p["clock"] == clock_name(of["clock"])
        and p["mode"] in of["modes"]
        and p["policy"] in of["policies"]
        and p["k"] in of["ks"]
        and p["objective"] in of["objectives"]
        for objective in replays["objectives"]
    ]


wildcard_constraints:
    clock="[A-Za-z0-9][A-Za-z0-9._-]*",
    mode="|".join(MODES),
    policy="[a-z][a-z0-9_]*",
    k=r"\d+",
    objective="pg|behav_clip|decoupled|a3po",
    replayed="pg|behav_clip|decoupled|a3po",
    seed=r"\d+",


def run_settings(wildcards):
    """The full, validated run config of one grid point; passed as a parameter, so an edit
    reruns exactly the runs it changes. The point's clock is its block's, whatever `run`
    or the policy say."""
    if wildcards.clock == WALL_CLOCK:
        runtime = {"clock": "wall"}
    else:
        runtime = {"clock": "virtual", "hardware": wildcards.clock}
    settings = _merge(config["run"], config["policies"][wildcards.policy])
    settings = _merge(
        settings,
        {
            "mode": wildcards.mode,
            "seed": int(wildcards.seed),
            "policy_name": wildcards.policy,
            "staleness": {"staleness_k": int(wildcards.k)},
            "train": {"objective": wildcards.objective},
            "runtime": runtime,
        },
    )
    return config_from_dict(settings).to_dict()


def hardware_input(wildcards):
    """A virtual run's hardware profile file, so that editing the profile reruns exactly
    the runs it prices; a wall-clock run reads none."""
    return [] if wildcards.clock == WALL_CLOCK else [str(profile_path(wildcards.clock))]


def base_settings():
    """What the base model depends on: the tiny model's and the task suite's settings."""
    return {"base": config["run"]["base"], "task": config["run"]["task"]}


def model_path():
    return config["run"]["model"]["path"]


def base_input(wildcards):
    """The base model directory when the pipeline builds it (the embedded tiny model)."""
    return [model_path()] if config["build_base"] else []


# Every run's and replay's row (rlcore.analysis.tables.write_runs): what analysis reads.
RUNS_TABLE = f"{R}/tables/runs.parquet"


def all_runs(filename):
    """One path per grid point, e.g. results/runs/wall/areal/paper/k2/pg/seed0/summary.json
    or results/runs/v100x2-qwen0.5b-fp16/sync/none/k0/pg/seed0/summary.json."""
    return [f"{R}/runs/{RUN_PATTERN.format(**p)}/{filename}" for p in grid_points()]


def base_eval_file():
    """eval_base.json: the base model on the held-out split, in the first grid point's run."""
    return f"{R}/runs/{RUN_PATTERN.format(**grid_points()[0])}/eval_base.json"


def all_replays(filename):
    """One path per replay, e.g. results/replays/wall/areal/paper/k2/pg/seed0/a3po/eval.json."""
    return [
        f"{R}/replays/{REPLAY_PATTERN.format(**p)}/{filename}" for p in replay_points()
    ]


def claim_arms_of(claim):
    """A claim's arms as (path, kind): kind `run` for CLOCK/MODE/POLICY/kK/OBJECTIVE,
    `replay` for one more level, the objective it is replayed under."""
    return [
        (arm, "replay" if parse_arm(arm)["replayed"] is not None else "run")
        for arm in claim["contrast"]
    ]


def claim_arms():
    """Every arm of every claim, as claim_arms_of gives them."""
    return [arm for claim in config.get("claims", []) for arm in claim_arms_of(claim)]


def point_arm(point):
    """A grid point's (or replay's) arm: its name without the seed."""
    return RunId(**point).arm()


def check_claims():
    """Every arm of every claim is a run or a replay of the grid."""
    runs = {point_arm(p) for p in grid_points()}
    replays = {point_arm(p) for p in replay_points()}
    for i, claim in enumerate(config.get("claims", [])):
        for arm, kind in claim_arms_of(claim):
            have = replays if kind == "replay" else runs
            if arm not in have:
                raise ValueError(
                    f"claims[{i}] ({claim['id']}) names the {kind} arm '{arm}', which the "
                    "grid does not make: add it to grid.blocks (a run) or grid.replays (a "
                    "replay), or change the claim's contrast"
                )


def trace_point(mode):
    """The wall-clock grid point whose events the trace figures draw for a mode: the
    configured policy, objective and seed where the mode has them, at its K nearest to the
    configured one (lower on a tie). Their window is in this machine's seconds."""
    trace = config["figures"]["trace"]
    return min(
        (p for p in wall_points() if p["mode"] == mode),
        key=lambda p: (
            p["policy"] != trace["policy"],
            p["objective"] != trace["objective"],
            p["seed"] != trace["seed"],
            abs(p["k"] - trace["k"]),
            p["k"],
        ),
    )


def trace_runs(wildcards):
    """summary.json of each mode's trace run, in the order of trace_modes()."""
    return [
        f"{R}/runs/{RUN_PATTERN.format(**trace_point(mode))}/summary.json"
        for mode in trace_modes()
    ]


def k_axis():
    """figures.k_axis with its clock as the tables' `clock` column names it: `wall` or the
    hardware profile's name."""
    axis = config["figures"]["k_axis"]
    return {**axis, "clock": clock_name(axis["clock"])}


def k_axis_points():
    """The grid points of figures.k_axis's arm (its mode, policy and clock)."""
    axis = k_axis()
    return [
        p
        for p in grid_points()
        if (p["mode"], p["policy"], p["clock"])
        == (axis["mode"], axis["policy"], axis["clock"])
    ]


def plan_point():
    """The run the planned K sweep starts from (its config, and its response lengths): the
    k_axis arm's pg run (else its first objective's) at the lowest seed and K."""
    return min(
        k_axis_points(), key=lambda p: (p["objective"] != "pg", p["seed"], p["k"])
    )


def plan_runs():
    """summary.json of every run the planned sweep is set beside: the k_axis arm's runs of
    the plan point's objective, every K and seed."""
    objective = plan_point()["objective"]
    return [
        f"{R}/runs/{RUN_PATTERN.format(**p)}/summary.json"
        for p in k_axis_points()
        if p["objective"] == objective
    ]


def plan_ks():
    """The K values of the k_axis arm, as `rlcore plan --sweep` takes them."""
    return ",".join(str(k) for k in sorted({p["k"] for p in k_axis_points()}))


def plan_profile():
    """The digest of the costs the plan prices with (the plan point's hardware profile): a
    parameter, so an edit of those costs reruns the plan wherever the sources are."""
    settings = run_settings(SimpleNamespace(**plan_point()))
    return load_profile(settings["runtime"]["hardware"]).digest()


def check_clock(where, clock):
    """A `clock` setting names `wall` or a hardware profile under config/hardware/ whose
    `name` is its file name (the name virtual runs record, which the tables show)."""
    if clock == WALL_CLOCK:
        return
    name = clock_name(clock)
    shipped = ", ".join(sorted(p.stem for p in HARDWARE_DIR.glob("*.yaml")))
    if name == WALL_CLOCK or name.endswith((".yaml", ".yml")):
        raise ValueError(
            f"{where} = '{clock}': write virtual:NAME with NAME a hardware profile's name "
            f"(a file config/hardware/NAME.yaml, NAME not '{WALL_CLOCK}'), one of {shipped}"
        )
    path = HARDWARE_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(
            f"{where} = '{clock}': there is no hardware profile '{name}' ({path}); use one "
            f"of {shipped}, or write one there with `rlcore calibrate CONFIG --out {path}`"
        )
    try:
        profile = load_profile(name)
    except ConfigError as e:
        raise ValueError(f"{where} = '{clock}': {e}") from e
    if profile.name != name:
        raise ValueError(
            f"{where} = '{clock}': {path} says `name: {profile.name}`; a profile's name "
            f"must be its file name: set `name: {name}` or rename the file"
        )


def check_grid():
    """Cross-key checks the schema cannot express, before any job starts."""
    grid, policies, figures = config["grid"], config["policies"], config["figures"]
    if config["run"]["runtime"]["clock"] != "wall":
        raise ValueError(
            "run.runtime.clock is 'virtual': in the pipeline each grid block sets its runs' "
            "clock; remove it from run.runtime and give the blocks clock: virtual:NAME"
        )
    for i, block in enumerate(grid["blocks"]):
        check_clock(f"grid.blocks[{i}].clock", block["clock"])
        for policy in block["policies"]:
            if policy not in policies:
                raise ValueError(
                    f"grid.blocks[{i}] names policy '{policy}', which is not in policies "
                    f"{sorted(policies)}: define it there or pick one of those"
                )
        if "sync" in block["modes"] and block["ks"] != [0]:
            raise ValueError(
                f"grid.blocks[{i}] runs sync at K = {block['ks']}: sync is on-policy, so "
                "its ks must be [0]; put sync in a block of its own"
            )
    points = grid_points()
    if figures["trace"]["policy"] not in policies:
        raise ValueError(
            f"figures.trace.policy '{figures['trace']['policy']}' is not in policies "
            f"{sorted(policies)}"
        )
    if not wall_points():
        raise ValueError(
            "grid.blocks has no wall-clock block: the queue-depth and worker-activity "
            "figures draw wall-clock runs; add a block without `clock` (or clock: wall)"
        )
    axis = figures["k_axis"]
    check_clock("figures.k_axis.clock", axis["clock"])
    if not any(
        (p["clock"], p["mode"], p["policy"])
        == (clock_name(axis["clock"]), axis["mode"], axis["policy"])
        for p in points
    ):
        raise ValueError(
            f"figures.k_axis = {axis}: the grid has no {axis['mode']} run under policy "
            f"'{axis['policy']}' on clock '{axis['clock']}'; name a (mode, policy, clock) "
            "of one of grid.blocks"
        )
    replays = grid.get("replays")
    if replays:
        check_clock("grid.replays.of.clock", replays["of"]["clock"])
    if replays and not replay_points():
        raise ValueError(
            f"grid.replays.of = {replays['of']} selects no run of the grid: name a clock, "
            "modes, policies, ks and objectives that one of grid.blocks runs"
        )
    start, end = figures["window_s"]
    if not start < end:
        raise ValueError(
            f"figures.window_s = {[start, end]}: the start must be before the end"
        )


check_grid()
check_claims()


def check_model_path():
    """A given model (build_base: false) must be whole before any job starts."""
    if config["build_base"]:
        return
    missing = missing_model_files(model_path())
    if missing:
        raise ValueError(
            f"run.model.path '{model_path()}' is not a Hugging Face model directory: it "
            f"lacks {'; '.join(missing)}. With build_base: false the pipeline uses that "
            "directory as it is: copy the whole model there (README, the paper's setup), "
            "or set build_base: true for the embedded tiny model."
        )


check_model_path()


def check_task_files():
    """A file suite's task files must load, and its verifier read their gold answers, before
    any job starts: a bad line is reported once, here (file, line and column), not by every
    job that reads the files."""
    from rlcore.tasks.reward import check_suite

    checked = set()
    for policy in [{}, *config["policies"].values()]:
        settings = _merge(config["run"], policy)
        # Only the sections a suite and its verifier read: the grid's mode and K are not
        # known here.
        sections = {
            k: settings[k] for k in ("model", "task", "reward") if k in settings
        }
        cfg = config_from_dict(sections)
        if cfg.task.suite == "jsonl" and (cfg.task, cfg.reward) not in checked:
            check_suite(cfg.task, cfg.reward)
            checked.add((cfg.task, cfg.reward))


check_task_files()

FIGURES = (
    "pass_rate",
    "time_to_threshold",
    "reward_per_1k",
    "quality_throughput",
    "quality_vs_k",
    "staleness",
    "end_to_end",
    "length_bias",
    "prompt_audit",
    "response_lengths",
)
TRACE_FIGURES = ("queue_depth", "worker_activity")
PLAN_FIGURES = ("plan_vs_measured",)


def figure(name, subcategory):
    """A figure's PNG, shown in the report with its caption from reports/<name>.rst."""
    return report(
        f"{R}/figures/{name}.png",
        caption=f"../../reports/{name}.rst",
        category="Figures",
        subcategory=subcategory,
    )


def replay_outputs():
    """The replays' evaluations, their table and figure (none without grid.replays)."""
    if not replay_points():
        return []
    return [
        *all_replays("eval.json"),
        f"{R}/tables/replays.csv",
        f"{R}/tables/replays.md",
        f"{R}/figures/quality_vs_k_replayed.png",
        f"{R}/figures/quality_vs_k_replayed.svg",
    ]


def claims_outputs():
    """The claims table (none without `claims`)."""
    if not config.get("claims"):
        return []
    return [f"{R}/tables/claims.csv", f"{R}/tables/claims.md"]


def all_outputs():
    return [
        *all_runs("eval.json"),
        *replay_outputs(),
        f"{R}/tables/table1.csv",
        f"{R}/tables/table1.md",
        f"{R}/tables/k_sweep.csv",
        f"{R}/tables/k_sweep.md",
        f"{R}/tables/quality_vs_k.csv",
        f"{R}/tables/quality_vs_k.md",
        f"{R}/plans/k_sweep.json",
        *claims_outputs(),
        *(
            f"{R}/figures/{name}.{ext}"
            for name in FIGURES + TRACE_FIGURES + PLAN_FIGURES
            for ext in ("png", "svg")
        ),
    ]
