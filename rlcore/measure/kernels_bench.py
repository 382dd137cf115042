"""`rlcore bench --kernels`: portable against native CPU kernels (`runtime.kernels`,
docs/reproducibility.md), each run in a fresh process since kernels are fixed per process.
Timed on whatever else the machine is doing, so run it alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from rlcore.config.run import Mode
from rlcore.kernels import PORTABLE_ENV
from rlcore.measure.bench import spread

KERNEL_MODES: tuple[Mode, ...] = ("sync", "areal")
KERNELS = ("portable", "native")


def bench_kernels(config: str, overrides: list[str], updates: int, repeats: int
                  ) -> dict[str, Any]:
    """Portable against native kernels (`runtime.kernels`, docs/reproducibility.md): a sync
    and an AReaL-style run of `config`, each in a fresh `rlcore run` process (kernels are
    fixed per process), `repeats` rounds of the four, interleaved; the measured wall time's
    median and spread for each, and portable's median over native's per mode. Native runs
    start without rlcore's kernel variables, so they get the libraries' own choice."""
    native_env = {k: v for k, v in os.environ.items() if k not in PORTABLE_ENV}
    walls: dict[str, list[float]] = {f"{m}/{k}": [] for m in KERNEL_MODES for k in KERNELS}
    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(repeats):
            for name in walls:
                mode, kernels = name.split("/")
                out = Path(tmp) / f"{mode}-{kernels}-{rep}"
                on_policy = ["staleness.staleness_k=0"] if mode == "sync" else []
                sets = [*overrides, *on_policy, f"mode={mode}", f"runtime.kernels={kernels}",
                        f"train.updates={updates}", "runtime.progress_every=0",
                        "runtime.save_policy=false"]
                argv = [sys.executable, "-m", "rlcore", "run", config, "--out", str(out),
                        *(a for o in sets for a in ("--set", o))]
                done = subprocess.run(argv, capture_output=True, text=True,
                                      env=native_env if kernels == "native" else None)
                if done.returncode != 0:
                    raise RuntimeError(f"{' '.join(argv)} failed:\n{done.stderr[-3000:]}")
                s = json.loads((out / "summary.json").read_text())
                env = s["reproducibility"]["environment"]
                walls[name].append(s["time"]["wall_s"])
                runs[name] = {"cpu_capability": env["cpu_capability"],
                              "mkl_cbwr": env["mkl_cbwr"], "cpu": env["cpu"]}
    for name, values in walls.items():
        runs[name]["wall_s"] = spread(values)
    median = {name: runs[name]["wall_s"]["median"] for name in walls}
    return {"updates": updates, "repeats": repeats, "runs": runs,
            "portable_over_native": {m: median[f"{m}/portable"] / median[f"{m}/native"]
                                     for m in KERNEL_MODES}}
