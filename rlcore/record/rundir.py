"""The run directory on disk, and the rule that a half-written run never looks done.

Layout (docs/metrics.md names every field): samples.jsonl, updates.jsonl, events.jsonl,
schedule.jsonl, staleness.json, config.json, policy/ (final weights) and summary.json.
Updates and events are streamed to `*.partial` while the run goes (sample rows and the
schedule are held by the ledger and written at the end); `finalize` renames them into place
and writes summary.json last, so the presence of summary.json means the run is complete. A
forced rerun over a complete run leaves the old files untouched until the new run has
finished.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import jsonschema

from rlcore.errors import RunExistsError
from rlcore.kernels import cpu, in_force

SUMMARY_SCHEMA = Path(__file__).parent / "schemas" / "summary.schema.json"
STREAMS = ("updates", "events")  # samples are held in memory and written by finalize
PARTIAL = ".partial"


def atomic_write_text(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so readers never see half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def atomic_write_json(path: Path, data: Any) -> None:
    """`atomic_write_text` of indented JSON."""
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a JSON-lines file (samples, updates, events, schedule)."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def is_complete(run_dir: str | Path) -> bool:
    """A run directory is complete once summary.json exists (it is written last)."""
    return (Path(run_dir) / "summary.json").is_file()


def validate_summary(summary: dict[str, Any]) -> None:
    """Check a summary against workflow/schemas/summary.schema.json (raises ValidationError)."""
    jsonschema.validate(summary, json.loads(SUMMARY_SCHEMA.read_text()))


def environment_info(kernels: str) -> dict[str, Any]:
    """Package versions, git commit and machine facts recorded beside the resolved config:
    the CPU, and the kernels and threads this process computed with (`runtime.kernels`)."""
    versions: dict[str, str | None] = {}
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
        "cpu": cpu(),
        "kernels": {"setting": kernels, **in_force()},
        "cuda_devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
    }


class RunDirectory:
    """One run's directory: streams records into it and finalizes it atomically."""

    def __init__(self, out_dir: str | Path, force: bool = False):
        self.path = Path(out_dir)
        if is_complete(self.path) and not force:
            raise RunExistsError(
                f"'{self.path}' already holds a complete run (summary.json); pass --force to "
                "replace it, or choose another --out"
            )
        self.path.mkdir(parents=True, exist_ok=True)
        # Held open for the whole run (closed by close/finalize), hence no context manager.
        # events are line-buffered so that a live run can be watched (and a crash read).
        self._files = {name: open(self.path / f"{name}.jsonl{PARTIAL}", "w",  # noqa: SIM115
                                  buffering=1 if name == "events" else -1)
                       for name in STREAMS}

    def write(self, stream: str, row: dict[str, Any]) -> None:
        """Append one row to a streamed file (`updates` or `events`)."""
        self._files[stream].write(json.dumps(row) + "\n")

    def close(self) -> None:
        for f in self._files.values():
            if not f.closed:
                f.close()

    def finalize(self, summary: dict[str, Any], samples: Sequence[dict[str, Any]],
                 files: dict[str, Any], texts: dict[str, str] | None = None,
                 dirs: tuple[str, ...] = ()) -> None:
        """Validate the summary, then move samples.jsonl, the streams, JSON files, text files
        and staged directories (see `stage_dir`) into place, summary.json last. Nothing old
        is touched before the summary has been validated."""
        validate_summary(summary)
        self.close()
        staged = []
        contents = {name: json.dumps(data, indent=2) + "\n" for name, data in files.items()}
        for name, text in {**contents, **(texts or {})}.items():
            tmp = self.path / f"{name}{PARTIAL}"
            tmp.write_text(text)
            staged.append((tmp, self.path / name))
        # Sample rows are encoded here, off the measured clock: the controller decides
        # thousands per second, and JSON encoding would compete with the workers for cores.
        samples_tmp = self.path / f"samples.jsonl{PARTIAL}"
        with open(samples_tmp, "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in samples)
        staged.append((samples_tmp, self.path / "samples.jsonl"))
        staged += [(self.path / f"{s}.jsonl{PARTIAL}", self.path / f"{s}.jsonl")
                   for s in STREAMS]
        # An older complete run stops looking complete before any of its files is replaced.
        (self.path / "summary.json").unlink(missing_ok=True)
        for name in dirs:
            shutil.rmtree(self.path / name, ignore_errors=True)
            os.replace(self.path / f"{name}{PARTIAL}", self.path / name)
        for src, dst in staged:
            os.replace(src, dst)
        atomic_write_json(self.path / "summary.json", summary)

    def stage_dir(self, name: str) -> Path:
        """A directory written during the run, moved into place by `finalize(dirs=...)`."""
        path = self.path / f"{name}{PARTIAL}"
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir()
        return path
