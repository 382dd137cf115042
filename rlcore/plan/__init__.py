"""The capacity planner (`rlcore plan`): a config's schedule on a hardware profile, no model.

  lengths.py  response lengths to draw: empirical (a run's), as recorded, or fitted
  roles.py    the asynchronous roles' twins, which only price what the live roles compute
  planner.py  a plan of a config (async on the virtual clock, sync as a sum), and sweeps
"""
