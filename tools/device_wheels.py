"""Download, as wheels into .whl/, what a lent GPU machine lacks to run tools/gpu_check.py
stage 3 (its image has torch, pandas, matplotlib and pytest, but neither Snakemake nor the
lock's transformers): the lock's versions, for CPython 3.12 on manylinux x86-64.

    python tools/device_wheels.py          # then carry .whl (git-ignored) with the call
    # there: python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
    #        && export PYTHONPATH=/tmp/site:$PWD
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# What the image lacks or holds at another version than the lock's that rlcore needs.
NEEDED = [
    "transformers", "tokenizers", "huggingface_hub", "httpx2", "httpcore2", "truststore",
    "jsonschema",
    "jsonschema-specifications", "referencing", "rpds-py", "snakemake",
    "snakemake-interface-common",
    "snakemake-interface-executor-plugins", "snakemake-interface-logger-plugins",
    "snakemake-interface-report-plugins", "snakemake-interface-scheduler-plugins",
    "snakemake-interface-storage-plugins", "argparse-dataclass", "conda-inject",
    "ConfigArgParse", "connection_pool", "docutils", "dpath", "fastjsonschema", "gitdb",
    "GitPython", "humanfriendly", "immutables", "jupyter_core", "nbformat", "platformdirs",
    "PuLP", "smart_open", "smmap", "throttler", "traitlets", "yte", "tenacity",
    "SQLAlchemy", "sqlmodel", "pydantic", "pydantic_core", "annotated-types",
    "typing-inspection", "greenlet", "tzdata",
]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64", "manylinux_2_34_x86_64",
             "manylinux_2_31_x86_64", "manylinux_2_24_x86_64"]


def pins() -> dict[str, str]:
    """Package name (lower case, - for _) -> the lock's version."""
    out = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            out[name.strip().lower().replace("_", "-")] = version.strip()
    return out


def main() -> int:
    locked = pins()
    out = ROOT / ".whl"
    failed = []
    for name in NEEDED:
        want = f"{name}=={locked[name.lower().replace('_', '-')]}"
        got = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
             "--python-version", "3.12", "--implementation", "cp", "-d", str(out),
             *[a for p in PLATFORMS for a in ("--platform", p)], want],
            capture_output=True, text=True)
        if got.returncode:  # published as source only: pure Python, built into a wheel here
            got = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                                  "-w", str(out), want], capture_output=True, text=True)
        if got.returncode:
            failed.append(want)
    for want in failed:
        print(f"device_wheels: no wheel for {want}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
