"""A seeded sync run's records do not change unless sampling itself is meant to change.

The digest in tests/data/sync_records_digest.json was first taken from the code before the
run ledger existed (commit 7bb57f7), to show that the ledger refactor changed no value. It
was retaken once, on purpose, when sampling randomness became a pure function of (seed,
slot, attempt, token position) for schedule replay: that draws different tokens. The
projection keeps exactly the fields that samples.jsonl and updates.jsonl had at 7bb57f7,
minus timing fields (t_*, time/*); new fields may be added, but no old field may change.
Floats are rounded to 6 decimals so that the digest is not hostage to the last bit of a
summation order.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from rlcore.config import config_from_dict
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


def test_sync_records_match_the_digest_taken_before_the_ledger(tiny_model_dir: Path,
                                                               tmp_path: Path):
    cfg = config_from_dict(small_config(tiny_model_dir, train={"updates": UPDATES}))
    sync_train(cfg, tmp_path / "run")
    assert digests(tmp_path / "run") == json.loads(DIGEST.read_text())
