"""Time as a run setting: the wall clock, or a virtual clock priced by a hardware profile.

  work.py        what a role computed (a decode chunk, a prefill, an update, a weight
                 copy...)
  profile.py     hardware profiles: the price of each kind of work, from config/hardware/
  clock.py       the `Clock` the roles read and report to; `WallClock`
  virtual.py     `VirtualClock`: the roles taking turns, in virtual time (a discrete-event
                 scheduler), with the queues and flags that wait in it
  processors.py  how fast the computations running at once go on shared processors
  drift.py       how each role's speed drifts about its mean, when a profile has `drift`
"""

from rlcore.clock.clock import WALL, Clock, WallClock, clock_for

__all__ = ["WALL", "Clock", "WallClock", "clock_for"]
