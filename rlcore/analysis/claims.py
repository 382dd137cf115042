"""The claims table: each claim of the paper tested against the runs, with a verdict.

A claim is written in the pipeline config (`claims:`) as a *contrast*: a sum of weighted
arms, each arm the runs of one (clock, mode, preset, K, objective), or the replays of one
(..., replayed objective), measured by one metric. "AReaL-style beats sync on reward per 1k
tokens" is `+1 x areal - 1 x sync` on `reward_per_1k_tokens`; "uncorrected PPO degrades
under staleness while decoupled holds" is a difference of differences over four arms.

The effect is the contrast of the arms' values, with a two-sided 95 % t interval:
- paired (`pairing: seed`): per seed present in every arm, the contrast of that seed's
  values; their mean and t interval (n - 1 degrees of freedom);
- blocked (`pairing: block`, this machine's runs): the same, a seed's runs being a block the
  pipeline runs back to back, so that the machine's drift between hours falls between
  blocks; the row also gives the unpaired interval's half-width on the same runs, and
  whether the runs did start block by block (`started_unix`);
- unpaired (`pairing: none`): the contrast of the arms' means, Welch-Satterthwaite degrees
  of freedom.

Each metric has a smallest effect size of interest, delta (`sesoi:` in the config, absolute
or a share of the reference arm's mean): an effect within +-delta does not matter. The
verdict comes from the intervals alone: *equivalent* when the 90 % interval lies inside
+-delta (two one-sided tests at alpha 0.05: no effect that matters); else *supported* when
the 95 % interval lies wholly on the side of zero the claim predicts, *contradicted* when it
lies wholly on the other side, otherwise *unresolved at this power*. A claim that something
does not improve (`or_equivalent`) is supported by either its side or equivalence, and the
row says which. Beside it, the seeds per arm that would settle it at power 0.8: a two-sided
test at alpha = 0.05 at the effect and spread observed, and the two one-sided tests at a
true effect of zero (each with Guenther's correction of the normal approximation), and what
the seeds it lacks would cost this machine: the median `time.job_s` of each arm's jobs (a
replay arm's live run included), summed over the arms, times the seeds missing. The row says
whether that fits the budget's spare: `claims_budget_min` (the minutes of run and replay
jobs a fresh `make run` has room for) less the minutes the jobs read here took.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from rlcore.analysis.tables import PRICED_TERMS, t95, t975
from rlcore.record.identity import WALL_CLOCK, parse_arm

SUPPORTED, CONTRADICTED, UNRESOLVED = "supported", "contradicted", "unresolved at this power"
EQUIVALENT = "equivalent"
# A claim about one cause, on runs where that cause never happened: no verdict
ABSENT = "not tested: its cause is absent"
Z975 = 1.959964  # two-sided alpha = 0.05
Z80 = 0.841621  # power 0.8
Z95 = 1.644854  # one-sided alpha = 0.05, each of an equivalence's two tests
Z90 = 1.281552  # power 0.8 of both one-sided tests at a true effect of zero
ARM_KEYS = ("clock", "mode", "preset", "staleness_k", "objective", "replayed")
# What the runs record of why a sample was not trained, by runs-table column
DROP_COUNTS = ("dropped_stale", "dropped_interrupted", "resubmissions")


@dataclass(frozen=True)
class Arm:
    """The runs (or replays, when `replayed` is set) of one grid point, weighted."""

    weight: float
    clock: str
    mode: str
    preset: str
    staleness_k: int
    objective: str
    replayed: str | None = None

    def label(self) -> str:
        """'areal/paper/K2/pg' (+ ' replayed as decoupled'), the clock apart."""
        name = f"{self.mode}/{self.preset}/K{self.staleness_k}/{self.objective}"
        return name + (f" replayed as {self.replayed}" if self.replayed else "")

    def key(self) -> tuple[Any, ...]:
        return (self.clock, self.mode, self.preset, self.staleness_k, self.objective,
                self.replayed)


@dataclass(frozen=True)
class Sesoi:
    """A metric's smallest effect size of interest: an effect within +-delta does not matter."""

    delta: float
    relative: bool  # delta is a share of the reference arm's mean (the arm weighted -1)
    reason: str


def sesoi_from_config(spec: Mapping[str, Mapping[str, Any]]) -> dict[str, Sesoi]:
    """{metric: Sesoi} from the pipeline config's `sesoi:` (schema-checked there)."""
    return {metric: Sesoi(float(s["delta"]), bool(s["relative"]), str(s["reason"]))
            for metric, s in spec.items()}


@dataclass(frozen=True)
class Claim:
    """One comparison that tests a claim: `expect` is the sign the claim predicts;
    `or_equivalent`: the claim is that something does not improve, so equivalence (no effect
    that matters) supports it too."""

    id: str
    statement: str
    source: str
    metric: str
    expect: Literal["positive", "negative"]
    pairing: Literal["seed", "block", "none"]
    arms: tuple[Arm, ...]
    or_equivalent: bool = False
    cause: str | None = None  # a runs-table count the claim's mechanism needs above zero

    @property
    def clock(self) -> str:
        clocks = sorted({a.clock for a in self.arms})
        return clocks[0] if len(clocks) == 1 else "+".join(clocks)


def arm_from_path(path: str, weight: float) -> Arm:
    """An arm from its path CLOCK/MODE/PRESET/kK/OBJECTIVE[/REPLAYED] (the run or replay
    directory without the seed)."""
    f = parse_arm(path)
    return Arm(weight=float(weight), clock=f["clock"], mode=f["mode"], preset=f["preset"],
               staleness_k=f["k"], objective=f["objective"], replayed=f["replayed"])


def claim_from_config(spec: Mapping[str, Any]) -> Claim:
    """A Claim from one item of the pipeline config's `claims:` (schema-checked there):
    `contrast` maps arm paths to weights."""
    arms = tuple(arm_from_path(path, w) for path, w in spec["contrast"].items())
    return Claim(id=spec["id"], statement=spec["statement"], source=spec["source"],
                 metric=spec["metric"], expect=spec["expect"], pairing=spec["pairing"],
                 arms=arms, or_equivalent=bool(spec.get("or_equivalent", False)),
                 cause=spec.get("cause"))


def comparison_text(claim: Claim) -> str:
    """'areal/paper/K8/pg - areal/paper/K1/pg, wall clock, paired by seed'."""
    parts = []
    for i, arm in enumerate(claim.arms):
        w = abs(arm.weight)
        coef = "" if w == 1 else f"{w:g} x "
        sign = ("- " if arm.weight < 0 else "") if i == 0 else ("- " if arm.weight < 0 else "+ ")
        parts.append(f"{sign}{coef}{arm.label()}")
    clock = "this machine's clock" if claim.clock == WALL_CLOCK \
        else f"virtual clock ({claim.clock})"
    pairing = {"seed": "paired by seed", "block": "paired by block (a seed's runs, back to back)",
               "none": "unpaired"}[claim.pairing]
    return f"{' '.join(parts)}; {claim.metric}; {clock}; {pairing}"


@dataclass(frozen=True)
class Effect:
    """A contrast's estimate: mean, 95 % interval, the seeds behind it and its spread, and
    its standard error and degrees of freedom (for the other intervals)."""

    mean: float
    lo: float
    hi: float
    seeds: int  # paired: seeds in every arm; unpaired: the fewest of any arm
    spread: float  # paired: sd of the per-seed contrasts; unpaired: sqrt(sum w^2 sd^2)
    se: float = math.nan
    df: float = math.nan

    def interval90(self) -> tuple[float, float]:
        """The two-sided 90 % interval: its bounds are the two one-sided tests' at 0.05."""
        half = t95(self.df) * self.se if not math.isnan(self.se) else math.nan
        return self.mean - half, self.mean + half


def paired_effect(values: Sequence[Mapping[int, float]], weights: Sequence[float]) -> Effect:
    """The contrast per seed present in every arm, then its mean and t interval."""
    seeds = sorted(set.intersection(*(set(v) for v in values))) if values else []
    diffs = [sum(w * v[s] for w, v in zip(weights, values, strict=True)) for s in seeds]
    if len(diffs) < 2:
        mean = diffs[0] if diffs else math.nan
        return Effect(mean, math.nan, math.nan, len(diffs), math.nan)
    mean, sd = statistics.fmean(diffs), statistics.stdev(diffs)
    se = sd / math.sqrt(len(diffs))
    half = t975(len(diffs) - 1) * se
    return Effect(mean, mean - half, mean + half, len(diffs), sd, se, len(diffs) - 1)


def unpaired_effect(values: Sequence[Sequence[float]], weights: Sequence[float]) -> Effect:
    """The contrast of the arms' means with a Welch-Satterthwaite t interval."""
    n = min((len(v) for v in values), default=0)
    if n < 2:
        mean = (sum(w * statistics.fmean(v) for w, v in zip(weights, values, strict=True))
                if n else math.nan)
        return Effect(mean, math.nan, math.nan, n, math.nan)
    mean = sum(w * statistics.fmean(v) for w, v in zip(weights, values, strict=True))
    parts = [w * w * statistics.variance(v) / len(v)
             for w, v in zip(weights, values, strict=True)]
    spread = math.sqrt(sum(w * w * statistics.variance(v)
                           for w, v in zip(weights, values, strict=True)))
    var = sum(parts)
    if var == 0:
        return Effect(mean, mean, mean, n, 0.0, 0.0, n - 1)
    df = var**2 / sum(p * p / (len(v) - 1) for p, v in zip(parts, values, strict=True) if p)
    half = t975(df) * math.sqrt(var)
    return Effect(mean, mean - half, mean + half, n, spread, math.sqrt(var), df)


def seeds_needed(effect: float, spread: float, paired: bool) -> float:
    """Seeds per arm for a two-sided t test at alpha 0.05 with power 0.8 to detect `effect`
    given `spread` (paired: the sd of per-seed contrasts; unpaired: sqrt(sum w^2 sd^2));
    inf when no effect was observed, nan when the spread is unknown."""
    if math.isnan(effect) or math.isnan(spread):
        return math.nan
    if effect == 0:
        return math.inf
    n = (Z975 + Z80) ** 2 * (spread / effect) ** 2 + Z975**2 / (2 if paired else 4)
    return float(max(2, math.ceil(n)))


def seeds_needed_equivalence(spread: float, delta: float, paired: bool) -> float:
    """Seeds per arm for two one-sided tests at alpha 0.05 to show equivalence within
    +-delta with power 0.8 when the true effect is zero, given `spread` as for
    `seeds_needed`; nan when the spread or delta is unknown."""
    if math.isnan(spread) or math.isnan(delta) or delta <= 0:
        return math.nan
    n = (Z95 + Z90) ** 2 * (spread / delta) ** 2 + Z95**2 / (2 if paired else 4)
    return float(max(2, math.ceil(n)))


def verdict(effect: Effect, expect: str, delta: float = math.nan,
            or_equivalent: bool = False) -> tuple[str, str]:
    """(verdict, basis): equivalent when the 90 % interval lies inside +-delta (for an
    `or_equivalent` claim: supported, on that basis); else supported / contradicted by where
    the 95 % interval lies, or unresolved. The basis is `equivalence`, `interval` or ''."""
    if math.isnan(effect.lo):
        return UNRESOLVED, ""
    lo90, hi90 = effect.interval90()
    if delta > 0 and -delta < lo90 and hi90 < delta:
        return (SUPPORTED if or_equivalent else EQUIVALENT), "equivalence"
    sign = 1 if expect == "positive" else -1
    lo, hi = sorted((sign * effect.lo, sign * effect.hi))
    if lo > 0:
        return SUPPORTED, "interval"
    if hi < 0:
        return CONTRADICTED, "interval"
    return UNRESOLVED, ""


def delta_for(claim: Claim, per_arm: Sequence[Mapping[int, float]],
              sesoi: Mapping[str, Sesoi]) -> float:
    """The claim's delta in its metric's units: the metric's own, or its share of the mean
    of the reference arm (the one weighted -1); nan without a reference or its runs."""
    s = sesoi[claim.metric]
    if not s.relative:
        return s.delta
    ref = [v for a, v in zip(claim.arms, per_arm, strict=True) if a.weight == -1]
    if len(ref) != 1 or not ref[0]:
        return math.nan
    return s.delta * abs(statistics.fmean(ref[0].values()))


def row_key(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """A run's or replay's row keyed as an arm is (`Arm.key`)."""
    return tuple(row.get(k) for k in ARM_KEYS)


def arm_values(rows: Iterable[Mapping[str, Any]], arm: Arm, metric: str) -> dict[int, float]:
    """{seed: metric} of the rows (runs or replays) an arm selects; missing values skipped."""
    out = {}
    for r in rows:
        if row_key(r) == arm.key() and r.get(metric) is not None:
            out[int(r["seed"])] = float(r[metric])
    return out


def claim_rows(claim: Claim, rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The rows (runs or replays) of the claim's arms."""
    keys = {a.key() for a in claim.arms}
    return [r for r in rows if row_key(r) in keys]


def ran_block_by_block(claim: Claim, rows: Iterable[Mapping[str, Any]]) -> bool | None:
    """Whether the runs of the claim's arms started in block order (every run of seed s
    before any of a later seed); None when a run's start was not recorded."""
    starts = [(r.get("started_unix"), int(r["seed"])) for r in claim_rows(claim, rows)]
    if any(t is None for t, _ in starts):
        return None
    seeds = [s for _, s in sorted(starts)]
    return seeds == sorted(seeds)


def same_weights(claim: Claim, rows: Iterable[Mapping[str, Any]]) -> bool:
    """Whether, for every seed all the claim's arms ran, each arm's run ended in bit-for-bit
    the same weights (`state_digest`): the arms then made the same decisions and differ at
    most in time, so a contrast of what the weights score is zero by construction. A claim
    of one arm (a quantity against zero) compares no runs: never."""
    if len(claim.arms) < 2:
        return False
    per_arm = [{int(r["seed"]): r.get("state_digest") for r in rows if row_key(r) == a.key()}
               for a in claim.arms]
    seeds = set.intersection(*(set(d) for d in per_arm))
    return bool(seeds) and all(
        per_arm[0][s] is not None and all(d[s] == per_arm[0][s] for d in per_arm)
        for s in seeds)


def half_width(effect: Effect) -> float:
    """Half the 95 % interval's width (nan without one)."""
    return (effect.hi - effect.lo) / 2


def job_s_per_seed(claim: Claim, rows: Iterable[Mapping[str, Any]]) -> float:
    """This machine's seconds one more seed of the claim's arms costs: the median `job_s`
    of each arm's jobs, summed, with the live run each replay arm replays (once); nan when
    an arm has no job to price."""
    keys = {a.key() for a in claim.arms} | {(*a.key()[:-1], None) for a in claim.arms}
    times: dict[tuple[Any, ...], list[float]] = {k: [] for k in keys}
    for r in rows:
        if (key := row_key(r)) in times:
            times[key].append(float(r["job_s"]))
    if any(not t for t in times.values()):
        return math.nan
    return sum(statistics.median(t) for t in times.values())


def evaluate(claim: Claim, rows: Sequence[Mapping[str, Any]], spare_min: float,
             sesoi: Mapping[str, Sesoi]) -> dict[str, Any]:
    """One row of the claims table for `claim` over run and replay `rows` (each with the
    ARM_KEYS, `seed`, `job_s` and the claim's metric); `spare_min` is the minutes of jobs
    the budget has left for more seeds; `sesoi` gives each metric's delta."""
    per_arm = [arm_values(rows, arm, claim.metric) for arm in claim.arms]
    weights = [a.weight for a in claim.arms]
    paired = claim.pairing != "none"
    unpaired = unpaired_effect([list(v.values()) for v in per_arm], weights)
    effect = paired_effect(per_arm, weights) if paired else unpaired
    missing = [a.label() for a, v in zip(claim.arms, per_arm, strict=True) if not v]
    delta = delta_for(claim, per_arm, sesoi)
    need = seeds_needed(effect.mean, effect.spread, paired)
    need_eq = seeds_needed_equivalence(effect.spread, delta, paired)
    # the seeds that settle it one way or the other: the fewer of the two outcomes' needs
    fewest = min((n for n in (need, need_eq) if not math.isnan(n)), default=math.nan)
    per_seed = job_s_per_seed(claim, rows)
    extra = (max(0.0, fewest - effect.seeds) * per_seed / 60 if math.isfinite(fewest)
             else fewest)
    lo90, hi90 = effect.interval90()
    outcome, basis = verdict(effect, claim.expect, delta, claim.or_equivalent)
    counts = cause_counts(claim, rows)
    if counts is not None and counts["runs"] and not counts[str(claim.cause)]:
        outcome, basis = ABSENT, "cause"
    return {
        "claim": claim.id,
        "statement": claim.statement,
        "source": claim.source,
        "comparison": comparison_text(claim),
        "clock": claim.clock,
        "metric": claim.metric,
        "expect": claim.expect,
        "effect": effect.mean,
        "ci95_lo": effect.lo,
        "ci95_hi": effect.hi,
        "ci90_lo": lo90,
        "ci90_hi": hi90,
        "ci95_half": half_width(effect),
        # a blocked row: the unpaired interval on the same runs, and whether they ran as blocks
        "unpaired_ci95_half": half_width(unpaired) if claim.pairing == "block" else math.nan,
        "block_by_block": ran_block_by_block(claim, rows) if claim.pairing == "block" else None,
        "delta": delta,
        "seeds": effect.seeds,
        "seeds_needed": need,
        "seeds_needed_equivalence": need_eq,
        "seeds_to_settle": fewest,
        "job_min_per_seed": per_seed / 60,
        # the seeds it lacks, for its arms alone, one job at a time on this machine
        "extra_job_min": extra,
        "spare_min": spare_min,
        "beyond_budget": not extra <= spare_min,  # nan and inf included
        "verdict": outcome,
        "basis": basis,
        "missing_arms": "; ".join(missing),
        "same_weights": same_weights(claim, rows),
        "cause": claim.cause,
        "cause_per_run": cause_per_run(counts),
        **priced_for(claim, rows),
    }


def priced_for(claim: Claim, rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Each PRICED_TERMS term the claim's runs were priced on where their config would take
    another path: `priced_<term>` and `config_<term>` (joined by '/' where runs differ;
    None where none was), and `<term>_share`, the largest share of a run's seconds it was
    charged, as a mean over each arm's seeds."""
    out: dict[str, Any] = {}
    for term in PRICED_TERMS:
        hit = [r for r in claim_rows(claim, rows) if r.get(f"priced_{term}")]
        for side in ("priced", "config"):
            out[f"{side}_{term}"] = "/".join(sorted({str(r[f"{side}_{term}"]) for r in hit})
                                             ) or None
        shares: dict[tuple[Any, ...], list[float]] = {}
        for r in hit:
            if r.get(f"{term}_share") is not None:
                shares.setdefault(row_key(r), []).append(float(r[f"{term}_share"]))
        out[f"{term}_share"] = max(map(statistics.mean, shares.values()), default=None)
    return out


def cause_counts(claim: Claim, rows: Iterable[Mapping[str, Any]]) -> dict[str, float] | None:
    """Each drop cause's count (DROP_COUNTS) summed over the runs of the claim's arms, by
    column; None for a claim that names no cause."""
    if claim.cause is None:
        return None
    mine = claim_rows(claim, rows)
    return {c: sum(float(r.get(c) or 0) for r in mine) for c in
            dict.fromkeys((claim.cause, *DROP_COUNTS))} | {"runs": float(len(mine))}


def cause_per_run(counts: Mapping[str, float] | None) -> str:
    """'dropped_stale 0, dropped_interrupted 1055.0 a run': what a row's runs dropped, by
    cause, per run; '' without a cause."""
    if counts is None or not counts.get("runs"):
        return ""
    runs = counts["runs"]
    return ", ".join(f"{c} {counts[c] / runs:.4g}" for c in counts if c != "runs") + " a run"


def claims_table(claims: Iterable[Claim], rows: Sequence[Mapping[str, Any]],
                 budget_min: float, sesoi: Mapping[str, Sesoi]) -> list[dict[str, Any]]:
    """The claims table, one row per comparison, in the config's order; `budget_min` is the
    minutes of jobs a run of the grid has room for, of which `rows` (runs and replays) took
    their `job_s`; `sesoi` gives each claim's metric its delta."""
    spare = budget_min - sum(float(r["job_s"]) for r in rows) / 60
    return [evaluate(c, rows, spare, sesoi) for c in claims]


@dataclass(frozen=True)
class BlockedWidths:
    """The blocked rows' 95 % half-widths against the unpaired ones on the same runs, each in
    its row's delta (the rows' metrics differ in units), as medians over the rows."""

    rows: int
    blocked: float  # median half-width / delta, paired by block
    unpaired: float  # median half-width / delta, unpaired
    ratio: float  # median of blocked / unpaired, row by row
    out_of_order: tuple[str, ...]  # claims whose runs did not start block by block


def blocked_widths(table: Sequence[Mapping[str, Any]]) -> BlockedWidths | None:
    """How much pairing by block narrows the intervals of the blocked rows (their widths,
    not their verdicts: a wider interval agrees more often and says less); None without a
    blocked row with both intervals."""
    rows = [r for r in table if not math.isnan(r["unpaired_ci95_half"])
            and not math.isnan(r["ci95_half"]) and r["delta"] > 0]
    if not rows:
        return None
    ratios = [r["ci95_half"] / r["unpaired_ci95_half"] for r in rows if r["unpaired_ci95_half"]]
    return BlockedWidths(
        rows=len(rows),
        blocked=statistics.median(r["ci95_half"] / r["delta"] for r in rows),
        unpaired=statistics.median(r["unpaired_ci95_half"] / r["delta"] for r in rows),
        ratio=statistics.median(ratios) if ratios else math.nan,
        out_of_order=tuple(r["claim"] for r in rows if r["block_by_block"] is False))
