"""From run directories to the paper's tables: one row per run, then means over seeds.

A run's row is named by its summary's `run` (rlcore/record/identity.py), never by its path:
the preset is the name the pipeline config gives the run's staleness settings
(`presets:`), and a replay's row also names the objective it is replayed under
(`replayed`; None for a run). The pipeline collects every row once into
`results/tables/runs.parquet` (`write_runs`), which the tables, claims and figures read
(`read_runs`). A run contributes once its summary.json exists; its held-out pass rate
comes from eval.json when `rlcore eval` has scored it. Aggregates are the mean and the
half-width of a two-sided 95% Student-t confidence interval over seeds (0 with a single
seed).

Every row has a `clock`: `wall` for a run timed by this machine's clock, else the name of the
hardware profile whose virtual clock timed it (docs/virtual_clock.md). Seconds of different
clocks are different quantities, so runs are grouped by clock before anything else and never
averaged across clocks.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
import sys
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rlcore.analysis.prompts import run_length_biases
from rlcore.config import MODES  # their order is the order of every table and figure
from rlcore.record.identity import RUN_GLOB, WALL_CLOCK, RunId

# Two-sided 95% Student-t critical values t_{0.975, df} for df = 1..30; 1.96 beyond.
_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
         2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
         2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]

# One-sided 95% (two-sided 90%) Student-t critical values t_{0.95, df} for df = 1..30; 1.645
# beyond: the bounds of the interval an equivalence test (two one-sided tests) reads.
_T95 = [6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812,
        1.796, 1.782, 1.771, 1.761, 1.753, 1.746, 1.740, 1.734, 1.729, 1.725,
        1.721, 1.717, 1.714, 1.711, 1.708, 1.706, 1.703, 1.701, 1.699, 1.697]

GROUP = ("clock", "mode", "preset", "staleness_k", "objective")


def group_order(key: Sequence[Any]) -> tuple[Any, ...]:
    """Sort (mode, preset, K, objective) as sync, threaded, AReaL-style, then by the rest."""
    mode, *rest = key
    return (MODES.index(mode) if mode in MODES else len(MODES), *rest)


def clock_order(clock: str) -> tuple[bool, str]:
    """Wall-clock runs first, then virtual ones by profile name."""
    return clock != WALL_CLOCK, clock


def row_order(key: Sequence[Any]) -> tuple[Any, ...]:
    """Sort a GROUP key (clock, mode, preset, K, objective) by clock, then as group_order."""
    clock, *rest = key
    return (clock_order(clock), *group_order(rest))


def mean_ci95(values: Sequence[float]) -> tuple[float, float]:
    """(mean, half-width of the 95% t interval); half-width 0 for fewer than two values."""
    if not values:
        return math.nan, math.nan
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, 0.0
    return mean, t975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))


def t975(df: float) -> float:
    """The 97.5 % quantile of Student's t with `df` degrees of freedom (a fractional df, as
    Welch's gives, rounds down: the wider interval); 1.96 past the table."""
    df = max(1, math.floor(df))
    return _T975[df - 1] if df <= len(_T975) else 1.96


def t95(df: float) -> float:
    """The 95 % quantile of Student's t with `df` degrees of freedom, rounded down as
    `t975`; 1.645 past the table."""
    df = max(1, math.floor(df))
    return _T95[df - 1] if df <= len(_T95) else 1.645


def gains(ev: Mapping[str, Any], base: Mapping[str, Any] | None) -> dict[str, float | None]:
    """What training added to held-out pass rates, sampled and greedy: the run's eval less
    the base model's, when both scored the same tasks with as many samples (else None)."""
    def task_ids(e: Mapping[str, Any]) -> list[str] | None:
        return [t["task_id"] for t in e["per_task"]] if e.get("per_task") else None

    same = (base is not None and task_ids(ev) is not None and task_ids(ev) == task_ids(base)
            and ev.get("samples_per_task") == base.get("samples_per_task"))
    out: dict[str, float | None] = {}
    for column, key in (("heldout_gain", "sampled_pass_rate"),
                        ("heldout_greedy_gain", "greedy_pass_rate")):
        out[column] = ev[key] - base[key] if same and base is not None else None
    return out


def run_row(run_dir: Path, base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The figures of one finished run that the tables use; `base`, the base model's
    eval (eval_base.json), adds the held-out gains over it."""
    s = json.loads((run_dir / "summary.json").read_text())
    eval_file = run_dir / "eval.json"
    ev = json.loads(eval_file.read_text()) if eval_file.is_file() else {}
    t, m, n = s["tokens"], s["metrics"], s["samples"]
    name = RunId.from_dict(s["run"])
    clock = name.clock
    replay = s["reproducibility"].get("replay")
    config_file = run_dir / "config.json"
    rt = (json.loads(config_file.read_text())["config"]["runtime"] if config_file.is_file()
          else {})
    return {
        "clock": clock,
        "mode": name.mode, "preset": name.preset, "staleness_k": name.k,
        "objective": name.objective, "seed": name.seed, "replayed": name.replayed,
        "replay_kind": replay["kind"] if replay else None, "run_dir": str(run_dir),
        "heldout_pass_rate": ev.get("sampled_pass_rate"),
        "heldout_greedy_pass_rate": ev.get("greedy_pass_rate"),
        **gains(ev, base),
        "train_pass_rate_final": m["train_pass_rate_final"],
        "time_to_threshold_s": m["time_to_threshold_s"],
        "steps_to_threshold": m["steps_to_threshold"],
        "threshold": m["threshold"],
        "reward_per_1k_tokens": m["reward_per_1k_tokens"],
        "acceptance_rate": m["acceptance_rate"],
        "dropped_stale": n["dropped_stale"],
        "dropped_interrupted": n["dropped_interrupted"],
        "resubmissions": n["resubmissions"],
        "accepted_samples_per_s": m["accepted_samples_per_s"],
        "updates_per_s": s["updates"] / s["time"]["wall_s"],
        # a ratio of two arms' throughputs is a difference of these (config/split.yaml)
        "log_updates_per_s": math.log(s["updates"] / s["time"]["wall_s"]),
        "rollout_workers": rt.get("rollout_workers"),
        "trainer_ranks": rt.get("trainer_ranks", 1) if rt else None,
        "wall_s": s["time"]["wall_s"],
        "cold_start_s": s["time"]["cold_start_s"],
        # the job's start-up is this machine's time, before any clock of the run starts: a
        # virtual run has no start-up on its profile's hardware to report
        "startup_s": s["time"]["startup_s"] if clock == WALL_CLOCK else None,
        "job_s": s["time"]["job_s"],  # this machine's, on any clock: what a seed costs here
        # a wall-clock run's block is its seed: the pipeline runs them seed by seed, and
        # started_unix (absent before it was recorded) says whether they did
        "block": name.seed if clock == WALL_CLOCK and name.replayed is None else None,
        "started_unix": s["time"].get("started_unix"),
        "contended": s["load"]["contended"],
        "state_digest": s["reproducibility"]["state_digest"],  # the final weights
        "overlap_frac": s["time"]["overlap_frac"],
        "tokens_generated": t["generated"],
        "tokens_wasted": t["stale_dropped"] + t["interrupted"],
        "wasted_frac": (t["stale_dropped"] + t["interrupted"]) / t["generated"]
        if t["generated"] else 0.0,
        **priced_paths(s),
        **provenance(s),
    }


# A path a profile prices (summary.json's profile_mismatch term) and the clock's charge for it
PRICED_TERMS = {"weight_transport": "weights", "decode_path": "decode"}
# Columns that are a clock's seconds, or rates per its second: on a virtual clock, its
# profile's prices, so the paths it priced are part of what they say.
CLOCK_METRICS = ("wall_s", "time_to_threshold_s", "updates_per_s", "log_updates_per_s",
                 "accepted_samples_per_s")


def priced_paths(summary: Mapping[str, Any]) -> dict[str, Any]:
    """For each PRICED_TERMS term: the path the run's profile priced where its config would
    take another (`priced_<term>`, `config_<term>`; None where they agree or on the wall
    clock) and the share of the run's seconds the clock charged to it (`<term>_share`)."""
    mismatch = summary.get("profile_mismatch") or {}
    charged = summary["clock"].get("charged_s") or {}
    wall = summary["time"]["wall_s"]
    out: dict[str, Any] = {}
    for term, charge in PRICED_TERMS.items():
        m = mismatch.get(term)
        out[f"priced_{term}"] = m["priced"] if m else None
        out[f"config_{term}"] = m["config"] if m else None
        out[f"{term}_share"] = charged[charge] / wall if charge in charged and wall else None
    return out


# What decided a run's last bits besides its config (docs/reproducibility.md), by column.
PROVENANCE = ("kernels", "cpu_capability", "mkl_cbwr", "threads_per_role", "cpu",
              "state_digest")


def model_parameters(model_dir: str | Path) -> int | None:
    """The parameters a Hugging Face model directory's safetensors weights hold (whole or
    sharded), read from their headers; None for other weights or none."""
    d = Path(model_dir)
    index = d / "model.safetensors.index.json"
    files = ([d / f for f in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
             if index.is_file() else [d / "model.safetensors"])
    if not all(f.is_file() for f in files):
        return None
    total = 0
    for f in files:
        with f.open("rb") as fh:  # 8 bytes of header length, then a JSON header of shapes
            header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
        total += sum(math.prod(t["shape"]) for k, t in header.items() if k != "__metadata__")
    return total


def provenance(summary: dict[str, Any]) -> dict[str, Any]:
    """The CPU, kernels and threads a run computed with, and its final state's digest (None
    where a run recorded none: runs from before `runtime.kernels`)."""
    rep = summary["reproducibility"]
    return {**{k: rep["environment"].get(k) for k in PROVENANCE[:-1]},
            "state_digest": rep["state_digest"]}


def environment_markdown(rows: Sequence[dict[str, Any]]) -> str:
    """One line per run: its grid point, then PROVENANCE (the digest shortened): two runs
    whose digests differ under the same config and kernels computed differently."""
    head = [*GROUP, "seed", *PROVENANCE]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [str(r[k]) for k in (*GROUP, "seed", *PROVENANCE[:-1])]
        lines.append("| " + " | ".join([*cells, f"`{r['state_digest'][7:19]}`"]) + " |")
    return "\n".join(lines) + "\n"


def write_runs(path: str | Path, run_dirs: Iterable[str | Path],
               base_eval: str | Path | None = None) -> None:
    """The rows of these runs and replays as one Parquet table (types and nulls kept), with
    their gains over the base model's eval file `base_eval` where given."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    base = json.loads(Path(base_eval).read_text()) if base_eval is not None else None
    rows = [run_row(Path(d), base) for d in run_dirs]
    rows.sort(key=lambda r: (*row_order([r[k] for k in GROUP]), r["seed"], r["replayed"] or ""))
    pq.write_table(pa.Table.from_pylist(rows), path)


def read_runs(path: str | Path, *, replays: bool | None = False) -> list[dict[str, Any]]:
    """The rows `write_runs` wrote: the runs (default), the replays (`replays=True`) or both
    (None), in table order."""
    import pyarrow.parquet as pq

    rows = pq.read_table(path).to_pylist()
    if replays is None:
        return rows
    return [r for r in rows if (r["replayed"] is not None) == replays]


def load_runs(root: str | Path) -> list[dict[str, Any]]:
    """One row per complete run under root, in a stable order."""
    rows = [run_row(p.parent)
            for p in sorted(Path(root).glob(f"{RUN_GLOB}/summary.json"))]
    return sorted(rows, key=lambda r: (*row_order([r[k] for k in GROUP]), r["seed"]))


def aggregate(rows: Iterable[dict[str, Any]], metrics: Sequence[str]) -> list[dict[str, Any]]:
    """Per (clock, mode, preset, K, objective): seeds, and mean and CI half-width of each
    metric.

    A metric missing in some runs (a threshold never reached, a run not evaluated) is averaged
    over the runs that have it, and `<metric>/n` says how many did.
    """
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in GROUP), []).append(r)
    out = []
    for key, members in sorted(groups.items(), key=lambda item: row_order(item[0])):
        agg: dict[str, Any] = dict(zip(GROUP, key, strict=True))
        agg["seeds"] = len(members)
        agg["contended"] = sum(bool(r["contended"]) for r in members)
        for metric in metrics:
            values = [r[metric] for r in members if r.get(metric) is not None]
            agg[f"{metric}/mean"], agg[f"{metric}/ci95"] = mean_ci95(values)
            agg[f"{metric}/n"] = len(values)
        out.append(agg)
    return out


TABLE1 = ("train_pass_rate_final", "heldout_pass_rate", "time_to_threshold_s",
          "steps_to_threshold", "reward_per_1k_tokens", "wall_s", "cold_start_s",
          "startup_s", "updates_per_s")
# Column headers of the Markdown tables (the CSV keeps the metric names).
LABELS = {
    "train_pass_rate_final": "train pass (paper's)",
    "heldout_pass_rate": "held-out pass, sampled (ours)",
    "time_to_threshold_s": "time to threshold (s)",
    "steps_to_threshold": "steps to threshold",
    "reward_per_1k_tokens": "reward / 1k tokens",
    "wall_s": "end-to-end (s)",
    "cold_start_s": "cold start (s)",
    "startup_s": "job start-up (s)",
    "updates_per_s": "updates/s",
    "acceptance_rate": "accepted / generated",
    "dropped_stale": "dropped stale",
    "dropped_interrupted": "dropped interrupted",
    "resubmissions": "resubmissions",
    "accepted_samples_per_s": "accepted samples/s",
    "tokens_wasted": "tokens wasted",
    "wasted_frac": "wasted / generated tokens",
    "short_bias": "trained share: long - short answers",
    "stale_short_bias": "... of it from stale drops",
    "interrupted_short_bias": "... from interrupted drops",
}
# Decimals of a Markdown cell: counts and rates of hundreds need none, seconds two.
DIGITS = {"steps_to_threshold": 0, "dropped_stale": 0, "dropped_interrupted": 0,
          "resubmissions": 0, "startup_s": 2,
          "tokens_wasted": 0, "accepted_samples_per_s": 0, "reward_per_1k_tokens": 1,
          "updates_per_s": 1, "wall_s": 2, "cold_start_s": 2, "time_to_threshold_s": 2}
K_SWEEP = ("acceptance_rate", "dropped_stale", "dropped_interrupted", "resubmissions",
           "tokens_wasted",
           "wasted_frac", "accepted_samples_per_s", "heldout_pass_rate", "short_bias",
           "stale_short_bias", "interrupted_short_bias")


def table1(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The paper's Table 1 per configuration: both pass rates, time and steps to threshold,
    sample efficiency, and end-to-end time with the cold start and the job's start-up
    apart."""
    return aggregate(rows, TABLE1)


def k_sweep(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per mode, preset, objective and K: acceptance, drops (stale; interrupted on the last
    allowed attempt), resubmissions, wasted tokens,
    accepted throughput, final pass rate, and the prompt audit's `short_bias` with the part
    of it each drop cause makes (read from each run's samples.jsonl here, the one table that
    shows them)."""
    return aggregate([{**r, **run_length_biases(Path(r["run_dir"]))} for r in rows], K_SWEEP)


def quality_vs_k(rows: Iterable[dict[str, Any]], mode: str, preset: str, clock: str = WALL_CLOCK
                 ) -> list[dict[str, Any]]:
    """AReaL's Table 2, shaped for this grid: the held-out pass rate of (`mode`, `preset`) per
    objective (rows) and staleness bound K (columns), with sync as the K = 0, on-policy
    reference, all of them runs of `clock`. Sync runs are one reference for all objectives
    when the grid runs sync with fewer objectives (on-policy, the four give the same
    gradient)."""
    rows = [r for r in rows if r["clock"] == clock]
    arm = [r for r in rows if r["mode"] == mode and r["preset"] == preset]
    cells = aggregate(arm, ("heldout_pass_rate",))
    sync = [r for r in rows if r["mode"] == "sync"]
    out: dict[str, dict[str, Any]] = {}
    for c in cells:
        row = out.setdefault(c["objective"], {"objective": c["objective"], "mode": mode,
                                              "preset": preset, "clock": clock})
        for stat in ("mean", "ci95", "n"):
            row[f"K={c['staleness_k']}/{stat}"] = c[f"heldout_pass_rate/{stat}"]
    for objective, row in out.items():
        same = [r for r in sync if r["objective"] == objective] or sync
        values = [r["heldout_pass_rate"] for r in same if r["heldout_pass_rate"] is not None]
        row["sync/mean"], row["sync/ci95"] = mean_ci95(values)
        row["sync/n"] = len(values)
        row["sync_objectives"] = ",".join(sorted({r["objective"] for r in same}))
    return [out[o] for o in sorted(out)]


def quality_vs_k_markdown(table: Sequence[dict[str, Any]]) -> str:
    """quality_vs_k as Markdown: `mean ± ci95` per cell, `—` where a run is missing."""
    columns = sorted({k.split("/")[0] for row in table for k in row if "/" in k},
                     key=lambda c: (c != "sync", int(c[2:]) if c != "sync" else 0))
    lines = ["| objective | " + " | ".join(c if c != "sync" else "sync (K=0 reference)"
                                          for c in columns) + " |",
             "|" + "---|" * (len(columns) + 1)]
    for row in table:
        cells = [format_mean_ci(row.get(f"{c}/mean", math.nan), row.get(f"{c}/ci95", 0.0),
                                row.get(f"{c}/n", 0)) for c in columns]
        lines.append(f"| {row['objective']} | " + " | ".join(cells) + " |")
    shared = sorted({row["sync_objectives"] for row in table
                     if row.get("sync/n") and row["sync_objectives"] != row["objective"]})
    if shared:
        lines.append(f"\nSync ran {', '.join(shared)} only: on-policy the four objectives give "
                     "the same gradient, so those runs are every objective's reference.")
    clocks = sorted({row["clock"] for row in table} - {WALL_CLOCK})
    if clocks:
        lines.append(f"\nRuns under the virtual clock of {', '.join(clocks)} "
                     "(docs/virtual_clock.md).")
    return "\n".join(lines) + "\n"


def format_mean_ci(mean: float, ci: float, n: int, digits: int = 3) -> str:
    """'0.512 ± 0.034', or '—' when no run has the value."""
    if n == 0 or math.isnan(mean):
        return "—"
    return f"{mean:.{digits}f} ± {ci:.{digits}f}"


def to_markdown(table: Sequence[dict[str, Any]], metrics: Sequence[str]) -> str:
    """A Markdown table: one row per configuration, `mean ± ci95` per metric, and how many
    of its runs were timed while other processes used the machine
    (`rlcore/record/machine_load.py`; a virtual clock's times do not depend on the
    machine)."""
    head = [*GROUP, "seeds", *(LABELS.get(m, m) for m in metrics), "timed under contention"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in table:
        cells = [str(row[k]) for k in (*GROUP, "seeds")]
        for m in metrics:
            cell = format_mean_ci(row[f"{m}/mean"], row[f"{m}/ci95"], row[f"{m}/n"],
                                  DIGITS.get(m, 3))
            if 0 < row[f"{m}/n"] < row["seeds"]:
                cell += f" (n={row[f'{m}/n']})"
            cells.append(cell)
        if row["clock"] != WALL_CLOCK:
            cells.append("n/a (virtual)")
        else:
            cells.append(f"{row['contended']} of {row['seeds']}" if row["contended"] else "no")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_csv(path: str | Path, rows: Sequence[dict[str, Any]]) -> None:
    """A table as CSV; its columns are every key of any row, in first-seen order (rows of
    quality_vs_k differ: an objective run at fewer K has fewer columns), blank where absent."""
    fields = list(dict.fromkeys(k for row in rows for k in row))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, restval="")
        writer.writeheader()
        writer.writerows(rows)


def logged(log_path: str, fn: Callable[..., None], *args: Any) -> None:
    """Run a workflow script's `fn` with stderr sent to its rule's log, where a traceback
    lands too (printed before the log is closed, then raised so that the rule fails)."""
    with open(log_path, "w") as log:
        sys.stderr = log
        try:
            fn(*args)
        except Exception:
            traceback.print_exc()
            raise
        finally:
            sys.stderr = sys.__stderr__
