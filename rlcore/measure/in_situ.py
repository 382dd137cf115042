"""`rlcore calibrate --from-runs`: a hardware profile fitted to the busy spans of finished
runs, so that its prices are those of work done under the runs' own contention.

Each span in a run's events.jsonl carries the work it computed, in the terms a profile
prices (`clock/work.py::terms`). A span's seconds are its work's price, stretched while the
other computing role was busy too: with rollout and trainer both computing, the virtual
clock runs each at speed 1 / (1 + s) (`cpu.concurrent_slowdown`, two computations on their
own cores), so a span whose share f of its time overlapped the other role's spans takes

    seconds = price / (1 - f + f / (1 + s)).

For each s on a grid the prices follow by non-negative least squares over every span of
every run at once (one price per term, whatever the config); the s with the smallest error
wins. Terms no span exercised keep the base profile's values.

A threaded run's spans are not priced: its roles share one interpreter, so each span holds
the time it waited for the lock. It fits the interpreter-lock share of decode, prefill and
update instead (`interpreter_fit.py`): the share, on a grid, at which the planner's updates/s
on the fitted prices, with the run's own response lengths, comes closest to the run's.

A weight copy is timed on its own inside its span (a rollout worker's `weight_reload`
event, a trainer's `time/weight_write_s`), and it comes in nearly every span, so a fit of
whole spans cannot tell its price from the span's other per-call costs: at 5977315 it put
3.7 ms on a reload that took 0.3 ms. Such a timed part is taken out of its span and fitted
as an observation of its own. So is a rollout worker's hand-off of each batch (its
`handoff` events, between its spans), which prices `profile.handoff`.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlcore.clock.profile import HardwareProfile, optional_section, profile_from_dict
from rlcore.clock.work import Handoff, terms
from rlcore.errors import ConfigError
from rlcore.measure.drift_fit import DriftFit, fit_drift
from rlcore.measure.interpreter_fit import GIL_SECTIONS, fit_interpreter, with_gil_share
from rlcore.measure.timings import nonneg_lstsq
from rlcore.record.rundir import read_jsonl

# The roles whose computations overlap one another in an asynchronous run.
COMPUTING = ("rollout", "trainer")
SLOWDOWNS = tuple(i / 100 for i in range(101))


@dataclasses.dataclass(frozen=True)
class Span:
    """One busy span: its role, its seconds, the share of them during which the other
    computing role was busy too, its work (term -> quantity), and its worker and start."""

    role: str
    seconds: float
    overlap: float
    work: dict[str, float]
    worker: str
    start: float


def covered(start: float, end: float, others: Sequence[tuple[float, float]]) -> float:
    """The share of [start, end] that the union of `others` covers (0 for an empty span)."""
    if end <= start:
        return 0.0
    total, reach = 0.0, start
    for a, b in sorted(others):
        a, b = max(a, reach), min(b, end)
        if b > a:
            total += b - a
            reach = b
    return total / (end - start)


@dataclasses.dataclass(frozen=True)
class TimedPart:
    """A part of a span that the run timed on its own: which role and worker (None: any of
    the role's), an instant inside the span, its seconds, and the profile section it is."""

    role: str
    worker: str | None
    t: float
    seconds: float
    section: str


def timed_parts(events: Sequence[dict[str, Any]], updates: Sequence[dict[str, Any]] = ()
                ) -> list[TimedPart]:
    """The weight copies a run timed: each reload of a rollout worker (ending at its event's
    `t`) and each trainer's write (inside the update that ended at its `t_commit`)."""
    parts = [TimedPart("rollout", e["worker"], e["t"], e["reload_s"], "weight_read")
             for e in events if e.get("type") == "weight_reload"]
    parts += [TimedPart("trainer", None, u["t_commit"], u["time/weight_write_s"],
                        "weight_write")
              for u in updates if "t_commit" in u and u.get("time/weight_write_s")]
    return parts


def _split(span: Span, end: float, parts: Sequence[TimedPart]) -> list[Span]:
    """`span` less its timed parts, and one span per section of them (named after it, with
    its terms and their seconds); the span whole if its parts took more time than it had."""
    mine = [p for p in parts if p.role == span.role and p.worker in (None, span.worker)
            and span.start <= p.t <= end
            and any(k.startswith(p.section + ".") for k in span.work)]
    timed = {p.section: 0.0 for p in mine}
    for p in mine:
        timed[p.section] += p.seconds
    if not timed or sum(timed.values()) >= span.seconds:
        return [span]
    out = [dataclasses.replace(span, seconds=span.seconds - sum(timed.values()), work={
        k: v for k, v in span.work.items() if k.split(".")[0] not in timed})]
    out += [dataclasses.replace(span, role=section, seconds=seconds, work={  # its own line
        k: v for k, v in span.work.items() if k.split(".")[0] == section})
            for section, seconds in timed.items()]
    return out


def spans_of(events: Sequence[dict[str, Any]], updates: Sequence[dict[str, Any]] = ()
             ) -> list[Span]:
    """A run's spans that carry work, each with its overlap with the other computing role,
    and their weight copies split out as spans of their own (`timed_parts`)."""
    raw = [e for e in events if e.get("type") == "span" and e.get("work")]
    parts = timed_parts(events, updates)
    by_role: dict[str, list[tuple[float, float]]] = {}
    for e in raw:
        by_role.setdefault(e["role"], []).append((e["start"], e["end"]))

    def others(role: str) -> list[tuple[float, float]]:
        return [iv for other in COMPUTING if other != role and role in COMPUTING
                for iv in by_role.get(other, [])]

    out = []
    for e in raw:
        span = Span(e["role"], e["end"] - e["start"],
                    covered(e["start"], e["end"], others(e["role"])),
                    dict(e["work"]), e.get("worker", e["role"]), e["start"])
        out += _split(span, e["end"], parts)
    for e in events:  # a rollout worker's hand-offs, between its spans: on its own core
        if e.get("type") == "handoff":
            start = e["t"] - e["handoff_s"]
            out.append(Span("handoff", e["handoff_s"],
                            covered(start, e["t"], others("rollout")),
                            terms(Handoff(e["samples"])), e["worker"], start))
    return out


@dataclasses.dataclass(frozen=True)
class RunSpans:
    """What a fit reads of one run directory."""

    path: str
    cpu: str
    kernels: str
    clock: str
    mode: str
    updates_per_s: float
    spans: list[Span]


def read_run(run_dir: str | Path) -> RunSpans:
    """A finished run's spans and the host it ran on; refused with the fix when the run has
    no spans with work (a run from before spans carried it, or a replay)."""
    d = Path(run_dir)
    summary_path, events_path = d / "summary.json", d / "events.jsonl"
    if not summary_path.is_file() or not events_path.is_file():
        raise ConfigError(f"{d}: not a finished run directory (no summary.json or "
                          "events.jsonl): give the directories `rlcore run --out` wrote")
    summary = json.loads(summary_path.read_text())
    env = summary["reproducibility"]["environment"]
    updates_path = d / "updates.jsonl"
    updates = read_jsonl(updates_path) if updates_path.is_file() else []
    spans = spans_of(read_jsonl(events_path), updates)
    if not spans:
        raise ConfigError(f"{d}: no busy span records its work (a run from before spans "
                          "carried it, or a replay): rerun it with this version of rlcore")
    wall = summary["time"]["wall_s"]
    return RunSpans(str(d), env["cpu"], env["kernels"], summary["clock"]["kind"],
                    summary["mode"], summary["updates"] / wall if wall else 0.0, spans)


@dataclasses.dataclass(frozen=True)
class InSituFit:
    """The fitted prices, the slowdown, and how well they explain each role's spans."""

    prices: dict[str, float]  # term -> seconds per unit
    slowdown: float
    residual: dict[str, float]  # role -> RMS error over the role's mean span
    spans: dict[str, int]  # role -> spans fitted
    stalls: dict[str, int]  # role -> spans left out as stalls of the host (`STALL`)


# A span that took more than this many times its fitted price is a stall of the host (this
# VM pauses a process for 0.4-0.7 s now and then), not work at the price's rate: least
# squares in seconds would spread a few of them over every price. Such spans are left out
# and the fit is done again. Live runs keep their stalls; the virtual clock has none.
STALL = 4.0


def stretch(overlap: Any, s: float) -> Any:
    """How much longer than its price a span runs whose share `overlap` of its time the
    other computing role was busy too, at slowdown s (a number, or an array of them)."""
    return 1.0 / (1.0 - overlap + overlap / (1.0 + s))


def _stretch(spans: Sequence[Span], s: float) -> np.ndarray:
    return np.asarray(stretch(np.array([sp.overlap for sp in spans]), s))


def fit_spans(spans: Sequence[Span], slowdowns: Sequence[float] = SLOWDOWNS) -> InSituFit:
    """Prices (>= 0) and the slowdown that best explain the spans' seconds, least squares in
    seconds, every term and span at once; then again without the spans that took more than
    `STALL` times their price."""
    first = _fit(spans, slowdowns)
    stall = [sp.seconds > STALL * p > 0 for sp, p in zip(spans, first.predicted, strict=True)]
    if not any(stall):
        return first.result({})
    stalls = Counter(sp.role for sp, stalled in zip(spans, stall, strict=True) if stalled)
    kept = [sp for sp, stalled in zip(spans, stall, strict=True) if not stalled]
    return _fit(kept, slowdowns).result(dict(stalls))


@dataclasses.dataclass(frozen=True)
class _Fit:
    prices: dict[str, float]
    slowdown: float
    predicted: np.ndarray
    residual: dict[str, float]
    spans: dict[str, int]

    def result(self, stalls: dict[str, int]) -> InSituFit:
        return InSituFit(self.prices, self.slowdown, self.residual, self.spans,
                         {role: stalls.get(role, 0) for role in self.spans})


def _fit(spans: Sequence[Span], slowdowns: Sequence[float]) -> _Fit:
    terms = sorted({k for sp in spans for k, v in sp.work.items() if v})
    x = np.array([[sp.work.get(k, 0.0) for k in terms] for sp in spans], dtype=float)
    y = np.array([sp.seconds for sp in spans], dtype=float)
    scale = x.max(axis=0)  # columns of one magnitude: bytes in GB beside cache positions
    best: tuple[float, float, np.ndarray] | None = None
    for s in slowdowns:
        stretch = _stretch(spans, s)
        fit = nonneg_lstsq((x / scale * stretch[:, None]).tolist(), y.tolist())
        coef = np.array(fit.coef) / scale
        err = float(np.sum((x @ coef * stretch - y) ** 2))
        if best is None or err < best[0] - 1e-15:
            best = (err, s, coef)
    assert best is not None
    _, slowdown, coef = best
    predicted = x @ coef * _stretch(spans, slowdown)
    residual, counts = {}, {}
    for role in sorted({sp.role for sp in spans}):
        idx = [i for i, sp in enumerate(spans) if sp.role == role]
        rms = float(np.sqrt(np.mean((predicted[idx] - y[idx]) ** 2)))
        residual[role], counts[role] = rms / float(np.mean(y[idx])), len(idx)
    return _Fit(dict(zip(terms, (float(c) for c in coef), strict=True)), slowdown, predicted,
                residual, counts)


def run_speed(run: RunSpans, profile: HardwareProfile) -> float | None:
    """How slow this run's machine was against `profile`: its rollout and trainer spans'
    seconds over what the profile predicts for them (stretched by their overlap), stalls
    included; None for a threaded run, whose spans hold its waits for the interpreter lock.
    Live speed moves by up to 40 % between runs on this VM, so a fitted profile is 1 on
    average and a run in a slow stretch is above 1."""
    if run.mode == "async":
        return None
    seconds = predicted = 0.0
    for sp in run.spans:
        if sp.role in COMPUTING:
            seconds += sp.seconds
            predicted += profile.seconds_of(sp.work) * stretch(
                sp.overlap, profile.cpu.concurrent_slowdown)
    return seconds / predicted if predicted > 0 else None


def residual_series(spans: Sequence[Span], fit: InSituFit) -> list[list[tuple[float, float]]]:
    """Per worker of a computing role, in time order: each span's start and the log of its
    seconds over the fit's prediction (stalls left out, as in the fit)."""
    by_worker: dict[str, list[tuple[float, float]]] = {}
    for sp in spans:
        if sp.role not in COMPUTING:
            continue
        price = sum(fit.prices.get(k, 0.0) * v for k, v in sp.work.items())
        predicted = price * stretch(sp.overlap, fit.slowdown)
        if predicted > 0 and sp.seconds > 0 and sp.seconds <= STALL * predicted:
            by_worker.setdefault(sp.worker, []).append((sp.start, np.log(sp.seconds / predicted)))
    return [sorted(series) for series in by_worker.values() if len(series) > 1]


def priced(base: HardwareProfile, fit: InSituFit, drift: DriftFit | None, name: str,
           runs: Sequence[RunSpans]) -> HardwareProfile:
    """`base` with the fitted prices, slowdown, drift (None: the base's) and provenance; a
    copy's 'per_gb' price becomes its bandwidth (a price of 0: too fast to see, a very high
    one)."""
    data = base.to_dict()
    for term, price in fit.prices.items():
        section, field = term.split(".")
        if data[section] is None:  # a section the base leaves out (handoff): from zero
            data[section] = optional_section(section)
        if field == "per_gb":
            data[section]["gb_per_s"] = 1.0 / price if price > 0 else 1e6
        else:
            data[section][field] = price
    data["cpu"]["concurrent_slowdown"] = fit.slowdown
    if drift is not None:
        data["drift"] = {"sd": round(drift.sd, 4), "time_s": round(drift.time_s, 4)}
    cpus = sorted({r.cpu for r in runs})
    kernels = sorted({r.kernels for r in runs})
    data.update(
        name=name, host=", ".join(cpus), kernels=", ".join(kernels), model_bytes=None,
        # the paths the runs took are theirs, not the base's: not recorded
        decode_path=None, weight_transport=None, device_type=None,
        machine=f"{', '.join(cpus)}: the runs' own machine, under their own contention",
        source=(f"rlcore calibrate --from-runs, {time.strftime('%Y-%m-%d')}, "
                f"{sum(len(r.spans) for r in runs)} spans of {len(runs)} runs "
                f"({', '.join(r.path for r in runs)}); other terms from {base.name}"))
    return profile_from_dict(data, f"fitted to {len(runs)} runs")


def calibrate_from_runs(run_dirs: Sequence[str | Path], base: HardwareProfile, name: str, *,
                        drift: bool) -> tuple[HardwareProfile, str]:
    """A profile fitted to the runs' spans (and, with `drift`, their speed's drift), and a
    report of the fit; the runs must be on this machine's clock and on one CPU model."""
    runs = [read_run(d) for d in run_dirs]
    virtual = [r.path for r in runs if r.clock != "wall"]
    if virtual:
        raise ConfigError(f"{', '.join(virtual)}: not timed by a machine (a virtual-clock "
                          "run's spans are its profile's prices): give live runs")
    if len({r.cpu for r in runs}) > 1:
        raise ConfigError("the runs ran on different CPUs ("
                          + "; ".join(sorted({f'{r.path}: {r.cpu}' for r in runs}))
                          + "): a profile belongs to one host; fit each host's runs apart")
    threaded = [r for r in runs if r.mode == "async"]
    pricing = [r for r in runs if r.mode != "async"]
    if not pricing:
        raise ConfigError("every run is of the threaded baseline (mode async), whose spans "
                          "hold waits for the interpreter lock: add a sync or areal run to "
                          "price the work")
    fit = fit_spans([sp for r in pricing for sp in r.spans])
    drifted = fit_drift([sr for r in pricing for sr in residual_series(r.spans, fit)]
                        ) if drift else None
    profile = priced(base, fit, drifted, name, pricing)
    report = "\n".join(f"  {role:<11} residual {fit.residual[role]:6.1%} over {n} spans"
                       + (f" ({fit.stalls[role]} left out as stalls)" if fit.stalls[role]
                          else "")
                       for role, n in fit.spans.items())
    report += (f"\n  slowdown    {fit.slowdown:.2f} while rollout and trainer compute at once"
               + (f"\n  drift       sd {drifted.sd:.3f} of log speed, correlation time "
                  f"{drifted.time_s:.3f} s ({drifted.share:.0%} of the residual variance of "
                  f"{drifted.spans} rollout and trainer spans)" if drifted is not None else "")
               + "\n  prices      " + ", ".join(f"{k} {v:.3g}" for k, v in fit.prices.items()))
    if threaded:
        gil = fit_interpreter(profile, threaded)
        profile = dataclasses.replace(
            with_gil_share(profile, gil.share),
            source=f"{profile.source}; interpreter-lock share of {', '.join(GIL_SECTIONS)} "
                   f"planned against {', '.join(r.path for r in threaded)}")
        report += (f"\n  interpreter {gil.share:.2f} of {', '.join(GIL_SECTIONS)}; planned "
                   "updates/s against live: "
                   + ", ".join(f"{e:+.1%} ({p})" for p, e in gil.error.items()))
    return profile, report
