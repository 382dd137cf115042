"""Length bias of dropping stale samples: counts and rates per response length, checked by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlcore.analysis.figures.length_bias import (
    draw_length_bias,
    length_counts,
    length_rates,
    runs_by_k,
    runs_length_counts,
)


def row(tokens: int, status: str = "accepted", attempt: int = 0) -> dict[str, Any]:
    """The samples.jsonl fields the length-bias counts read."""
    return {"response_tokens": tokens, "status": status, "attempt": attempt}


ROWS = [
    # length 2: two plain accepts, one stale drop, one accept after an interrupted attempt
    row(2), row(2), row(2, "dropped_stale"), row(2, attempt=1),
    # length 3: cut after 3 tokens on its last try (no response: not on the length axis),
    # a restarted slot that then went stale, a plain accept
    row(3, "dropped_interrupted", attempt=2), row(3, "dropped_stale", attempt=1), row(3),
    # length 5: one plain accept
    row(5),
]


def write_run(run_dir: Path, rows: list[dict[str, Any]], **config: Any) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if config:
        (run_dir / "config.json").write_text(json.dumps({"config": config}))
    return run_dir


def test_length_counts_by_hand():
    assert length_counts(ROWS) == {
        2: {"rows": 4, "dropped_stale": 1, "restarted": 1},
        3: {"rows": 2, "dropped_stale": 1, "restarted": 1},
        5: {"rows": 1, "dropped_stale": 0, "restarted": 0},
    }
    assert list(length_counts(reversed(ROWS))) == [2, 3, 5]  # sorted by length


def test_length_rates_by_hand():
    rates = length_rates(length_counts(ROWS))
    assert rates[2] == {"rows": 4, "drop_rate": 1 / 4, "interrupt_rate": 1 / 4}
    # two responses of 3 tokens: the restarted one that went stale, the plain accept
    assert rates[3] == {"rows": 2, "drop_rate": 1 / 2, "interrupt_rate": 1 / 2}
    assert rates[5] == {"rows": 1, "drop_rate": 0.0, "interrupt_rate": 0.0}


def test_a_generation_cut_for_good_has_no_length():
    # three slots dropped as interrupted after 4 tokens: no response of length 4 exists
    assert length_counts([row(4, "dropped_interrupted", attempt=2)] * 3) == {}


def test_length_rates_skips_lengths_without_rows():
    counts = {1: {"rows": 0, "dropped_stale": 0, "restarted": 0}}
    assert length_rates(counts) == {}


def test_runs_length_counts_sums_runs(tmp_path: Path):
    a = write_run(tmp_path / "a", ROWS)
    b = write_run(tmp_path / "b", [row(2, "dropped_stale"), row(6, attempt=1)])
    assert runs_length_counts([a, b]) == {
        2: {"rows": 5, "dropped_stale": 2, "restarted": 1},  # 4 + 1
        3: {"rows": 2, "dropped_stale": 1, "restarted": 1},
        5: {"rows": 1, "dropped_stale": 0, "restarted": 0},
        6: {"rows": 1, "dropped_stale": 0, "restarted": 1},
    }


def test_runs_by_k_keeps_one_mode_preset_and_clock():
    rows = [{"mode": m, "preset": p, "staleness_k": k, "clock": c,
             "run_dir": f"/r/{c}-{m}-{p}-{k}-{i}"}
            for i, (c, m, p, k) in enumerate([
                ("wall", "areal", "paper", 8), ("wall", "areal", "paper", 0),
                ("wall", "areal", "areal_defaults", 0), ("wall", "async", "paper", 0),
                ("wall", "areal", "paper", 0), ("v100", "areal", "paper", 0)])]
    assert runs_by_k(rows, "areal", "paper") == {
        0: [Path("/r/wall-areal-paper-0-1"), Path("/r/wall-areal-paper-0-4")],
        8: [Path("/r/wall-areal-paper-8-0")]}
    assert runs_by_k(rows, "areal", "paper", "v100") == {0: [Path("/r/v100-areal-paper-0-5")]}


def audited(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`rows` with what the prompt audit reads too (the figure's panel of drops by cause):
    groups of four slots, each group's reference answer longer than the last's."""
    return [{**r, "group_id": i // 4, "slot": i, "task_id": f"t{i // 4}",
             "answer_chars": 5 + i // 4, "pass": False,
             "batch_id": 0 if r["status"] == "accepted" else None}
            for i, r in enumerate(rows)]


def test_draw_length_bias_writes_png_and_svg(tmp_path: Path):
    many = [row(2)] * 30 + [row(2, "dropped_stale")] * 10 + [row(3, attempt=1)] * 25
    k0 = write_run(tmp_path / "k0", audited(many))
    k2 = write_run(tmp_path / "k2",
                   audited(many + [row(5, "dropped_interrupted", attempt=2)] * 40))
    png, svg = tmp_path / "length_bias.png", tmp_path / "length_bias.svg"
    draw_length_bias({2: [k2], 0: [k0]}, png, svg, title="length bias")
    assert png.read_bytes().startswith(b"\x89PNG")
    text = svg.read_text()
    assert "<svg" in text and "K=0" in text and "K=2" in text
    assert "K=2, interrupted" in text  # the drops by cause, per third of prompts
    assert png.stat().st_size > 1000
