# The grid, the resolved run settings of each grid point, and the input functions.
import copy
import hashlib
import json
import os
from pathlib import Path

from snakemake.utils import validate

from rlcore.config import config_from_dict

validate(config, "../schemas/config.schema.yaml")

R = config["results"]  # every output lives below this directory

SOURCES = Path(workflow.basedir)
RUNTIME_SOURCES = sorted(
    p
    for p in (SOURCES / "rlcore").rglob("*.py")
    if p.name not in ("analysis.py", "bench.py", "cli.py")
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
    resolved = config_from_dict(config["run"]).to_dict()
    return {"base": resolved["base"], "task": resolved["task"]}


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


def all_outputs():
    return [
        *all_runs("eval.json"),
        f"{R}/tables/table1.csv",
        f"{R}/tables/table1.md",
        f"{R}/tables/k_sweep.csv",
        f"{R}/tables/k_sweep.md",
    ]
