"""A seeded sync run's records do not change unless sampling itself is meant to change.

Two checks. Two seeded sync runs of the same code must produce the same records, timing
aside (this holds on any machine). And a run's records must match a stored digest
(tests/data/sync_records_digest.json), which catches an unintended change to sampling or
training from one commit to the next, as comparing two runs of one commit cannot. The digest
is a function of the code only on one platform: a last-bit change in the logits (another
torch, transformers or tokenizers, another CPU instruction set) flips sampled tokens. So the
file stores the platform it was taken on, and elsewhere that check is skipped, saying why.

History of the stored digest. It was first taken from the code before the run ledger existed
(commit 7bb57f7), to show that the ledger refactor changed no value. It was retaken, on
purpose, when sampling randomness became a pure function of (seed, slot, attempt, token
position) for schedule replay (a173048): that draws different tokens. Both were taken on
torch 2.13.0 (CPU) with transformers and tokenizers versions that were not recorded (nothing
but torch was pinned then). It was retaken on 2026-11-24, with its platform stored beside
it, because the versions requirements.lock installs (transformers 5.24.0, tokenizers 0.23.3)
no longer reproduced it: the code of a173048 gives the same new digest on them as the code of
that day, so the change came from the platform, not from the code.

The projection keeps exactly the fields that samples.jsonl and updates.jsonl had at 7bb57f7,
minus timing fields (t_*, time/*); new fields may be added, but no old field may change.
Floats are rounded to 6 decimals so that the digest is not hostage to the last bit of a
summation order. Retake it on purpose only: `python -m tests.test_record_digest`.
"""

from __future__ import annotations

import hashlib
import json
import platform
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import torch

from rlcore.config import config_from_dict
from rlcore.record.rundir import read_jsonl
from rlcore.runners.sync import sync_train
from tests.conftest import small_config

DIGEST = Path(__file__).parent / "data" / "sync_records_digest.json"

SAMPLE_FIELDS = ("sample_id", "task_id", "group_id", "policy_version", "policy_version_max",
                 "current_version", "staleness", "status", "reward", "pass", "response",
                 "response_tokens", "finished", "logprob_sum")
UPDATE_FIELDS = ("version", "batch_id", "sample_ids", "reward_mean", "pass_rate",
                 "staleness_mean", "staleness_max", "tokens", "loss", "grad_norm",
                 "loss/clip_frac", "loss/imp_weight_mean", "loss/imp_weight_max", "loss/kl",
                 "policy/entropy")
UPDATES = 6


def this_platform() -> dict[str, str]:
    """What decides the last bits of the logits, besides the code: the versions of the
    numeric packages (torch with its build tag), the architecture, and the instruction set
    torch's CPU kernels use here."""
    return {**{pkg: metadata.version(pkg) for pkg in ("torch", "transformers", "tokenizers")},
            "machine": platform.machine(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def projected_digest(path: Path, fields: tuple[str, ...]) -> str:
    """sha256 of the file's rows projected on `fields` (in that order), floats rounded."""
    digest = hashlib.sha256()
    for line in path.read_text().splitlines():
        row = json.loads(line)
        digest.update(json.dumps([_rounded(row[f]) for f in fields]).encode() + b"\n")
    return digest.hexdigest()


def digests(run_dir: Path) -> dict[str, str]:
    return {"samples.jsonl": projected_digest(run_dir / "samples.jsonl", SAMPLE_FIELDS),
            "updates.jsonl": projected_digest(run_dir / "updates.jsonl", UPDATE_FIELDS)}


def seeded_run(model_dir: Path, out: Path) -> Path:
    sync_train(config_from_dict(small_config(model_dir, train={"updates": UPDATES})), out)
    return out


def untimed(path: Path) -> list[dict[str, Any]]:
    """A record file's rows without what the clock decides."""
    return [{k: v for k, v in row.items() if not k.startswith(("t_", "time/"))}
            for row in read_jsonl(path)]


def test_two_seeded_sync_runs_record_the_same(tiny_model_dir: Path, tmp_path: Path):
    a = seeded_run(tiny_model_dir, tmp_path / "a")
    b = seeded_run(tiny_model_dir, tmp_path / "b")
    for name in ("samples.jsonl", "updates.jsonl"):
        rows = untimed(a / name)
        assert rows and rows == untimed(b / name), name
    assert digests(a) == digests(b)


def test_sync_records_match_the_stored_digest(tiny_model_dir: Path, tmp_path: Path):
    stored = json.loads(DIGEST.read_text())
    here = this_platform()
    if here != stored["platform"]:
        differ = ", ".join(f"{k} {stored['platform'].get(k)} there, {v} here"
                           for k, v in here.items() if stored["platform"].get(k) != v)
        pytest.skip(f"the stored digest was taken on another platform ({differ}); sampled "
                    "tokens follow the last bits of the logits, so it holds only there")
    assert digests(seeded_run(tiny_model_dir, tmp_path / "run")) == stored["digests"]


def retake() -> None:
    """Write the digest of this code on this platform (the fixture's model, one thread)."""
    from rlcore.policy.tiny import build_base

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "tiny"
        build_base(model, config_from_dict(small_config("unused")))
        taken = digests(seeded_run(model, Path(tmp) / "run"))
    DIGEST.write_text(json.dumps({"platform": this_platform(), "digests": taken}, indent=2)
                      + "\n")
    print(f"{DIGEST}: {taken}")


if __name__ == "__main__":
    retake()
