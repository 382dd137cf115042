"""The data behind the figures, checked against values worked out by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlcore.analysis.figures import learning as learning_figures
from rlcore.analysis.figures import staleness as staleness_figures
from rlcore.analysis.figures import style
from rlcore.analysis.figures import traces as trace_figures


def test_mean_curve_is_pointwise_and_cut_to_the_shortest():
    mean, ci = style.mean_curve([[0.0, 1.0, 0.5], [1.0, 0.0]])
    assert mean == [0.5, 0.5]
    # two values 0 and 1: sd = 0.7071, t(1) = 12.706, half-width = 12.706 * 0.7071 / sqrt(2)
    assert ci == pytest.approx([6.353, 6.353])


def test_runs_sort_sync_then_threaded_then_areal_then_by_preset_and_k():
    keys = [("areal", "paper", 2, "pg"), ("sync", "none", 0, "pg"),
            ("areal", "paper", 0, "pg"), ("async", "areal_defaults", 4, "pg"),
            ("areal", "areal_defaults", 8, "pg")]
    assert sorted(keys, key=style.config_order) == [
        ("sync", "none", 0, "pg"), ("async", "areal_defaults", 4, "pg"),
        ("areal", "areal_defaults", 8, "pg"), ("areal", "paper", 0, "pg"),
        ("areal", "paper", 2, "pg")]
    assert style.config_label("areal", "paper", 2) == "AReaL-style/paper K=2"
    assert style.config_label("sync", "none", 0) == "sync K=0"


def test_an_arm_is_named_in_words():
    assert style.arm_title("areal", "paper", "v100") == \
        "AReaL-style under staleness preset 'paper', virtual clock v100"
    assert style.arm_title("sync", "none", "wall") == "sync under staleness preset 'none'"


def test_one_objective_sets_the_clocks_side_by_side_on_one_y_axis():
    """Panels that share the y axis read best side by side: with one objective, one row."""
    fig, axes = style.objective_axes(["wall", "v100"], ["pg"], sharex="row")
    assert axes.shape == (2, 1)
    wall, v100 = axes[0][0].get_position(), axes[1][0].get_position()
    assert v100.x0 > wall.x1 and wall.y0 == pytest.approx(v100.y0)
    assert axes[0][0].get_shared_y_axes().joined(axes[0][0], axes[1][0])
    assert not axes[0][0].get_shared_x_axes().joined(axes[0][0], axes[1][0])  # own seconds
    fig, axes = style.objective_axes(["wall", "v100"], ["pg", "decoupled"])
    assert axes.shape == (2, 2) and axes[1][0].get_position().y1 < axes[0][0].get_position().y0
    style.plt.close("all")


def test_each_preset_of_a_mode_gets_its_own_shade():
    colors = style.arm_colors([("areal", "paper", 0, "pg"),
                               ("areal", "areal_defaults", 2, "pg"), ("sync", "none", 0, "pg")])
    orange = style.matplotlib.colors.to_rgb(style.MODE_COLOR["areal"])
    assert colors[("areal", "areal_defaults")] == pytest.approx(orange)  # first by name
    # second: 45% darker, each channel times 0.55
    assert colors[("areal", "paper")] == pytest.approx(tuple(c * 0.55 for c in orange))
    assert colors[("sync", "none")] == pytest.approx(
        style.matplotlib.colors.to_rgb(style.MODE_COLOR["sync"]))


def test_staleness_counts_add_up_over_runs(tmp_path: Path):
    for name, per_sample in (("a", {"accepted": {"0": 3, "1": 5}, "dropped_stale": {"3": 1}}),
                             ("b", {"accepted": {"1": 2}, "dropped_stale": {}})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "staleness.json").write_text(json.dumps({"per_sample": per_sample}))
    counts = staleness_figures.staleness_counts([tmp_path / "a", tmp_path / "b"])
    assert counts == {"accepted": {0: 3, 1: 7}, "dropped_stale": {3: 1}}


def test_queue_trace_reads_queue_events_only():
    events = [
        {"t": 0.1, "type": "queues", "prompt_queue": 4, "generating": 2, "sample_queue": 0,
         "ready_buffer": 1, "trainer_queue": 0, "version": 0},
        {"t": 0.2, "type": "version_change", "old_version": 0, "new_version": 1},
        {"t": 0.3, "type": "queues", "prompt_queue": 3, "generating": 1, "sample_queue": 1,
         "ready_buffer": 0, "trainer_queue": 1, "version": 1},
        # a run recorded before the field's rename
        {"t": 0.4, "type": "queues", "prompt_queue": 3, "generating": 1, "sample_queue": 0,
         "replay_buffer": 5, "trainer_queue": 0, "version": 1},
    ]
    trace = trace_figures.queue_trace(events)
    assert trace["t"] == [0.1, 0.3, 0.4]
    assert trace["prompt_queue"] == [4, 3, 3] and trace["trainer_queue"] == [0, 1, 0]
    assert trace["ready_buffer"] == [1, 0, 5]


def test_busy_spans_are_clipped_to_the_window_and_grouped_by_role():
    events = [
        {"type": "span", "worker": "rollout0", "role": "rollout", "start": 0.5, "end": 1.5},
        {"type": "span", "worker": "trainer0", "role": "trainer", "start": 1.2, "end": 1.4},
        {"type": "span", "worker": "trainer0", "role": "trainer", "start": 2.5, "end": 3.0},
        {"type": "span", "worker": "controller", "role": "controller", "start": 1.5,
         "end": 1.6},  # not drawn
        {"type": "queues", "t": 1.1},
    ]
    spans = trace_figures.busy_spans(events, start=1.0, end=2.0)
    assert spans["rollout"] == [(1.0, 0.5)]
    assert spans["trainer"] == [(1.2, pytest.approx(0.2))]


V100 = "v100x2-qwen0.5b-fp16"


def timed_row(clock: str, mode: str, preset: str, k: int, seed: int, seconds: float) -> dict:
    """A run row (`rlcore.analysis.tables.run_row`) with what the bar charts draw."""
    return {"clock": clock, "mode": mode, "preset": preset, "staleness_k": k,
            "objective": "pg", "seed": seed, "threshold": 0.5, "time_to_threshold_s": seconds,
            "reward_per_1k_tokens": 100.0, "wall_s": 2 * seconds, "cold_start_s": 1.0,
            "startup_s": 3.0 if clock == "wall" else None, "updates_per_s": 5.0}


def test_runs_of_each_clock_are_drawn_in_a_panel_of_their_own(tmp_path: Path):
    """Wall-clock runs first, then each virtual clock's; the time figures give each clock a
    panel titled with it, whose axis says which seconds it counts."""
    rows = [timed_row(clock, mode, preset, k, seed, seconds)
            for clock, scale in ((V100, 100.0), ("wall", 1.0))
            for mode, preset, k in (("sync", "none", 0), ("areal", "areal_defaults", 2))
            for seed, seconds in enumerate((1.0 * scale, 2.0 * scale))]
    assert list(style.by_clock(rows)) == ["wall", V100]
    assert all(r["clock"] == V100 for r in style.by_clock(rows)[V100])
    for name, draw in (("time_to_threshold", learning_figures.draw_time_to_threshold),
                       ("end_to_end", learning_figures.draw_end_to_end)):
        png, svg = tmp_path / f"{name}.png", tmp_path / f"{name}.svg"
        draw(rows, png, svg)
        text = svg.read_text()
        assert png.read_bytes()[:4] == b"\x89PNG"
        assert "wall clock (this machine)" in text and f"virtual clock: {V100}" in text, name
        assert f"(virtual: {V100})" in text, name
    # one clock: one panel, no clock titles, as before there were clocks
    learning_figures.draw_time_to_threshold([r for r in rows if r["clock"] == "wall"],
                                            tmp_path / "t.png", tmp_path / "t.svg")
    text = (tmp_path / "t.svg").read_text()
    assert "this machine" not in text and "seconds to train pass ≥ 0.5 (wall clock)" in text


def test_length_stats_by_hand():
    from rlcore.analysis.figures.lengths import length_stats, merge_lengths

    hist = merge_lengths([{"5": 2, "10": 1}, {"10": 3, "40": 4}])
    assert hist == {5: 2, 10: 4, 40: 4}
    s = length_stats(hist)
    # mean (10 + 40 + 160) / 10 = 21; 10 % of 10 is reached at 5, 90 % (9) at 40
    assert (s["n"], s["mean"], s["p10"], s["p90"]) == (10, 21.0, 5, 40)
    assert length_stats({})["n"] == 0


def test_the_forest_plot_puts_each_claim_in_units_of_its_delta(tmp_path: Path):
    from rlcore.analysis.claims import EQUIVALENT, SUPPORTED
    from rlcore.analysis.figures.claims import draw_claims_forest, in_deltas, row_label

    row = {"claim": "C2", "statement": "staleness helps", "clock": "wall", "expect": "positive",
           "effect": 0.01, "ci95_lo": -0.01, "ci95_hi": 0.03, "delta": 0.02,
           "verdict": EQUIVALENT, "basis": "equivalence"}
    assert in_deltas(row) == pytest.approx((0.5, -0.5, 1.5))
    assert row_label(row) == "C2 live: staleness helps"
    virtual = {**row, "claim": "C3", "clock": "v100", "delta": float("nan"),
               "verdict": SUPPORTED}
    assert row_label(virtual) == "C3 on v100: staleness helps"
    assert row_label({**row, "block_by_block": False}) == "C2 live, by block: staleness helps"
    assert row_label({**row, "same_weights": True}) == \
        "C2 live: staleness helps (arms end in the same weights)"
    assert all(x != x for x in in_deltas(virtual))  # nan: no delta, no bar
    draw_claims_forest([row, virtual], tmp_path / "f.png", tmp_path / "f.svg")
    assert (tmp_path / "f.png").stat().st_size > 0 and (tmp_path / "f.svg").is_file()


def test_a_curve_a_later_one_equals_is_named_as_hidden_under_it():
    # the threaded line is drawn first, AReaL-style's equal one over it
    curves = [("sync K=0", [0.1, 0.2]), ("threaded/areal_defaults K=2", [0.2, 0.3]),
              ("AReaL-style/areal_defaults K=2", [0.2, 0.3]), ("other", [0.2, 0.31])]
    assert learning_figures.hidden_under(curves) == [("threaded/areal_defaults K=2",
                                                      "AReaL-style/areal_defaults K=2")]
    assert learning_figures.hidden_under(curves[:2]) == []


def test_sync_is_named_by_its_preset_where_presets_tell_its_arms_apart():
    """config/lora.yaml's ranks are presets of sync: its lines would share one name."""
    one = [("sync", "none", 0, "pg"), ("areal", "paper", 2, "pg")]
    two = [*one, ("sync", "lora_r8", 0, "pg")]
    assert not style.sync_presets_differ(one) and style.sync_presets_differ(two)
    assert style.config_label("sync", "lora_r8", 0, sync_preset=True) == "sync/lora_r8 K=0"
    assert style.config_label("sync", "none", 0, sync_preset=False) == "sync K=0"
