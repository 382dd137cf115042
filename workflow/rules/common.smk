# The grid, the resolved run settings of each grid point, and the input functions.
import copy
import hashlib
import json
import os
from pathlib import Path

from snakemake.utils import validate

from rlcore.config import config_from_dict

validate(config, "../schemas/config.schema.yaml")
# The run section resolved in full once (defaults filled in, errors raised before any job
# starts), so the report's front page shows every value the runs used.
config["run"] = config_from_dict(config["run"]).to_dict()

R = config["results"]  # every output lives below this directory

SOURCES = Path(workflow.basedir)
# What a run job's results (summary.json and eval.json) depend on, for `rule run`'s digest.
# The rule: every module of the package (rlcore/**/*.py, found by a glob so that moved or new
# files count without an edit here) and the task data it ships, EXCEPT the modules that only
# read finished runs (tables, figures, the benchmark), so that editing those reruns only the
# tables and figures. cli.py (`rlcore run --eval`) and evaluation.py write eval.json: runtime.
ANALYSIS_SOURCES = (
    "rlcore/analysis.py",
    "rlcore/figures.py",
    "rlcore/trace_figures.py",
    "rlcore/bench.py",
)
RUNTIME_SOURCES = sorted(
    p
    for p in (
        *(SOURCES / "rlcore").rglob("*.py"),
        *(SOURCES / "rlcore").glob("data/**/*.jsonl"),
    )
    if p.relative_to(SOURCES).as_posix() not in ANALYSIS_SOURCES
)


def _merge(base, extra):
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def grid_points():
    """Every (mode, k, objective, seed) of the grid, as wildcard dicts."""
    g = config["grid"]
    for mode, ks in g["modes"].items():
        for k in ks:
            for objective in g["objectives"]:
                for seed in g["seeds"]:
                    yield dict(mode=mode, k=k, objective=objective, seed=seed)


def run_settings(wildcards):
    """The full, validated run config of one grid point; passed as a parameter, so an edit
    reruns exactly the runs it changes."""
    settings = _merge(config["run"], config["mode_settings"].get(wildcards.mode, {}))
    settings = _merge(
        settings,
        {
            "mode": wildcards.mode,
            "seed": int(wildcards.seed),
            "staleness": {"staleness_k": int(wildcards.k)},
            "train": {"objective": wildcards.objective},
        },
    )
    return config_from_dict(settings).to_dict()


def sources_hash(paths):
    """A digest of source files: Snakemake does not track imported modules by itself."""
    digest = hashlib.sha256()
    for path in paths:
        path = SOURCES / path
        digest.update(str(path.relative_to(SOURCES)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def base_settings():
    """What the base model depends on: the tiny model's and the task suite's settings."""
    return {"base": config["run"]["base"], "task": config["run"]["task"]}


def model_path():
    return config["run"]["model"]["path"]


def base_input(wildcards):
    """The base model directory when the pipeline builds it (the embedded tiny model)."""
    return [model_path()] if config["build_base"] else []


def all_runs(filename):
    """One path per grid point, e.g. results/runs/areal/k2/pg/seed0/summary.json."""
    return [
        f"{R}/runs/{p['mode']}/k{p['k']}/{p['objective']}/seed{p['seed']}/{filename}"
        for p in grid_points()
    ]


def trace_point(mode):
    """The grid point whose events the trace figures draw for a mode: the configured
    objective and seed, at the mode's K nearest to the configured one (lower on a tie).
    """
    trace = config["figures"]["trace"]
    ks = config["grid"]["modes"][mode]
    k = min(ks, key=lambda k: (abs(k - trace["k"]), k))
    return dict(mode=mode, k=k, objective=trace["objective"], seed=trace["seed"])


def trace_runs(wildcards):
    """summary.json of each mode's trace run, in the order of `grid.modes`."""
    return [
        "{R}/runs/{mode}/k{k}/{objective}/seed{seed}/summary.json".format(
            R=R, **trace_point(mode)
        )
        for mode in config["grid"]["modes"]
    ]


def check_figure_settings():
    """Cross-key checks the schema cannot express, before any job starts."""
    trace, grid = config["figures"]["trace"], config["grid"]
    for key, allowed in (("objective", grid["objectives"]), ("seed", grid["seeds"])):
        if trace[key] not in allowed:
            raise ValueError(
                f"figures.trace.{key} = {trace[key]!r} is not in grid.{key}s {allowed}: "
                "pick one of the grid's values"
            )
    start, end = config["figures"]["window_s"]
    if not start < end:
        raise ValueError(
            f"figures.window_s = {[start, end]}: the start must be before the end"
        )


check_figure_settings()


def check_model_path():
    """A given model (build_base: false) must be there before any job starts."""
    if not config["build_base"] and not Path(model_path(), "config.json").is_file():
        raise ValueError(
            f"run.model.path '{model_path()}' is not a Hugging Face model directory (no "
            "config.json). With build_base: false the pipeline uses that directory as it "
            "is: copy the model there (README, the paper's setup), or set build_base: true "
            "for the embedded tiny model."
        )


check_model_path()

FIGURES = (
    "pass_rate",
    "time_to_threshold",
    "reward_per_1k",
    "quality_throughput",
    "quality_vs_k",
    "staleness",
    "end_to_end",
)
TRACE_FIGURES = ("queue_depth", "worker_activity")


PLOT_CODE = sources_hash(
    [
        "rlcore/figures.py",
        "rlcore/trace_figures.py",
        "rlcore/analysis.py",
        "workflow/scripts/figures.py",
    ]
)


def figure(name, subcategory):
    """A figure's PNG, shown in the report with its caption from reports/<name>.rst."""
    return report(
        f"{R}/figures/{name}.png",
        caption=f"../../reports/{name}.rst",
        category="Figures",
        subcategory=subcategory,
    )


def all_outputs():
    return [
        *all_runs("eval.json"),
        f"{R}/tables/table1.csv",
        f"{R}/tables/table1.md",
        f"{R}/tables/k_sweep.csv",
        f"{R}/tables/k_sweep.md",
        f"{R}/tables/quality_vs_k.csv",
        f"{R}/tables/quality_vs_k.md",
        *(
            f"{R}/figures/{name}.{ext}"
            for name in FIGURES + TRACE_FIGURES
            for ext in ("png", "svg")
        ),
    ]
