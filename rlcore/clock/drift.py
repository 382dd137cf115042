"""The drift of a role's speed: a machine is not equally fast from one moment to the next.

Live, the same work takes a different time each time it runs: on the 2-core VM of
docs/virtual_clock.md, a rollout chunk or an update of the same size took 0.6-1.5 times its
median, and a slow span tends to follow a slow span (a role's log duration is correlated
over about half a second). Without it the virtual clock runs like clockwork, and a
bounded-staleness schedule locks into a rhythm no live run has: interrupts fall at the same
place in every batch, and the buffer never surges, so samples never age in it.

A profile's `drift` models it as each role's own log speed following an Ornstein-Uhlenbeck
process x(t) with standard deviation `sd` and correlation time `time_s`; a computation booked
at time t costs its price times exp(x(t) + sd^2 / 2). That is a speed of exp(-x - sd^2 / 2),
whose average over time is 1: a role kept busy does as much work as without drift. Its
spans take their price on average, as a fitted price is the mean span: a role books more
work while it is fast, so the factors of its computations average 1, not those of fixed
instants (exp(sd^2)). Each role draws its path from its own generator, seeded by the run's
seed and the role's name, when it books work, so the run stays a function of its config.
"""

from __future__ import annotations

import math
import random


def ou_step(x: float, dt: float, sd: float, time_s: float, z: float) -> float:
    """x after `dt` seconds of an Ornstein-Uhlenbeck process of stationary standard deviation
    `sd` and correlation time `time_s`, `z` a standard normal draw (exact for any dt)."""
    keep = math.exp(-dt / time_s)
    return x * keep + sd * math.sqrt(1.0 - keep * keep) * z


def slowness(x: float, sd: float) -> float:
    """The factor on a price at deviation x: exp(x + sd^2 / 2), whose inverse, the speed,
    averages 1 over the stationary x ~ N(0, sd^2), so that drift leaves throughput alone."""
    return math.exp(x + sd * sd / 2.0)


class Drift:
    """One role's log speed deviation, sampled when it books work."""

    def __init__(self, sd: float, time_s: float, seed: int, role: str):
        self.sd, self.time_s = sd, time_s
        self._rng = random.Random(f"{seed}/{role}")  # str seeds hash the same everywhere
        self._x = sd * self._rng.gauss(0.0, 1.0)  # a stationary start: no warm-up
        self._t = 0.0

    def factor(self, now: float) -> float:
        """The factor on the price of work booked at virtual time `now` (not before the last)."""
        self._x = ou_step(self._x, now - self._t, self.sd, self.time_s,
                          self._rng.gauss(0.0, 1.0))
        self._t = now
        return slowness(self._x, self.sd)
