"""Batches hold whole groups, and each trained sample's advantage is its reward minus the
mean of its group's trained members: by hand, and in an AReaL-style run that drops samples."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from rlcore.algo.batching import take_whole_groups
from rlcore.config import RunConfig, config_from_dict
from rlcore.record.rundir import read_jsonl
from rlcore.runners import run_mode
from tests.conftest import small_config


def by_size(group_sizes: list[int], batch_size: int) -> tuple[list[int], list[int]] | None:
    """take_whole_groups on groups of the given sizes, as the sizes taken and left."""
    groups = [[f"g{i}"] * n for i, n in enumerate(group_sizes)]
    taken = take_whole_groups(groups, batch_size)
    return None if taken is None else ([len(g) for g in taken[0]], [len(g) for g in taken[1]])


class TestTakeWholeGroups:
    def test_two_full_groups_fill_the_batch(self):
        taken = take_whole_groups([["a"] * 4, ["b"] * 4], batch_size=8)
        assert taken == ([["a"] * 4, ["b"] * 4], [])

    def test_the_group_that_does_not_fit_waits_whole(self):
        # 3 + 4 = 7; with the 2 it would be 9 > 8: the batch closes at 7, the 2 stays
        taken = take_whole_groups([["a"] * 3, ["b"] * 4, ["c"] * 2], batch_size=8)
        assert taken == ([["a"] * 3, ["b"] * 4], [["c"] * 2])

    def test_fewer_than_b_samples_waiting_is_no_batch_yet(self):
        assert by_size([3, 4], 8) is None  # 7 < 8
        assert by_size([], 8) is None

    def test_groups_cut_by_drops_can_still_make_b(self):
        # stale drops left 4, 3, 1 and 4: 4 + 3 + 1 = 8 exactly; the last 4 waits
        assert by_size([4, 3, 1, 4], 8) == ([4, 3, 1], [4])

    def test_the_smallest_batch_is_b_minus_group_size_plus_one(self):
        # 1 + 4 = 5, and the next 4 would make 9 > 8: 5 = 8 - 4 + 1
        assert by_size([1, 4, 4], 8) == ([1, 4], [4])

    def test_first_in_first_out_no_later_group_jumps_the_queue(self):
        # 4 + 3 = 7; the next 4 does not fit, and the 1 behind it is not taken instead
        assert by_size([4, 3, 4, 1], 8) == ([4, 3], [4, 1])

    def test_a_group_larger_than_the_batch_is_refused(self):
        with pytest.raises(ValueError, match="a group of 5 samples cannot fit a batch of 4"):
            take_whole_groups([["a"] * 5], batch_size=4)


# --- end to end: AReaL-style, K = 1, the paper's preset ------------------------------------
B, G = 8, 4


def paper_config(model_dir: Path, seed: int) -> RunConfig:
    """config.yaml's `presets: paper` (filter, resubmit) at K = 1, with one-token chunks so
    that the trainer's commits interrupt and age many samples."""
    return config_from_dict(small_config(
        model_dir, mode="areal", seed=seed,
        train={"updates": 16, "update_batch_size": B},
        rollout={"max_new_tokens": 5, "chunk_tokens": 1, "group_size": G},
        staleness={"staleness_k": 1, "staleness_control": "filter", "interrupt": "resubmit"},
        runtime={"progress_every": 0, "save_policy": False}))


def trained_groups(samples: list[dict[str, Any]], updates: list[dict[str, Any]]
                   ) -> dict[int, list[dict[str, Any]]]:
    """The trained rows of each group, after checking no group was split across updates."""
    by_id = {s["sample_id"]: s for s in samples}
    batches: dict[int, set[int]] = defaultdict(set)
    for u in updates:
        for i in u["sample_ids"]:
            batches[by_id[i]["group_id"]].add(u["batch_id"])
    split = {g: sorted(b) for g, b in batches.items() if len(b) > 1}
    assert not split, f"groups split across updates (group: batches): {split}"
    groups: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for s in samples:
        if s["batch_id"] is not None:
            groups[s["group_id"]].append(s)
    return groups


def test_areal_paper_preset_trains_whole_groups_against_their_own_mean(tiny_model_dir: Path,
                                                                      tmp_path: Path):
    # Whether a group loses members is up to timing: the first of four seeds whose run
    # trained a partial group (in practice the first).
    for seed in range(4):
        run = tmp_path / f"s{seed}"
        summary = run_mode(paper_config(tiny_model_dir, seed), run)
        samples = read_jsonl(run / "samples.jsonl")
        updates = read_jsonl(run / "updates.jsonl")
        groups = trained_groups(samples, updates)
        if any(len(members) < G for members in groups.values()):
            break
    else:
        raise AssertionError("four seeds and no trained group had lost a member")
    assert summary["samples"]["dropped_stale"] + summary["samples"]["dropped_interrupted"] > 0

    # nothing else from a trained prompt: every accepted member was trained with its group
    for s in samples:
        if s["group_id"] in groups and s["status"] == "accepted":
            assert s["batch_id"] == groups[s["group_id"]][0]["batch_id"], s["sample_id"]

    # the baseline of a group is the mean reward of its trained members
    for members in groups.values():
        mean = sum(s["reward"] for s in members) / len(members)
        for s in members:
            assert s["advantage"] == pytest.approx(s["reward"] - mean, abs=1e-12)
    assert all(s["advantage"] is None for s in samples if s["batch_id"] is None)

    # the batch size is explicit, and only groups that lost members make it fall short of B
    for u in updates:
        assert u["batch_size"] == len(u["sample_ids"])
        assert B - G + 1 <= u["batch_size"] <= B
