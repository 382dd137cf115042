"""The run directory: what a run writes, and the rule that a half-written run never looks done.

Layout (DESIGN.md): samples.jsonl, updates.jsonl, events.jsonl, staleness.json, config.json,
policy/ (final weights) and summary.json. Updates and events are streamed to `*.partial`
while the run goes (sample rows are kept in memory and written at the end); `finalize`
renames them into place and writes summary.json last, so the presence of summary.json means
the run is complete. A forced rerun over a complete run leaves the old
files untouched until the new run has finished.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import jsonschema

SUMMARY_SCHEMA = Path(__file__).parent / "schemas" / "summary.schema.json"
STREAMS = ("updates", "events")  # samples are held in memory and written by finalize
PARTIAL = ".partial"


class RunExistsError(FileExistsError):
    """The output directory already holds a complete run."""


def atomic_write_text(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so readers never see half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def is_complete(run_dir: str | Path) -> bool:
    return (Path(run_dir) / "summary.json").is_file()


def validate_summary(summary: dict[str, Any]) -> None:
    """Check a summary against workflow/schemas/summary.schema.json (raises ValidationError)."""
    jsonschema.validate(summary, json.loads(SUMMARY_SCHEMA.read_text()))


def environment_info() -> dict[str, Any]:
    """Package versions, git commit and machine facts recorded beside the resolved config."""
    versions = {}
    for pkg in ("rlcore", "torch", "transformers", "tokenizers", "numpy"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
            cwd=Path(__file__).resolve().parent,
        ).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    import torch  # local: keep this module importable without torch for analysis scripts

    return {
        "python": sys.version.split()[0],
        "packages": versions,
        "git_commit": commit,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "cuda_devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
    }


class RunRecorder:
    """Streams records of one run into its directory and finalizes it atomically."""

    def __init__(self, out_dir: str | Path, force: bool = False):
        self.dir = Path(out_dir)
        if is_complete(self.dir) and not force:
            raise RunExistsError(
                f"'{self.dir}' already holds a complete run (summary.json); pass --force to "
                "replace it, or choose another --out"
            )
        self.dir.mkdir(parents=True, exist_ok=True)
        self.t0 = time.monotonic()
        self._samples: list[dict[str, Any]] = []
        # Held open for the whole run (closed by close/finalize), hence no context manager.
        # events are line-buffered so that a live run can be watched (and a crash read).
        self._files = {name: open(self.dir / f"{name}.jsonl{PARTIAL}", "w",  # noqa: SIM115
                                  buffering=1 if name == "events" else -1)
                       for name in STREAMS}

    def now(self) -> float:
        """Seconds since the measured clock started (see `start_clock`)."""
        return time.monotonic() - self.t0

    def since_start(self, t: float) -> float:
        """An absolute time.monotonic() reading (from any process) on the run's clock."""
        return t - self.t0

    def start_clock(self, t0: float | None = None) -> None:
        """Start the measured clock (after every worker has loaded its model).

        time.monotonic() is CLOCK_MONOTONIC on Linux, one clock for every process, so worker
        timestamps can be placed on it.
        """
        self.t0 = time.monotonic() if t0 is None else t0

    def _write(self, stream: str, row: dict[str, Any]) -> None:
        f = self._files[stream]
        f.write(json.dumps(row) + "\n")

    def sample(self, row: dict[str, Any]) -> None:
        """Record a sample row; rows are encoded by `finalize`, off the measured clock (the
        controller decides thousands per second, and JSON encoding would compete with the
        workers for the cores)."""
        self._samples.append(row)

    def update(self, row: dict[str, Any]) -> None:
        self._write("updates", row)

    def event(self, kind: str, t: float | None = None, **fields: Any) -> None:
        self._write("events", {"t": self.now() if t is None else t, "type": kind, **fields})

    def close(self) -> None:
        for f in self._files.values():
            if not f.closed:
                f.close()

    def finalize(self, summary: dict[str, Any], files: dict[str, Any],
                 dirs: tuple[str, ...] = ()) -> None:
        """Validate the summary, move streams, JSON files and staged directories (see
        `stage_dir`) into place, summary.json last. Nothing old is touched before the
        summary has been validated."""
        validate_summary(summary)
        self.close()
        staged = []
        for name, data in files.items():
            tmp = self.dir / f"{name}{PARTIAL}"
            tmp.write_text(json.dumps(data, indent=2) + "\n")
            staged.append((tmp, self.dir / name))
        samples_tmp = self.dir / f"samples.jsonl{PARTIAL}"
        with open(samples_tmp, "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in self._samples)
        staged.append((samples_tmp, self.dir / "samples.jsonl"))
        staged += [(self.dir / f"{s}.jsonl{PARTIAL}", self.dir / f"{s}.jsonl") for s in STREAMS]
        # An older complete run stops looking complete before any of its files is replaced.
        (self.dir / "summary.json").unlink(missing_ok=True)
        for name in dirs:
            shutil.rmtree(self.dir / name, ignore_errors=True)
            os.replace(self.dir / f"{name}{PARTIAL}", self.dir / name)
        for src, dst in staged:
            os.replace(src, dst)
        atomic_write_json(self.dir / "summary.json", summary)

    def stage_dir(self, name: str) -> Path:
        """A directory written during the run, moved into place by `finalize(dirs=...)`."""
        path = self.dir / f"{name}{PARTIAL}"
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir()
        return path
