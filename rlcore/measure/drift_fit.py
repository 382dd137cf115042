"""The drift of each role's speed, fitted to live runs' span residuals (`calibrate
--from-runs --drift`).

A span's residual is the log of its seconds over the in-situ fit's prediction
(`in_situ.py::residual_series`); how a worker's residuals correlate with its own later ones
gives the Ornstein-Uhlenbeck drift a profile's `drift` prices (`rlcore/clock/drift.py`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

# The drift's correlation times the fit tries (seconds, 0.01-10, 40 per decade); its
# residual pairs are binned by their distance in time, up to `DRIFT_REACH_S`.
DRIFT_TIMES = tuple(10 ** (k / 40) for k in range(-80, 41))
DRIFT_BIN_S = 0.05
DRIFT_REACH_S = 2.0


@dataclasses.dataclass(frozen=True)
class DriftFit:
    """How each role's speed drifts (`clock/drift.py`): the standard deviation of its log and
    its correlation time, the share of the spans' residual variance it explains, and the
    residuals it was fitted to."""

    sd: float
    time_s: float
    share: float
    spans: int


def fit_drift(series: Sequence[Sequence[tuple[float, float]]],
              times: Sequence[float] = DRIFT_TIMES) -> DriftFit | None:
    """The Ornstein-Uhlenbeck drift that best explains how the residuals of each series
    (time, log residual) correlate with those of the same series `dt` later: their
    correlation, pooled in bins of `dt`, is fitted as w exp(-dt / time_s) by least squares
    weighted by pairs; sd = sqrt(w) of the residuals' standard deviation (the rest, 1 - w, is
    noise of single spans). Each series is centred on its own mean first: a run's mean speed
    is its prices' business. None when fewer than two residuals in all."""
    centred = [(np.array([t for t, _ in sr]), np.array([r for _, r in sr]))
               for sr in series if len(sr) > 1]
    centred = [(t, r - r.mean()) for t, r in centred]
    n = sum(len(r) for _, r in centred)
    if n < 2:
        return None
    var = float(sum(np.sum(r * r) for _, r in centred) / n)
    bins = int(DRIFT_REACH_S / DRIFT_BIN_S)
    prod, gap, count = np.zeros(bins), np.zeros(bins), np.zeros(bins)
    for t, r in centred:
        for lag in range(1, len(t)):
            dt = t[lag:] - t[:-lag]
            near = dt < DRIFT_REACH_S
            if not near.any():
                break
            b = (dt[near] / DRIFT_BIN_S).astype(int)
            prod += np.bincount(b, (r[lag:] * r[:-lag])[near], bins)
            gap += np.bincount(b, dt[near], bins)
            count += np.bincount(b, minlength=bins)
    seen = count > 0
    if var <= 0 or not seen.any():
        return DriftFit(0.0, times[0], 0.0, n)
    rho, dt, weight = prod[seen] / count[seen] / var, gap[seen] / count[seen], count[seen]
    best: tuple[float, float, float] | None = None
    for tau in times:
        e = np.exp(-dt / tau)
        w = float(np.clip(np.sum(weight * rho * e) / np.sum(weight * e * e), 0.0, 1.0))
        err = float(np.sum(weight * (rho - w * e) ** 2))
        if best is None or err < best[0] - 1e-15:
            best = (err, tau, w)
    assert best is not None
    _, tau, w = best
    return DriftFit(float(np.sqrt(w * var)), float(tau), w, n)
