"""Snakemake as the tests start it: the documented invocation pointed at a working
directory, and a config written where the Snakefile reads it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PROFILE = ROOT / "workflow" / "profiles" / "default"
# The jobs' warm launcher server (docs/launcher.md) outlives the tests by 30 s, not 5 min.
ENV = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
       "RLCORE_LAUNCHER_IDLE_S": "30"}


def snakemake_cmd(workdir: Path, *args: str) -> list[str]:
    """The documented invocation (the default profile), pointed at a working directory."""
    return [str(BIN / "snakemake"), "-s", str(ROOT / "Snakefile"), "--directory", str(workdir),
            "--profile", str(PROFILE), *args]


def snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(snakemake_cmd(workdir, *args), capture_output=True, text=True,
                          env=ENV, timeout=600)


def write_config(workdir: Path, data: dict) -> None:
    (workdir / "config").mkdir(parents=True, exist_ok=True)
    (workdir / "config" / "config.yaml").write_text(yaml.safe_dump(data))
