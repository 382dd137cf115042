# The config checked once, the grid's points, and the input functions that turn them into
# paths. The grid and the checks are rlcore.pipeline's (tested without Snakemake); the paths
# are rlcore.record.identity's patterns, whose fields are the wildcards.
import dataclasses
import json
import os
import sys
from pathlib import Path

from snakemake.utils import validate

from rlcore.clock.profile import load_profile, profile_path
from rlcore.code_digest import (
    analysis_files,
    base_files,
    digest,
    plan_files,
    runtime_files,
)
from rlcore.algo import registry as objectives
from rlcore.config import MODES, config_from_dict
from rlcore.config.renamed import PIPELINE_RENAMES, upgrade
from rlcore.pipeline.checks import check_pipeline
from rlcore.policy.packaged import PACKAGED
from rlcore.pipeline.grid import (
    block_priorities,
    build_config,
    clock_name,
    gpus_named,
    grid_points,
    plugin_code,
    replay_points,
    run_settings,
)
from rlcore.record.identity import (
    FILE_PATTERN,
    REPLAY_PATTERN,
    RUN_PATTERN,
    WALL_CLOCK,
)

SCHEMA = "../schemas/config.schema.yaml"
# Snakemake lays --configfile files over config/config.yaml. The config is built again from
# the files `config_files` names (`build_config`): an overlay's base (`overlays`) laid under it where it came
# without it, and no config/config.yaml under a whole pipeline config (config/paper.yaml),
# whose keys it would mix with another study's; then --config, as Snakemake has it.
if workflow.overwrite_configfiles:
    BUILT, ADDED = build_config(
        workflow.overwrite_configfiles,
        Path(workflow.basedir),
        replaced=workflow.config_settings.replace_workflow_config,
        overrides=dict(workflow.config_settings.config),
    )
    for line in ADDED:
        print(f"rlcore: {line}", file=sys.stderr)
    config.clear()
    config.update(BUILT)

# Keys renamed this release are read under their new names, with a message saying so.
for message in upgrade(config, PIPELINE_RENAMES):
    print(f"rlcore: {message}", file=sys.stderr)
validate(config, SCHEMA)
# The run section resolved in full once (defaults filled in, errors raised before any job
# starts), so the report's front page shows every value the runs used.
config["run"] = config_from_dict(config["run"]).to_dict()
check_pipeline(config)
POINTS = grid_points(config)  # every run, in the blocks' order
WALL_POINTS = [p for p in POINTS if p["clock"] == WALL_CLOCK]
REPLAYS = replay_points(
    config
)  # every replay: a point and the objective it replays under

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


def with_plugins(code, plugins):
    """A part's digest, and the plugins' where a job imports any (built-ins add nothing)."""
    return f"{code}+{plugins}" if plugins else code


def job_code(wildcards):
    """A run's, replay's or base eval's code: the runtime part and the plugins it imports."""
    settings = point_settings(wildcards)
    objectives = [settings["train"]["objective"]]
    if "replayed" in wildcards.keys():
        objectives.append(wildcards.replayed)
    return with_plugins(
        RUNTIME_CODE, plugin_code(objectives, settings["task"]["suite"])
    )


def base_code():
    """The base model's code: the base part and a plugin suite's package."""
    return with_plugins(BASE_CODE, plugin_code([], config["run"]["task"]["suite"]))


def analysis_code(script):
    """The digest of the analysis package and one of workflow/scripts/."""
    return digest(
        SOURCES, [*analysis_files(SOURCES), SOURCES / "workflow" / "scripts" / script]
    )


def trace_modes():
    """The modes the trace figures draw: those with a wall-clock run, in the order they
    first appear."""
    return list(dict.fromkeys(p["mode"] for p in WALL_POINTS))


wildcard_constraints:
    clock="[A-Za-z0-9][A-Za-z0-9._-]*",
    mode="|".join(MODES),
    preset="[a-z][a-z0-9_]*",
    k=r"\d+",
    objective="|".join(objectives.names()),
    replayed="|".join(objectives.names()),
    seed=r"\d+",


def point_settings(wildcards):
    """The full, validated run config of one grid point (rlcore.pipeline.grid.run_settings):
    a parameter, so an edit reruns exactly the runs it changes."""
    return run_settings(config, dict(wildcards.items()))


def hardware_input(wildcards):
    """A virtual run's hardware profile file, so that editing the profile reruns exactly
    the runs it prices; a wall-clock run reads none."""
    return [] if wildcards.clock == WALL_CLOCK else [str(profile_path(wildcards.clock))]


def base_settings():
    """What the base model depends on: the tiny model's and the task suite's settings, or
    the packaged model's name and pinned wheel."""
    if isinstance(config["build_base"], str):
        return {"packaged": dataclasses.asdict(PACKAGED[config["build_base"]])}
    return {"base": config["run"]["base"], "task": config["run"]["task"]}


def base_command():
    """The shell command that puts the base model at {output}: built, or fetched."""
    if isinstance(config["build_base"], str):
        return f"rlcore fetch-model {config['build_base']} {{output}} --force > {{log}} 2>&1"
    return "rlcore build-base {output} --config {input.config} --force > {log} 2>&1"


def model_path():
    return config["run"]["model"]["path"]


def base_config_path():
    """The settings the base model is built from, beside it (models/tiny.settings.json)."""
    return f"{os.path.normpath(model_path())}.settings.json"


def base_input(wildcards):
    """The base model directory when the pipeline builds it (the embedded tiny model)."""
    return [model_path()] if config["build_base"] is not False else []


# What a job holds of the machine (`threads:` and the `gpu` resource of runs and replays). A
# wall-clock run's times are what it measures, so it holds the machine alone: every core
# (Snakemake scales a claim above --cores down to it) and the GPUs its devices name. A virtual run's
# and a replay's times are a function of their config, and their roles mostly take turns on
# one core (a virtual run's prefills and updates compute beside the next role), so two of
# them share the machine.
def timed_alone(wildcards):
    """A wall-clock run, not a replay of one (whose times are its schedule's)."""
    return wildcards.clock == WALL_CLOCK and not hasattr(wildcards, "replayed")


def job_threads(wildcards):
    return (os.cpu_count() or 1) if timed_alone(wildcards) else 1


def job_gpus(wildcards):
    """The GPUs the run's devices name (both roles on cuda:0: one, so that --resources
    gpu=1 runs it); a virtual run or a replay holds at most one."""
    settings = run_settings(config, dict(wildcards.items()))
    named = gpus_named(settings["model"], settings["runtime"])
    return named if timed_alone(wildcards) else min(1, named)


# Wall-clock runs go block by block (rlcore.pipeline.grid.block_priorities: seed 0's runs,
# then seed 1's, ...), so that a live claim compares arms that ran minutes apart, paired by
# block. Priorities, not job groups: a group would run its jobs as one job, where each run
# must hold the machine alone; a priority only orders them. Their configs get the same
# priority, so that the next run in line is never waiting on its config.
BLOCK_PRIORITY = block_priorities(config)


def block_priority(wildcards):
    return BLOCK_PRIORITY.get(RUN_PATTERN.format(**dict(wildcards.items())), 0)


# Every run's and replay's row (rlcore.analysis.tables.write_runs): what analysis reads.
RUNS_TABLE = f"{R}/tables/runs.parquet"


def all_runs(filename):
    """One path per grid point, e.g. results/runs/wall/areal/paper/k2/pg/seed0/summary.json
    or results/runs/v100x2-qwen0.5b-fp16/sync/none/k0/pg/seed0/summary.json."""
    return [f"{R}/runs/{RUN_PATTERN.format(**p)}/{filename}" for p in POINTS]


def base_eval_file():
    """eval_base.json: the base model on the held-out split, in the first grid point's run."""
    return f"{R}/runs/{RUN_PATTERN.format(**POINTS[0])}/eval_base.json"


def all_replays(filename):
    """One path per replay, e.g. results/replays/wall/areal/paper/k2/pg/seed0/a3po/eval.json."""
    return [f"{R}/replays/{REPLAY_PATTERN.format(**p)}/{filename}" for p in REPLAYS]


def trace_point(mode):
    """The wall-clock grid point whose events the trace figures draw for a mode: the
    configured preset, objective and seed where the mode has them, at its K nearest to the
    configured one (lower on a tie). Their window is in this machine's seconds."""
    trace = config["figures"]["trace"]
    return min(
        (p for p in WALL_POINTS if p["mode"] == mode),
        key=lambda p: (
            p["preset"] != trace["preset"],
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
    """The grid points of figures.k_axis's arm (its mode, preset and clock)."""
    axis = k_axis()
    return [
        p
        for p in POINTS
        if (p["mode"], p["preset"], p["clock"])
        == (axis["mode"], axis["preset"], axis["clock"])
    ]


def plan_point():
    """The run whose config the planned K sweep starts from: the k_axis arm's pg run (else
    its first objective's) at the lowest seed and K."""
    return min(
        k_axis_points(), key=lambda p: (p["objective"] != "pg", p["seed"], p["k"])
    )


def plan_length_runs():
    """summary.json of the run each planned K draws its response lengths from: that K's run
    of the plan point's objective and seed, in the order of plan_ks()."""
    point = plan_point()
    by_k = {
        p["k"]: p
        for p in k_axis_points()
        if (p["objective"], p["seed"]) == (point["objective"], point["seed"])
    }
    return [
        f"{R}/runs/{RUN_PATTERN.format(**by_k[k])}/summary.json" for k in sorted(by_k)
    ]


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
    settings = run_settings(config, plan_point())
    return load_profile(settings["runtime"]["hardware"]).digest()


def clocks_priced():
    """What each virtual clock of the grid prices, for the front page: its profile's
    machine, weight transport and decode path."""
    out = {}
    for p in POINTS:
        if p["clock"] != WALL_CLOCK and p["clock"] not in out:
            profile = load_profile(p["clock"])
            out[p["clock"]] = {
                "machine": profile.machine,
                "weight_transport": profile.weight_transport,
                "decode_path": profile.decode_path,
            }
    return out


def split_arms():
    """The arms the split study plans (config `splits`): each sync and AReaL-style pg arm
    of the grid, as (clock, mode, preset, K), at its lowest seed's point; none without it.
    """
    if not config.get("splits"):
        return []
    arms = {}
    for p in POINTS:
        key = (p["clock"], p["mode"], p["preset"], p["k"])
        if (
            p["mode"] in ("sync", "areal")
            and p["objective"] == "pg"
            and key not in arms
        ):
            arms[key] = p
    return list(arms)


def split_point(wildcards):
    """The lowest-seed pg point of the arm a split plan is of."""
    return min(
        (
            p
            for p in POINTS
            if (p["clock"], p["mode"], p["preset"], p["k"], p["objective"])
            == (
                wildcards.clock,
                wildcards.mode,
                wildcards.preset,
                int(wildcards.k),
                "pg",
            )
        ),
        key=lambda p: p["seed"],
    )


def split_arm_config(wildcards):
    """The run config a split plan plans: its arm's lowest-seed point's."""
    return f"{R}/configs/{FILE_PATTERN.format(**split_point(wildcards))}.json"


def split_lengths_run(wildcards):
    """summary.json of the run a split plan draws its response lengths from: the first
    sync pg point of its clock at its lowest seed (a user has it before any split runs).
    """
    syncs = [
        p
        for p in POINTS
        if p["clock"] == wildcards.clock
        and p["mode"] == "sync"
        and p["objective"] == "pg"
    ]
    if not syncs:
        raise ValueError(
            f"the split study plans clock {wildcards.clock} from its sync arm's response "
            "lengths, and the grid has no sync pg run on it: add one"
        )
    arm = [
        p
        for p in syncs
        if p["preset"] == syncs[0]["preset"] and p["k"] == syncs[0]["k"]
    ]
    first = min(arm, key=lambda p: p["seed"])
    return f"{R}/runs/{RUN_PATTERN.format(**first)}/summary.json"


def split_hardware(wildcards):
    """`--hardware` for a wall-clock arm's plan (config splits.live_profile); a virtual arm
    is planned on its own profile."""
    if wildcards.clock == WALL_CLOCK:
        return f"--hardware {config['splits']['live_profile']}"
    return ""


def split_profile(wildcards):
    """The digest of the profile a split plan prices with: a parameter, so that an edit of
    its costs reruns the plan."""
    name = (
        config["splits"]["live_profile"]
        if wildcards.clock == WALL_CLOCK
        else run_settings(config, split_point(wildcards))["runtime"]["hardware"]
    )
    return load_profile(name).digest()


def split_plans():
    """Every split plan, in the order of split_arms()."""
    return [
        f"{R}/plans/split/{clock}/{mode}-{preset}-k{k}.json"
        for clock, mode, preset, k in split_arms()
    ]


def split_outputs():
    """The split study's plans, table and figure (none without config `splits`)."""
    if not config.get("splits"):
        return []
    return [
        *split_plans(),
        f"{R}/tables/split.csv",
        f"{R}/tables/split_groups.csv",
        f"{R}/tables/split.md",
        f"{R}/figures/split.png",
        f"{R}/figures/split.svg",
    ]


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
    if not REPLAYS:
        return []
    return [
        *all_replays("eval.json"),
        f"{R}/tables/replays.csv",
        f"{R}/tables/replays.md",
        f"{R}/figures/quality_vs_k_replayed.png",
        f"{R}/figures/quality_vs_k_replayed.svg",
    ]


def claims_outputs():
    """The claims table, the paper beside it and its forest plot (none without `claims`)."""
    if not config.get("claims"):
        return []
    return [
        f"{R}/tables/claims.csv",
        f"{R}/tables/claims.md",
        f"{R}/tables/paper_beside.md",
        f"{R}/figures/claims_forest.png",
        f"{R}/figures/claims_forest.svg",
    ]


def all_outputs():
    planned = config["figures"]["plan"]
    plans = [f"{R}/plans/k_sweep.json"] if planned else []
    plan_figures = PLAN_FIGURES if planned else ()
    return [
        *all_runs("eval.json"),
        *replay_outputs(),
        f"{R}/tables/table1.csv",
        f"{R}/tables/table1.md",
        f"{R}/tables/k_sweep.csv",
        f"{R}/tables/k_sweep.md",
        f"{R}/tables/quality_vs_k.csv",
        f"{R}/tables/quality_vs_k.md",
        *plans,
        *claims_outputs(),
        *split_outputs(),
        *(
            f"{R}/figures/{name}.{ext}"
            for name in FIGURES + TRACE_FIGURES + plan_figures
            for ext in ("png", "svg")
        ),
    ]
