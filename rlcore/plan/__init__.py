"""The capacity planner (`rlcore plan`): a config's schedule on a hardware profile, no model.

  lengths.py     response lengths to draw: a run's (per task or pooled), as recorded, fitted
  sampler.py     the rollout's sampler without a model: chunks priced, lengths drawn
  roles.py       the roles on the live ones' loops (the generation loop, `TrainerLoop`), with
                 prices for computations and version numbers for weights
  controller.py  the controller's transport around the live scheduling core, counting
  planner.py     a plan of a config (async on the virtual clock, sync as a sum), and sweeps
  command.py     `rlcore plan`, its command line
"""
