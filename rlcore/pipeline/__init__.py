"""The pipeline config in Python: the grid it asks for, and its checks, with no Snakemake.

  grid.py    grid points, replays and each run's settings (the Snakefile's wildcards)
  checks.py  every check beyond the schema, in one call that starts no process

The Snakefile (`workflow/rules/common.smk`) formats these points into paths; no run, replay
or analysis job imports this package (`rlcore/code_digest.py`).
"""
