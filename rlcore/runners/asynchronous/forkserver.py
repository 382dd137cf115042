"""The AReaL-style workers' process factory: a fork server that has imported torch once.

Spawning three workers meant three interpreters importing torch and transformers at once,
about 5 s of a 2-core machine per run. Workers are forked instead from one server process
that imported the worker modules before any of them started, and that has run no torch
code, so each worker still builds its own threads and CUDA context. `rlcore run` starts the
server first thing, so its imports overlap the CLI's own. Nothing here imports torch.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
from multiprocessing.context import ForkServerContext

# What every worker imports; the server imports it once, before the first fork.
WORKER_MODULES = [
    "rlcore.runners.asynchronous.forkserver_init",  # first: before the long imports
    "rlcore.runners.asynchronous.vehicles",
    "rlcore.runners.asynchronous.rollout",
    "rlcore.runners.asynchronous.trainer",
    "rlcore.runners.asynchronous.param_service",
]


def context() -> ForkServerContext:
    """The `forkserver` context, its server started (once per process) with the workers'
    modules preloaded."""
    ctx = multiprocessing.get_context("forkserver")
    assert isinstance(ctx, ForkServerContext)
    ctx.set_forkserver_preload(WORKER_MODULES)
    multiprocessing.forkserver.ensure_running()
    return ctx
