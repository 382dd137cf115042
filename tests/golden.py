"""Golden digests: what a CPU run on portable kernels must reproduce bit for bit on any
x86-64 host (`runtime.kernels`, docs/reproducibility.md).

Four artefacts: config/config.yaml's base model (its model and task, with fewer warm-start
steps: the same code at a tenth of the time); and, on the test suite's small model
(tests/conftest.py: arithmetic, so that 40 updates already earn rewards and train), a
40-update sync run, a 40-update AReaL-style run of the paper's preset at K = 1 on the
emulated 2x V100 clock (with stale and interrupted drops), and that run replayed under the
decoupled objective. A run is digested as its records projected on the fields below (timing
left out) and its final state's digest.

They hold for the package versions of requirements.lock, which `make setup` installs: a lock
bump or a change meant to change results retakes them with `python -m tests.golden`, in a
commit of its own whose message says why; nothing else may touch tests/golden/.
"""

from __future__ import annotations

import hashlib
import json
import platform
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

from rlcore.config import RunConfig, config_from_dict
from rlcore.config.files import read_config_file
from rlcore.config.load import apply_overrides
from rlcore.kernels import cpu_name, in_force
from rlcore.record.rundir import read_jsonl
from tests.conftest import small_config

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "config" / "config.yaml"
LOCK = ROOT / "requirements.lock"
GOLDEN = Path(__file__).parent / "golden" / "digests.json"
PACKAGES = ("torch", "transformers", "tokenizers", "numpy")
WARM_START_STEPS = 200
UPDATES = 40
PAPER_VIRTUAL = ("mode=areal", "staleness.staleness_k=1", "staleness.staleness_control=filter",
                 "staleness.interrupt=resubmit", "runtime.clock=virtual",
                 "runtime.hardware=v100x2-qwen0.5b-fp16")
REPLAYED = ("train.objective=decoupled",)

SAMPLE_FIELDS = ("sample_id", "task_id", "group_id", "policy_version", "policy_version_max",
                 "current_version", "staleness", "status", "reward", "pass", "response",
                 "response_tokens", "finished", "logprob_sum")
UPDATE_FIELDS = ("version", "batch_id", "sample_ids", "reward_mean", "pass_rate",
                 "staleness_mean", "staleness_max", "tokens", "loss", "grad_norm",
                 "loss/clip_frac", "loss/imp_weight_mean", "loss/imp_weight_max", "loss/kl",
                 "policy/entropy")


def locked_versions() -> dict[str, str]:
    """The versions requirements.lock pins for the numeric packages."""
    pins = dict(line.split("==", 1) for line in LOCK.read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    return {pkg: pins[pkg].strip() for pkg in PACKAGES}


def installed_versions() -> dict[str, str]:
    """The installed versions, torch's build tag (+cpu, +cu126) dropped as the lock does."""
    return {pkg: metadata.version(pkg).split("+")[0] for pkg in PACKAGES}


def file_digest(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def projected_digest(path: Path, fields: tuple[str, ...]) -> str:
    """sha256 of the file's rows projected on `fields`, in that order: every bit of each
    value, so a last-bit change anywhere shows."""
    digest = hashlib.sha256()
    for row in read_jsonl(path):
        digest.update(json.dumps([row[f] for f in fields]).encode() + b"\n")
    return "sha256:" + digest.hexdigest()


def run_digests(run_dir: Path) -> dict[str, str]:
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"samples.jsonl": projected_digest(run_dir / "samples.jsonl", SAMPLE_FIELDS),
            "updates.jsonl": projected_digest(run_dir / "updates.jsonl", UPDATE_FIELDS),
            "state": summary["reproducibility"]["state_digest"]}


def base_config() -> RunConfig:
    """config/config.yaml's run settings, with WARM_START_STEPS warm-start steps."""
    data = read_config_file(CONFIG)
    return config_from_dict(apply_overrides(data, [f"base.warm_start_steps={WARM_START_STEPS}"]))


def run_config(model: Path, *overrides: str) -> RunConfig:
    """The test suite's small config on `model`, UPDATES updates, with `overrides`."""
    data = small_config(model, train={"updates": UPDATES})
    return config_from_dict(apply_overrides(data, list(overrides)))


def take(work: Path, small_model: Path | None = None) -> dict[str, Any]:
    """Build, run and replay into `work` (on `small_model` when given, else one built as
    the test suite's); the digests, and each run's sample counts by status."""
    from rlcore.policy.tiny import build_base
    from rlcore.replay.replayer import replay_run
    from rlcore.runners import run_mode

    build_base(work / "base", base_config())
    out: dict[str, Any] = {"base/model.safetensors": file_digest(work / "base" /
                                                                 "model.safetensors")}
    if small_model is None:
        small_model = work / "small"
        build_base(small_model, config_from_dict(small_config("unused")))
    statuses: dict[str, dict[str, int]] = {}
    for name, step in (("sync", ("mode=sync",)), ("areal-paper-k1-virtual", PAPER_VIRTUAL),
                       ("areal-paper-k1-virtual-replay-decoupled", REPLAYED)):
        if step is REPLAYED:
            replay_run(work / "areal-paper-k1-virtual", work / name, list(step))
        else:
            run_mode(run_config(small_model, *step), work / name)
        for key, value in run_digests(work / name).items():
            out[f"{name}/{key}"] = value
        column = [r["status"] for r in read_jsonl(work / name / "samples.jsonl")]
        statuses[name] = {s: column.count(s) for s in sorted(set(column))}
    return {"digests": out, "statuses": statuses}


def retake() -> None:
    """Write tests/golden/digests.json from this code on this host."""
    from rlcore.kernels import pin

    pin(base_config())
    with tempfile.TemporaryDirectory() as tmp:
        taken = take(Path(tmp))
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps({
        "versions": installed_versions(),
        "taken_on": {"cpu": cpu_name(), "machine": platform.machine(), "kernels": in_force()},
        **taken,
    }, indent=2) + "\n")
    print(f"{GOLDEN}:\n{json.dumps(taken, indent=2)}")


if __name__ == "__main__":
    retake()
