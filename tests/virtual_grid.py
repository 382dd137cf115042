"""The default grid's deterministic records, digested: every virtual-clock run and every
replay of one, from a `make run`, for a change that must not change results to check itself
against (`make check-virtual`; docs/reproducibility.md).

  python -m tests.virtual_grid take RESULTS     write tests/golden/virtual_grid.json from a
                                                finished `make run`'s results directory
  python -m tests.virtual_grid check [RESULTS]  run only those runs and replays with
                                                Snakemake into RESULTS (default: a fresh
                                                temporary directory) and compare

A virtual run's records are digested whole: its times are the virtual clock's, part of the
result. A replay computes on this machine's clock, so its rows are digested without their
timing fields (as tests/golden.py does). Each final policy's weights are digested whole, and
each held-out evaluation without its seconds. The list holds on any x86-64 host with the
lock's packages (portable kernels); it is retaken, like tests/golden/, only in a commit of its
own whose message says why the results were meant to change.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from rlcore.record.rundir import read_jsonl

ROOT = Path(__file__).resolve().parent.parent
LIST = Path(__file__).parent / "golden" / "virtual_grid.json"
CONFIG = "config/config.yaml"


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _untimed_rows(path: Path) -> str:
    rows = [{k: v for k, v in row.items() if not k.startswith(("t_", "time/"))}
            for row in read_jsonl(path)]
    return _sha("\n".join(json.dumps(r, sort_keys=True) for r in rows).encode())


def _eval_digest(path: Path) -> str:
    # its seconds, and where it found the policy, are not results
    scores = {k: v for k, v in json.loads(path.read_text()).items()
              if not k.endswith("_s") and k != "model_path"}
    return _sha(json.dumps(scores, sort_keys=True).encode())


def _is_virtual(run_dir: Path) -> bool:
    return json.loads((run_dir / "summary.json").read_text())["clock"]["kind"] == "virtual"


def deterministic_dirs(results: Path) -> dict[str, Path]:
    """The virtual runs and the replays of virtual runs under `results`, by their path
    relative to it."""
    found = {}
    for summary in sorted(results.glob("runs/**/summary.json")):
        if _is_virtual(summary.parent):
            found[str(summary.parent.relative_to(results))] = summary.parent
    for summary in sorted(results.glob("replays/**/summary.json")):
        source = Path(json.loads(summary.read_text())["reproducibility"]["replay"]["of"])
        source = source if source.is_absolute() else results.parent / source
        if _is_virtual(source):
            found[str(summary.parent.relative_to(results))] = summary.parent
    return found


def digests(results: Path) -> dict[str, dict[str, str]]:
    """Each deterministic directory's records, final weights and evaluation, digested."""
    out = {}
    for name, d in deterministic_dirs(results).items():
        records = (lambda p: _sha(p.read_bytes())) if _is_virtual(d) else _untimed_rows
        out[name] = {"samples.jsonl": records(d / "samples.jsonl"),
                     "updates.jsonl": records(d / "updates.jsonl"),
                     "policy/model.safetensors": _sha((d / "policy" / "model.safetensors")
                                                      .read_bytes()),
                     "eval.json": _eval_digest(d / "eval.json")}
    return out


def take(results: Path) -> None:
    """Write LIST from a finished `make run`'s results directory."""
    from rlcore.kernels import cpu_name

    found = digests(results)
    if not found:
        raise SystemExit(f"no virtual run under {results}: run `make run` first")
    LIST.write_text(json.dumps({"taken_on": cpu_name(), "config": CONFIG, "runs": found},
                               indent=2) + "\n")
    print(f"{LIST}: {len(found)} runs and replays")


def check(results: Path) -> int:
    """Run LIST's runs and replays into `results` with Snakemake and compare; 0 when every
    digest holds, else 1, naming what differs."""
    listed: dict[str, Any] = json.loads(LIST.read_text())["runs"]
    targets = [str(results / name / "summary.json") for name in listed]
    subprocess.run(["snakemake", "--profile", "workflow/profiles/default", "--configfile",
                    CONFIG, "--replace-workflow-config", "--config", f"results={results}",
                    "--", *targets], cwd=ROOT, check=True)
    found = digests(results)
    differ = {name: [f for f, digest in files.items() if found.get(name, {}).get(f) != digest]
              for name, files in listed.items()}
    differ = {name: files for name, files in differ.items() if files}
    for name, files in differ.items():
        print(f"differs: {name}: {', '.join(files)}")
    print(f"{len(listed) - len(differ)} of {len(listed)} runs and replays reproduce "
          f"{LIST.relative_to(ROOT)}")
    return 1 if differ else 0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.virtual_grid", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=("take", "check"))
    p.add_argument("results", nargs="?", type=Path)
    args = p.parse_args(argv)
    if args.action == "take":
        if args.results is None:
            p.error("take needs the results directory of a finished make run")
        take(args.results.resolve())
        return 0
    if args.results is not None:
        return check(args.results.resolve())
    with tempfile.TemporaryDirectory(prefix="virtual-grid-") as tmp:
        return check(Path(tmp) / "results")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
