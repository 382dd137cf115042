"""The drift of a role's speed (`rlcore/clock/drift.py`): its process by hand, the virtual
clock applying it, its profile section, and its fit from span residuals (`in_situ.py`)."""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from pathlib import Path

import pytest
import yaml

from rlcore.clock.drift import Drift, ou_step, slowness
from rlcore.clock.profile import HARDWARE_DIR, DriftCost, load_profile
from rlcore.clock.virtual import VirtualClock
from rlcore.clock.work import Update
from rlcore.config import ConfigError
from rlcore.measure.drift_fit import fit_drift
from rlcore.measure.in_situ import InSituFit, Span, residual_series
from tests.test_virtual_clock import SECONDS, run_roles


class TestProcess:
    def test_ou_step_by_hand(self):
        # after ln 2 correlation times half of x is kept; the fresh part has sd 0.2 sqrt(3/4)
        x = ou_step(0.5, math.log(2) * 0.3, sd=0.2, time_s=0.3, z=1.0)
        assert x == pytest.approx(0.25 + 0.2 * math.sqrt(0.75))
        assert ou_step(0.5, 0.0, sd=0.2, time_s=0.3, z=3.0) == 0.5  # no time, no change
        assert ou_step(0.5, 1e3, sd=0.2, time_s=0.3, z=-1.0) == pytest.approx(-0.2)

    def test_slowness_by_hand(self):
        assert slowness(0.0, 0.2) == pytest.approx(math.exp(0.02))
        assert slowness(0.1, 0.0) == pytest.approx(math.exp(0.1))

    def test_a_roles_path_is_its_seeds_and_names(self):
        def path(seed: int, role: str) -> list[float]:
            d = Drift(0.3, 0.5, seed, role)
            return [d.factor(t / 10) for t in range(50)]

        assert path(1, "rollout0") == path(1, "rollout0")
        assert path(1, "rollout0") != path(2, "rollout0")
        assert path(1, "rollout0") != path(1, "trainer0")

    def test_far_apart_draws_have_the_stationary_spread_and_speed_one(self):
        d = Drift(0.5, 0.1, seed=7, role="trainer0")
        factors = [d.factor(float(t)) for t in range(20000)]  # 10 correlation times apart
        # the speed averages 1 at fixed instants; the factor itself exp(0.5^2)
        assert statistics.fmean(1 / f for f in factors) == pytest.approx(1.0, abs=0.02)
        assert statistics.fmean(factors) == pytest.approx(math.exp(0.25), abs=0.03)
        assert statistics.pstdev(math.log(f) for f in factors) == pytest.approx(0.5, abs=0.02)

    def test_close_draws_stay_close(self):
        d = Drift(0.5, 10.0, seed=7, role="trainer0")
        logs = [math.log(d.factor(t / 1000)) for t in range(1000)]  # 1 ms apart, tau 10 s
        assert max(abs(a - b) for a, b in zip(logs, logs[1:], strict=False)) < 0.05


def drifting(sd: float, time_s: float):
    return dataclasses.replace(SECONDS, drift=DriftCost(sd=sd, time_s=time_s))


def update_ends(clock: VirtualClock, n: int) -> list[float]:
    """The times at which one role's n updates of 1 s each end."""
    ends: list[float] = []

    def role() -> None:
        for _ in range(n):
            clock.charge(Update(tokens=1))
            ends.append(clock.now())

    run_roles(clock, {"trainer0": role})
    return ends


class TestClock:
    def test_without_drift_a_price_is_exact(self):
        assert update_ends(VirtualClock(SECONDS, seed=3), 3) == [1.0, 2.0, 3.0]

    def test_drift_spreads_each_price_and_keeps_the_throughput(self):
        # 1 s updates under a drift of 5 s: a role kept busy still does one a second
        ends = update_ends(VirtualClock(drifting(0.3, 5.0), seed=3), 5000)
        took = [b - a for a, b in zip([0.0, *ends], ends, strict=False)]
        assert min(took) < 0.8 and max(took) > 1.25
        assert ends[-1] / 5000 == pytest.approx(1.0, abs=0.03)
        # a slow update tends to follow a slow one: about 1 s apart, exp(-1/5)
        logs = [math.log(t) for t in took]
        assert statistics.correlation(logs[:-1], logs[1:]) == pytest.approx(
            math.exp(-0.2), abs=0.1)

    def test_a_drifting_run_is_a_function_of_its_seed(self):
        def ends(seed: int) -> list[float]:
            return update_ends(VirtualClock(drifting(0.3, 2.0), seed=seed), 20)

        assert ends(1) == ends(1) and ends(1) != ends(2)


class TestProfile:
    def test_drift_is_optional_and_enters_the_digest_only_when_given(self, tmp_path: Path):
        data = yaml.safe_load((HARDWARE_DIR / "cpu-2core.yaml").read_text())
        assert "drift" not in data
        plain = load_profile("cpu-2core")
        assert plain.drift is None
        data["drift"] = {"sd": 0.16, "time_s": 0.5}
        (tmp_path / "d.yaml").write_text(yaml.safe_dump(data))
        drifting_profile = load_profile(str(tmp_path / "d.yaml"))
        assert drifting_profile.drift == DriftCost(sd=0.16, time_s=0.5)
        assert drifting_profile.digest() != plain.digest()
        data["drift"] = None
        (tmp_path / "n.yaml").write_text(yaml.safe_dump(data))
        assert load_profile(str(tmp_path / "n.yaml")).digest() == plain.digest()

    def test_a_bad_drift_names_its_key(self, tmp_path: Path):
        data = yaml.safe_load((HARDWARE_DIR / "cpu-2core.yaml").read_text())
        for drift, key in (({"sd": -0.1, "time_s": 1}, "drift.sd"),
                           ({"sd": 0.1, "time_s": 0}, "drift.time_s")):
            data["drift"] = drift
            (tmp_path / "bad.yaml").write_text(yaml.safe_dump(data))
            with pytest.raises(ConfigError, match="bad.yaml") as e:
                load_profile(str(tmp_path / "bad.yaml"))
            assert key in str(e.value)


def ou_series(sd: float, tau: float, noise: float, seed: int, every_s: float = 0.02,
              length_s: float = 12.0) -> list[tuple[float, float]]:
    """Log residuals of spans every `every_s`: an OU path plus independent noise."""
    rng = random.Random(seed)
    x, out = rng.gauss(0, sd), []
    for i in range(int(length_s / every_s)):
        x = ou_step(x, every_s, sd, tau, rng.gauss(0, 1))
        out.append((i * every_s, x + rng.gauss(0, noise) + 0.3))  # + a run's own offset
    return out


class TestFit:
    def test_the_fit_finds_a_known_drift_again(self):
        fit = fit_drift([ou_series(0.2, 0.3, 0.1, seed) for seed in range(8)])
        assert fit is not None and fit.spans == 8 * 600
        assert fit.sd == pytest.approx(0.2, rel=0.15)
        assert fit.time_s == pytest.approx(0.3, rel=0.3)
        assert fit.share == pytest.approx(0.04 / 0.05, abs=0.1)  # 0.2^2 of 0.2^2 + 0.1^2

    def test_noise_without_memory_is_no_drift(self):
        rng = random.Random(0)
        series = [[(i * 0.02, rng.gauss(0, 0.2)) for i in range(600)] for _ in range(4)]
        fit = fit_drift(series)
        assert fit is not None and fit.sd < 0.05

    def test_too_little_is_no_fit(self):
        assert fit_drift([]) is None and fit_drift([[(0.0, 0.1)]]) is None

    def test_residuals_are_per_worker_in_time_order_without_stalls(self):
        fit = InSituFit({"update.call_s": 0.5}, 0.0, {}, {}, {})
        spans = [Span("trainer", 0.5 * math.e, 0.0, {"update.call_s": 1}, "trainer0", 2.0),
                 Span("trainer", 0.5, 0.0, {"update.call_s": 1}, "trainer0", 1.0),
                 Span("trainer", 5.0, 0.0, {"update.call_s": 1}, "trainer0", 3.0),  # stall
                 Span("weight_write", 0.1, 0.0, {"weight_write.call_s": 1}, "trainer0", 1.0)]
        assert residual_series(spans, fit) == [[(1.0, 0.0), (2.0, pytest.approx(1.0))]]
