"""The emulator's validation split: disjoint fitting and held-out configs, checked on load."""

from pathlib import Path

import pytest

from rlcore.errors import ConfigError
from rlcore.measure.fidelity import load_split

ROOT = Path(__file__).resolve().parents[1]


def test_the_shipped_split_spans_what_the_issue_asks_and_holds_out_the_rest(monkeypatch):
    monkeypatch.chdir(ROOT)
    split = load_split("config/fidelity.yaml")
    held = [cfg for _, cfg in split.configs("heldout")]
    assert len(held) >= 12
    assert {c.mode for c in held} >= {"async", "areal"}
    assert {c.staleness.staleness_k for c in held} >= {0, 1, 2, 4, 8}
    assert {c.staleness.interrupt for c in held} >= {"resubmit", "continue", "keep_kv"}
    fit = [cfg for _, cfg in split.configs("fit")]
    for size in (lambda c: c.train.update_batch_size, lambda c: c.rollout.group_size,
                 lambda c: c.rollout.max_new_tokens, lambda c: c.rollout.chunk_tokens,
                 lambda c: c.staleness.rollout_train_ratio):
        # each size is varied by some held-out config away from every fitting one
        assert {size(c) for c in held} - {size(c) for c in fit}
    assert not set(split.fit) & set(split.heldout)


def _write(tmp_path: Path, fit: str, heldout: str) -> Path:
    path = tmp_path / "split.yaml"
    path.write_text(f"base: {ROOT / 'config' / 'bench.yaml'}\nupdates: 10\nrepeats: 1\n"
                    f"fit:\n{fit}\nheldout:\n{heldout}\n")
    return path


@pytest.mark.parametrize(("fit", "heldout", "message"), [
    ("  a: [mode=sync]", "  a: [mode=areal]", "a is in both fit and heldout"),
    ("  a: [mode=areal]", "  b: [mode=areal]", "heldout.b is the same config as fit.a"),
    ("  a: [mode=areal]", "  b: mode=areal", "heldout.b must be a list of KEY=VALUE"),
    ("  a: [mode=areal]", "  b: [rollout.nope=1]", r"heldout.b \(.*rollout.nope=1\): .*nope"),
], ids=["same-name", "same-config", "not-a-list", "unknown-key"])
def test_a_split_that_overlaps_or_does_not_load_is_refused(tmp_path, fit, heldout, message):
    with pytest.raises(ConfigError, match=message):
        load_split(_write(tmp_path, fit, heldout))
