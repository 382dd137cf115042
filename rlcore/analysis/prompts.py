"""Prompt-level audit of dropping stale samples: which prompts were trained, and how often, against
each prompt's answer length and difficulty (claim C8, tinker-cookbook PR #822: "dropping stale
rollouts biases training toward short, fast problems").

A prompt is one group (`group_id`) of a run's samples.jsonl; its slots are the samples
dispatched for it, each counted once by its final row (docs/metrics.md). Its `answer_chars` is
the length of its task's reference answer, known for every prompt: the axis C8 is tested on.
Its `length` and `pass_rate` are taken over the rows that have a response, stale drops
included, so they describe the prompt as sampled, not as trained. A prompt cut for good on
every slot has neither (and is never trained): the sampled length would leave out exactly the
long prompts dropping loses, which is why the audit ranks prompts by `answer_chars`.
The trained share of a set of prompts is their trained slots over their slots.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

from rlcore.record.rundir import read_jsonl

Row = dict[str, Any]  # one prompt, as `prompt_rows` gives it
# Why a slot was never trained, as samples.jsonl records it: dropped as stale (filter), or
# interrupted past staleness.max_retries resubmissions (retries exhausted)
DROP_CAUSES = ("dropped_stale", "dropped_interrupted")
# Each cause's part of the short bias, by the runs table's column name
BIAS_OF = {"dropped_stale": "stale_short_bias", "dropped_interrupted": "interrupted_short_bias"}
LENGTH_BIASES = ("short_bias", *BIAS_OF.values())  # the metrics the audit gives a run


def final_rows(samples: Iterable[Row]) -> list[Row]:
    """Each (group, slot)'s row with the highest `attempt`, in order of each slot's first row.

    The ledger writes one row per slot (an interrupted attempt that is resubmitted leaves only
    events), but a slot is counted by its last attempt so that a record holding earlier
    attempts as rows could not count a slot twice."""
    last: dict[tuple[int, int], Row] = {}
    for r in samples:
        key = (r["group_id"], r["slot"])
        if key not in last or r["attempt"] > last[key]["attempt"]:
            last[key] = r
    return list(last.values())


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def prompt_rows(samples: Iterable[Row]) -> list[Row]:
    """One row per prompt group, by `group_id`: `group_id`, `task_id`, `answer_chars` (None
    for a code task, or a run recorded without it), `samples` (its slots), `trained`,
    `trained_share`, `length` and `pass_rate` (None without a response), and `cut`: the most
    tokens a slot cut for good had generated (None if no slot was)."""
    groups: dict[int, list[Row]] = {}
    for r in final_rows(samples):
        groups.setdefault(r["group_id"], []).append(r)
    out = []
    for group_id, rows in sorted(groups.items()):
        # a `dropped_interrupted` row's length is where it was cut and its pass is no verdict
        answered = [r for r in rows if r["status"] != "dropped_interrupted"]
        cut = [r["response_tokens"] for r in rows if r["status"] == "dropped_interrupted"]
        trained = sum(r["batch_id"] is not None for r in rows)
        out.append({
            "group_id": group_id,
            "task_id": rows[0]["task_id"],
            "answer_chars": rows[0].get("answer_chars"),
            "samples": len(rows),
            "trained": trained,
            **{cause: sum(r["status"] == cause for r in rows) for cause in DROP_CAUSES},
            "trained_share": trained / len(rows),
            "length": _mean([r["response_tokens"] for r in answered]),
            "pass_rate": _mean([float(r["pass"]) for r in answered]),
            "cut": max(cut, default=None),
        })
    return out


def trained_share(prompts: Iterable[Row]) -> float | None:
    """Trained slots over slots of `prompts` (a prompt weighs by its slots); None if none."""
    prompts = list(prompts)
    samples = sum(p["samples"] for p in prompts)
    return sum(p["trained"] for p in prompts) / samples if samples else None


def _bin(key: str, prompts: list[Row]) -> Row:
    samples = sum(p["samples"] for p in prompts)
    return {"prompts": len(prompts),
            key: _mean([p[key] for p in prompts]),
            "low": prompts[0][key] if prompts else None,
            "high": prompts[-1][key] if prompts else None,
            "samples": samples,
            "trained": sum(p["trained"] for p in prompts),
            "trained_share": trained_share(prompts),
            **{f"{cause}_share": sum(p.get(cause, 0) for p in prompts) / samples
               if samples else None for cause in DROP_CAUSES}}


def binned_shares(prompts: Iterable[Row], key: str, bins: int | Sequence[float]) -> list[Row]:
    """The trained share of prompts binned by covariate `key` (`length`, `pass_rate`); prompts
    whose `key` is None are left out.

    `bins` an int n: n quantile bins of prompts ordered by (`key`, `group_id`), bin j holding
    ranks j*N//n to (j+1)*N//n - 1, so equal values may fall in neighbouring bins but the split
    is deterministic. `bins` a sequence of edges e_0 < ... < e_m: m bins [e_i, e_i+1), the last
    closed, for a covariate with few values (a pass rate of 4 samples). Each bin: `prompts`,
    the mean covariate under `key`, its `low` and `high`, `samples`, `trained`,
    `trained_share` (None for an empty bin)."""
    ranked = sorted((p for p in prompts if p[key] is not None),
                    key=lambda p: (p[key], p["group_id"]))
    if isinstance(bins, int):
        n = len(ranked)
        return [_bin(key, ranked[j * n // bins:(j + 1) * n // bins]) for j in range(bins)]
    edges = list(bins)
    last = len(edges) - 2
    return [_bin(key, [p for p in ranked
                       if lo <= p[key] < hi or (i == last and p[key] == hi)])
            for i, (lo, hi) in enumerate(pairwise(edges))]


def length_terciles(prompts: Iterable[Row], key: str = "answer_chars") -> list[Row]:
    """`binned_shares` over three quantile bins of `key`: short, middle, long."""
    return binned_shares(prompts, key, 3)


def short_bias(prompts: Iterable[Row], key: str = "answer_chars") -> float | None:
    """Trained share of the longest tercile of `key` minus that of the shortest; negative when
    long problems were trained less (C8 predicts it). None below 3 prompts with a `key`."""
    short, _, long = binned_shares(prompts, key, 3)
    if short["prompts"] == 0:  # N < 3: the bottom tercile N//3 is empty
        return None
    return long["trained_share"] - short["trained_share"]


def cause_bias(prompts: Iterable[Row], cause: str, key: str = "answer_chars") -> float | None:
    """The part of `short_bias` one drop cause makes (a status of DROP_CAUSES): the shortest
    tercile's share of slots dropped so less the longest's; negative when that cause drops
    long problems more. The causes' parts and what was never trained for another reason add
    up to `short_bias`. None below 3 prompts with a `key`."""
    short, _, long = binned_shares(prompts, key, 3)
    if short["prompts"] == 0:
        return None
    return short[f"{cause}_share"] - long[f"{cause}_share"]


def unanswered(prompts: Iterable[Row]) -> list[Row]:
    """The prompts with no response (every slot cut for good): on no length or pass-rate axis,
    and never trained."""
    return [p for p in prompts if p["length"] is None]


def runs_prompt_rows(run_dirs: Iterable[Path]) -> list[Row]:
    """`prompt_rows` of each run's samples.jsonl, pooled (group ids repeat across runs)."""
    return [p for d in run_dirs for p in prompt_rows(read_jsonl(Path(d) / "samples.jsonl"))]


def run_prompt_audit(run_dir: Path) -> dict[str, Any]:
    """A run's prompt audit: `prompts`, overall `trained_share`, `short_bias` (by answer
    length), the `length_terciles` and `pass_terciles` (`binned_shares` rows), and
    `no_response` and `no_response_samples`: the prompts (and their slots) never answered."""
    prompts = runs_prompt_rows([run_dir])
    silent = unanswered(prompts)
    return {"prompts": len(prompts),
            "trained_share": trained_share(prompts),
            "no_response": len(silent),
            "no_response_samples": sum(p["samples"] for p in silent),
            "short_bias": short_bias(prompts),
            "length_terciles": length_terciles(prompts),
            "pass_terciles": binned_shares(prompts, "pass_rate", 3)}


def run_length_biases(run_dir: Path) -> dict[str, float | None]:
    """A run's `short_bias` and each drop cause's part of it (`cause_bias`), as the runs
    table's columns: short_bias, stale_short_bias, interrupted_short_bias; None without
    samples.jsonl or enough prompts."""
    samples = Path(run_dir) / "samples.jsonl"
    prompts = prompt_rows(read_jsonl(samples)) if samples.is_file() else []
    return {"short_bias": short_bias(prompts) if prompts else None,
            **{BIAS_OF[cause]: cause_bias(prompts, cause) if prompts else None
               for cause in DROP_CAUSES}}
