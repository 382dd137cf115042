"""Response lengths for the planner: what rollout would generate, without a model.

A plan draws each attempt's response length from a distribution over (tokens, finished)
pairs, `finished` meaning the response ended with a stop token rather than at
`rollout.max_new_tokens`. The draw is a pure function of (seed, slot, attempt), as a run's
token draws are (`rlcore/policy/sampler.py`), so a plan is a function of its inputs:
  empirical  the lengths of a finished run's samples (its samples.jsonl), as they came
             (all but the attempts interrupted, whose lengths say where the cut fell):
             pooled, or per task (an attempt at a task drawn from that task's lengths, as
             a task's answer sets its length: a long task stays long on every retry);
  recorded   the same, except that each attempt the run recorded keeps its own length (and
             each it cut off runs on until it is cut);
  fitted     a geometric distribution over 1..max_new_tokens with a given mean: a stop token
             ends each step with the same probability, and what reaches the cap is unfinished.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

from rlcore.errors import ConfigError
from rlcore.record.schedule import ScheduleError, read_schedule


def uniform(seed: int, slot: int, attempt: int) -> float:
    """The uniform in [0, 1) that draws the length of `attempt` of sample `slot`: blake2b-64
    of the three integers and a tag that keeps it apart from the token draws."""
    h = hashlib.blake2b(b"length" + struct.pack("<3q", seed, slot, attempt), digest_size=8)
    return (int.from_bytes(h.digest(), "little") >> 11) / 2**53


# The length of an attempt that ran past any cap (`Lengths.capped` stops it at the cap).
RUNS_ON = 2**62


@dataclass(frozen=True)
class Lengths:
    """A discrete distribution over (response tokens, finished), and where it came from."""

    source: str
    values: tuple[tuple[int, bool], ...]
    weights: tuple[float, ...]
    # attempts whose lengths a run recorded, by (slot, attempt): drawn as recorded
    recorded: dict[tuple[int, int], tuple[int, bool]] = field(default_factory=dict)
    # each task's own lengths, by task id: an attempt at a task is drawn from these (a
    # task's attempts share its length; `values` serve the tasks not among them)
    by_task: dict[str, tuple[tuple[int, bool], ...]] = field(default_factory=dict)
    _cdf: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.values or len(self.values) != len(self.weights) or sum(self.weights) <= 0:
            raise ValueError(f"lengths from {self.source}: no values with positive weight")
        total, cdf = 0.0, []
        for w in self.weights:
            total += w
            cdf.append(total)
        object.__setattr__(self, "_cdf", tuple(c / total for c in cdf))

    def draw(self, seed: int, slot: int, attempt: int, task_id: str | None = None
             ) -> tuple[int, bool]:
        """The (tokens, finished) of one attempt (at task `task_id`)."""
        if (slot, attempt) in self.recorded:
            return self.recorded[slot, attempt]
        u = uniform(seed, slot, attempt)
        own = self.by_task.get(task_id) if task_id is not None else None
        if own:
            return own[min(int(u * len(own)), len(own) - 1)]
        i = bisect.bisect_right(self._cdf, u)
        return self.values[min(i, len(self.values) - 1)]

    @property
    def mean(self) -> float:
        return sum(n * w for (n, _), w in zip(self.values, self.weights, strict=True)) \
            / sum(self.weights)

    def capped(self, max_new_tokens: int) -> Lengths:
        """These lengths under a cap of `max_new_tokens` (longer responses stop there,
        unfinished)."""
        merged: dict[tuple[int, bool], float] = {}
        for (n, fin), w in zip(self.values, self.weights, strict=True):
            key = (n, fin) if n <= max_new_tokens else (max_new_tokens, False)
            merged[key] = merged.get(key, 0.0) + w
        keys = sorted(merged)
        def cap(n: int, fin: bool) -> tuple[int, bool]:
            return min(n, max_new_tokens), fin and n <= max_new_tokens

        return Lengths(self.source, tuple(keys), tuple(merged[k] for k in keys),
                       {key: cap(*v) for key, v in self.recorded.items()},
                       {task: tuple(cap(*v) for v in vs) for task, vs in self.by_task.items()})


def geometric(mean: float, max_new_tokens: int, source: str) -> Lengths:
    """Lengths 1..max_new_tokens where each step stops with one probability p, fitted so the
    mean length (unfinished responses counting max_new_tokens) is `mean`."""
    if not 1 <= mean <= max_new_tokens:
        raise ConfigError(f"a mean response length of {mean} tokens is outside 1.."
                          f"{max_new_tokens} (rollout.max_new_tokens)")

    def dist(p: float) -> list[tuple[tuple[int, bool], float]]:
        out = [((n, True), p * (1 - p) ** (n - 1)) for n in range(1, max_new_tokens + 1)]
        return out + [((max_new_tokens, False), (1 - p) ** max_new_tokens)]

    def mean_of(p: float) -> float:
        return sum(n * w for (n, _), w in dist(p))

    lo, hi = 0.0, 1.0  # mean_of falls from max_new_tokens (p = 0) to 1 (p = 1)
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mean_of(mid) > mean else (lo, mid)
    pairs = [(v, w) for v, w in dist((lo + hi) / 2) if w > 0]
    return Lengths(source, tuple(v for v, _ in pairs), tuple(w for _, w in pairs))


def _run_lengths(run_dir: Path) -> dict[tuple[int, int], tuple[tuple[int, bool], str | None]]:
    """(tokens, finished) of every attempt of a run that was not cut short, and its task id
    (None in a row without one), by (slot, attempt)."""
    path = run_dir / "samples.jsonl"
    if not path.is_file():
        raise ConfigError(f"--lengths {run_dir}: no samples.jsonl there; give the directory "
                          "of a finished run (`rlcore run ... --out DIR`)")
    out = {}
    with path.open() as f:
        for line_no, line in enumerate(f, start=1):
            try:
                row = json.loads(line)
                if row["status"] == "dropped_interrupted":
                    continue  # cut short: its length says only where the cut fell
                out[int(row["slot"]), int(row["attempt"])] = (
                    (int(row["response_tokens"]), bool(row["finished"])), row.get("task_id"))
            except (ValueError, KeyError) as e:
                raise ConfigError(f"{path}, line {line_no}: not a sample row with slot, "
                                  f"attempt, status, response_tokens and finished ({e})") from e
    if not out:
        raise ConfigError(f"{path} holds no samples")
    return out


def empirical(run_dir: str | Path, *, as_recorded: bool = False, per_task: bool = False
              ) -> Lengths:
    """The response lengths of a finished run's samples, each weighted by its count;
    `per_task`: an attempt at a task the run sampled is drawn from that task's lengths;
    `as_recorded`: an attempt the run recorded is drawn as it was (the others from the
    counts), which checks a plan against that run."""
    rows = _run_lengths(Path(run_dir))
    counts: dict[tuple[int, bool], int] = {}
    by_task: dict[str, list[tuple[int, bool]]] = {}
    for pair, task in rows.values():
        counts[pair] = counts.get(pair, 0) + 1
        if per_task and task is not None:
            by_task.setdefault(task, []).append(pair)
    keys = sorted(counts)
    recorded = {**_cut_attempts(Path(run_dir)), **{k: pair for k, (pair, _) in rows.items()}} \
        if as_recorded else {}
    kind = "as recorded" if as_recorded else "empirical per task" if per_task else "empirical"
    return Lengths(f"{kind}: {run_dir}", tuple(keys), tuple(float(counts[k]) for k in keys),
                   recorded, {task: tuple(sorted(v)) for task, v in by_task.items()})


def _cut_attempts(run_dir: Path) -> dict[tuple[int, int], tuple[int, bool]]:
    """The attempts a run cut off unfinished (its schedule's cut rows), each as still running
    at the cap: how long it would have run is unknown, but a plan that cuts it at the same
    chunk cuts it at the same length."""
    try:
        schedule = read_schedule(run_dir)
    except ScheduleError as e:
        raise ConfigError(f"--as-recorded {run_dir}: {e}") from None
    return {(slot, attempt): (RUNS_ON, False)
            for g in schedule.generations for i in g.cut for slot, attempt, _ in [g.rows[i]]}


def chosen(run_dir: str | Path | None, max_new_tokens: int, *, fit: bool, as_recorded: bool,
           mean_tokens: float | None, pooled: bool = False) -> Lengths | None:
    """`rlcore plan`'s length options: a run's lengths (fitted, as recorded, pooled, or per
    task), else a geometric of `mean_tokens`, else None (the config's own default)."""
    if (fit or as_recorded or pooled) and run_dir is None:
        raise ConfigError("--fit, --as-recorded and --pooled read a run's lengths: give "
                          "--lengths RUN_DIR")
    if run_dir is not None:
        return fitted(run_dir, max_new_tokens) if fit else \
            empirical(run_dir, as_recorded=as_recorded, per_task=not pooled)
    if mean_tokens:
        return geometric(mean_tokens, max_new_tokens,
                         f"given: geometric, mean {mean_tokens:g} tokens")
    return None


def fitted(run_dir: str | Path, max_new_tokens: int) -> Lengths:
    """A geometric distribution with the mean response length of a finished run."""
    pairs = [pair for pair, _ in _run_lengths(Path(run_dir)).values()]
    mean = min(max_new_tokens, sum(n for n, _ in pairs) / len(pairs))
    return geometric(max(1.0, mean), max_new_tokens,
                     f"fitted: geometric, mean {mean:.2f} tokens of {run_dir}")
