"""Schedule replay: the randomness derivation, the schedule file, verification bit for bit
across modes and presets, tampered schedules, and counterfactual replays."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from rlcore.cli import main
from rlcore.config import RunConfig, config_from_dict
from rlcore.policy.sampler import inverse_cdf, token_uniform
from rlcore.record.rundir import read_jsonl
from rlcore.record.schedule import SCHEDULE_FILE, ScheduleError, read_schedule
from rlcore.replay.replayer import replay_run
from rlcore.runners import run_mode
from tests.conftest import small_config
from tests.test_code_run import TASKS as CODE_TASKS


def untimed(row: dict[str, Any]) -> dict[str, Any]:
    """A record without what the clock decides (times) or what only a live run measures."""
    return {k: v for k, v in row.items() if not k.startswith(("t_", "time/"))}


def tree_digest(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


# --- the randomness derivation --------------------------------------------------------------
class TestDraws:
    def test_the_uniform_is_blake2b_of_the_four_integers(self):
        # blake2b-64 of four zero int64s is bytes c5 0d 12 4a 8a af 41 a1, i.e. the
        # little-endian integer 11619761522075635141; its top 53 bits over 2**53:
        h = hashlib.blake2b(bytes(32), digest_size=8).digest()
        assert h.hex() == "c50d124a8aaf41a1"
        assert token_uniform(0, 0, 0, 0) == (11619761522075635141 >> 11) / 2**53
        assert token_uniform(0, 0, 0, 0) == pytest.approx(0.62990853, abs=1e-8)

    def test_every_coordinate_changes_the_draw(self):
        base = token_uniform(3, 10, 0, 2)
        assert 0.0 <= base < 1.0
        for args in [(4, 10, 0, 2), (3, 11, 0, 2), (3, 10, 1, 2), (3, 10, 0, 3)]:
            assert token_uniform(*args) != base
        assert token_uniform(3, 10, 0, 2) == base  # and nothing else does

    def test_inverse_cdf_by_hand(self):
        # cdf = [0.2, 0.2, 0.7, 1.0]: u < 0.2 -> 0; 0.2 <= u < 0.7 -> 2 (token 1 has no
        # mass and is never picked); u >= 0.7 -> 3
        probs = torch.tensor([[0.2, 0.0, 0.5, 0.3]] * 5)
        u = torch.tensor([0.0, 0.1999, 0.2, 0.6999, 0.9999], dtype=torch.float64)
        assert inverse_cdf(probs, u).tolist() == [0, 0, 2, 2, 3]

    def test_inverse_cdf_scales_by_the_total_mass(self):
        # mass 0.5 in all: u = 0.99 targets 0.495, inside token 1's [0.25, 0.5)
        probs = torch.tensor([[0.25, 0.25]])
        assert inverse_cdf(probs, torch.tensor([0.99], dtype=torch.float64)).tolist() == [1]


# --- verification, bit for bit ---------------------------------------------------------------
# (mode, K, interrupt, staleness control, extra sections): at least eight configurations of
# the asynchronous runners, covering K 1/2/4, resubmit/continue (and keep_kv),
# filter/throttle/both, two trainers and code tasks.
VERIFY = {
    "areal-k1-paper": ("areal", 1, "resubmit", "filter", {}),
    "async-k1-paper": ("async", 1, "resubmit", "filter", {}),
    "areal-k2-areal": ("areal", 2, "continue", "both", {}),
    "async-k2-throttle": ("async", 2, "continue", "throttle", {}),
    "areal-k4-throttle-resubmit": ("areal", 4, "resubmit", "throttle", {}),
    "async-k4-filter-continue": ("async", 4, "continue", "filter", {}),
    "areal-k2-keep-kv": ("areal", 2, "keep_kv", "both", {}),
    "areal-k2-two-trainers": ("areal", 2, "continue", "both",
                              {"runtime": {"trainer_workers": 2}}),
    "areal-k2-code": ("areal", 2, "resubmit", "both", {"code": True}),
}
# Configurations that must show both drops: stale samples and interrupted slots.
DROPS = ("areal-k1-paper", "async-k1-paper")


def run_config(model_dir: Path, tmp: Path, name: str, seed: int) -> RunConfig:
    mode, k, interrupt, control, extra = VERIFY[name]
    sections: dict[str, Any] = {
        "train": {"updates": 6, "update_batch_size": 8},
        "rollout": {"max_new_tokens": 5, "chunk_tokens": 1, "group_size": 4},
        "staleness": {"staleness_k": k, "interrupt": interrupt, "staleness_control": control,
                      "max_retries": 0 if name in DROPS else 1},
        "runtime": {"progress_every": 0, **extra.get("runtime", {})},
    }
    if extra.get("code"):
        rows = [json.dumps(t) + "\n" for t in CODE_TASKS]
        (tmp / "train.jsonl").write_text("".join(rows[:6]))
        (tmp / "heldout.jsonl").write_text("".join(rows[6:]))
        sections["task"] = {"suite": "jsonl", "train_path": str(tmp / "train.jsonl"),
                            "heldout_path": str(tmp / "heldout.jsonl")}
        sections["rollout"]["max_new_tokens"] = 8
        sections["reward"] = {"verifier": "code", "timeout_sec": 2.0, "workers": 2}
    return config_from_dict(small_config(model_dir, mode=mode, seed=seed, **sections))


def live_run(model_dir: Path, tmp: Path, name: str) -> Path:
    """A live run of the configuration; for DROPS, the first seed whose run drops samples
    both ways (whether a drop happens is up to timing)."""
    for seed in range(4):
        out = tmp / f"{name}-s{seed}"
        summary = run_mode(run_config(model_dir, tmp, name, seed), out)
        drops = summary["samples"]
        if name not in DROPS or (drops["dropped_stale"] and drops["dropped_interrupted"]):
            return out
    raise AssertionError(f"{name}: four seeds and no run dropped both stale and interrupted "
                         "samples")


def assert_reproduced(original: Path, replay: Path) -> None:
    """Tokens, log-prob sums, statuses and versions of every sample, every update's loss and
    statistics, the final state and the schedule itself: all equal."""
    a, b = (read_jsonl(d / "samples.jsonl") for d in (original, replay))
    assert [untimed(r) for r in a] == [untimed(r) for r in b]
    a, b = (read_jsonl(d / "updates.jsonl") for d in (original, replay))
    assert [r["loss"] for r in a] == [r["loss"] for r in b]
    assert [untimed(r) for r in a] == [untimed(r) for r in b]
    s_a, s_b = (json.loads((d / "summary.json").read_text()) for d in (original, replay))
    assert s_a["reproducibility"]["state_digest"] == s_b["reproducibility"]["state_digest"]
    assert s_a["samples"] == s_b["samples"] and s_a["tokens"] == s_b["tokens"]
    assert (original / SCHEDULE_FILE).read_text() == (replay / SCHEDULE_FILE).read_text()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VERIFY))
def test_a_replay_reproduces_the_run_bit_for_bit(tiny_model_dir: Path, tmp_path: Path,
                                                 name: str):
    original = live_run(tiny_model_dir, tmp_path, name)
    summary = replay_run(original, tmp_path / "replay")
    info = summary["reproducibility"]["replay"]
    assert info["kind"] == "verification" and info["of"] == str(original)
    assert_reproduced(original, tmp_path / "replay")
    if name == "areal-k2-two-trainers":
        ops = read_schedule(original).trainer_ops
        assert set(ops) == {0, 1}, "one trainer did all the work: not exercised"


def test_a_sync_run_replays_too(tiny_model_dir: Path, tmp_path: Path):
    cfg = config_from_dict(small_config(tiny_model_dir, train={"updates": 4}))
    run_mode(cfg, tmp_path / "run")
    assert main(["replay", str(tmp_path / "run"), "--out", str(tmp_path / "replay")]) == 0
    assert_reproduced(tmp_path / "run", tmp_path / "replay")


# --- tampered schedules ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def paper_run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An AReaL-style run under the paper's preset (interrupts and drops), left untouched."""
    return live_run(tiny_model_dir, tmp_path_factory.mktemp("tamper"), "areal-k1-paper")


def tampered_copy(run: Path, tmp: Path) -> Path:
    copy = tmp / "run"
    shutil.copytree(run, copy)
    return copy


def replay_fails(run: Path, out: Path, capsys, *extra: str) -> str:
    """Replay through the CLI, expecting a non-zero exit with nothing complete written; the
    replayed run's files are unchanged. Returns the error message."""
    before = tree_digest(run)
    rc = main(["replay", str(run), "--out", str(out), *extra])
    assert rc != 0
    assert tree_digest(run) == before
    assert not (out / "summary.json").exists()
    return capsys.readouterr().err


def edit_lines(path: Path, edit) -> None:
    lines = path.read_text().splitlines()
    path.write_text("\n".join(edit(lines)) + "\n")


def sign(run: Path) -> None:
    """Update summary.json's schedule digest, as a forger would."""
    summary = json.loads((run / "summary.json").read_text())
    digest = hashlib.sha256((run / SCHEDULE_FILE).read_bytes()).hexdigest()
    summary["reproducibility"]["schedule_digest"] = "sha256:" + digest
    (run / "summary.json").write_text(json.dumps(summary))


class TestTampered:
    def test_a_removed_record(self, paper_run: Path, tmp_path: Path, capsys):
        run = tampered_copy(paper_run, tmp_path)
        edit_lines(run / SCHEDULE_FILE, lambda lines: lines[:10] + lines[11:])
        assert "record seq 10 is missing" in replay_fails(run, tmp_path / "out", capsys)

    def test_a_changed_version(self, paper_run: Path, tmp_path: Path, capsys):
        run = tampered_copy(paper_run, tmp_path)
        lines = (run / SCHEDULE_FILE).read_text().splitlines()
        n, rec = next((n, r) for n, r in enumerate(map(json.loads, lines))
                      if r["type"] == "generate" and r["version"] > 0 and not r["cut"])
        rec["version"] -= 1
        edit_lines(run / SCHEDULE_FILE, lambda ls: ls[:n] + [json.dumps(rec)] + ls[n + 1:])
        err = replay_fails(run, tmp_path / "out", capsys)
        assert "is not the schedule this run recorded" in err
        # With the digest forged too, the replay itself finds it at that generation: other
        # weights sample other tokens, so either its chunk count (a response ended sooner or
        # later; which one depends on the recorded run) or its batch's first sample differs.
        sign(run)
        err = replay_fails(run, tmp_path / "out2", capsys)
        if "replay diverged at sample" in err:
            sample = next(r for r in read_jsonl(run / "samples.jsonl")
                          if [r["slot"], r["attempt"]] == rec["rows"][0][:2])
            assert f"(slot {rec['rows'][0][0]}," in err or f"sample {sample['sample_id']}" in err
        else:
            assert f"replay diverged at generation (record {rec['seq']}) ran " in err, err

    def test_a_truncated_file(self, paper_run: Path, tmp_path: Path, capsys):
        run = tampered_copy(paper_run, tmp_path)
        text = (run / SCHEDULE_FILE).read_text()
        lines = text.splitlines(keepends=True)
        half = "".join(lines[: len(lines) // 2])
        middle = lines[len(lines) // 2]
        (run / SCHEDULE_FILE).write_text(half + middle[: len(middle) // 2])  # inside a line
        assert "is not a JSON record" in replay_fails(run, tmp_path / "out", capsys)
        (run / SCHEDULE_FILE).write_text("".join(lines[: len(lines) // 2]))  # at a line end
        assert "ends without its 'end' record" in replay_fails(run, tmp_path / "out", capsys)

    def test_a_run_without_a_schedule(self, paper_run: Path, tmp_path: Path, capsys):
        run = tampered_copy(paper_run, tmp_path)
        (run / SCHEDULE_FILE).unlink()
        assert "has no schedule.jsonl" in replay_fails(run, tmp_path / "out", capsys)

    def test_a_different_thread_count(self, paper_run: Path, tmp_path: Path, capsys):
        err = replay_fails(paper_run, tmp_path / "out", capsys, "--threads", "2")
        assert "threads_per_role was 1, here it is 2" in err and "--tolerance" in err

    def test_a_recorded_loss_that_differs(self, paper_run: Path, tmp_path: Path, capsys):
        """Not the schedule but the run's results: the verification names the update."""
        run = tampered_copy(paper_run, tmp_path)
        rows = read_jsonl(run / "updates.jsonl")
        rows[2]["loss"] += 1e-7
        (run / "updates.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        err = replay_fails(run, tmp_path / "out", capsys)
        assert f"update 3 (batch {rows[2]['batch_id']}) loss" in err

    def test_the_output_inside_the_run(self, paper_run: Path, capsys):
        err = replay_fails(paper_run, paper_run / "replay", capsys)
        assert "a replay never writes there" in err

    def test_only_train_settings_change(self, paper_run: Path, tmp_path: Path, capsys):
        err = replay_fails(paper_run, tmp_path / "out", capsys, "--set",
                           "staleness.staleness_k=4")
        assert "changes train settings only" in err
        err = replay_fails(paper_run, tmp_path / "out", capsys, "--set", "train.updates=9")
        assert "train.updates is part of the schedule" in err

    def test_an_inconsistent_schedule_is_refused_on_reading(self, paper_run: Path,
                                                            tmp_path: Path):
        """A sample whose generation is gone, with seq numbers kept consistent."""
        run = tampered_copy(paper_run, tmp_path)
        recs = [json.loads(line) for line in (run / SCHEDULE_FILE).read_text().splitlines()]
        recs = [r for r in recs if r["type"] != "generate" or r is not next(
            x for x in recs if x["type"] == "generate")]
        for i, r in enumerate(recs):
            r["seq"] = i
        recs[-1]["records"] = len(recs) - 1
        (run / SCHEDULE_FILE).write_text("".join(json.dumps(r) + "\n" for r in recs))
        with pytest.raises(ScheduleError, match="was never generated"):
            read_schedule(run)


# --- counterfactual replay --------------------------------------------------------------------
def test_a_counterfactual_holds_the_schedule_and_changes_the_training(paper_run: Path,
                                                                      tmp_path: Path):
    summary = replay_run(paper_run, tmp_path / "cf", ["train.objective=decoupled"])
    info = summary["reproducibility"]["replay"]
    assert info["kind"] == "counterfactual"
    assert info["overrides"] == {"train.objective": "decoupled"}
    assert summary["objective"] == "decoupled"
    held = ("sample_id", "slot", "attempt", "group_id", "status", "batch_id",
            "current_version", "worker")
    a, b = (read_jsonl(d / "samples.jsonl") for d in (paper_run, tmp_path / "cf"))
    assert [[r[k] for k in held] for r in a] == [[r[k] for k in held] for r in b]
    a, b = (read_jsonl(d / "updates.jsonl") for d in (paper_run, tmp_path / "cf"))
    assert [(r["version"], r["batch_id"], r["sample_ids"]) for r in a] == \
        [(r["version"], r["batch_id"], r["sample_ids"]) for r in b]
    assert [r["loss"] for r in a] != [r["loss"] for r in b]
    # an emitted response is never cut short: it ends with a stop token or at the limit
    cfg = config_from_dict(json.loads((paper_run / "config.json").read_text())["config"])
    for r in read_jsonl(tmp_path / "cf" / "samples.jsonl"):
        if r["status"] != "dropped_interrupted":
            assert r["finished"] or r["response_tokens"] == cfg.rollout.max_new_tokens


def test_a_counterfactual_batch_that_ends_before_its_cut_still_cuts(paper_run: Path,
                                                                    tmp_path: Path):
    """Under other weights a batch can finish before the chunk its run cut rows after (the
    run's CI found one): the cut rows keep their fate, dropped or resubmitted, with the
    tokens they had. Forged here by moving a cut past the last chunk a batch can run."""
    run = tampered_copy(paper_run, tmp_path)
    lines = (run / SCHEDULE_FILE).read_text().splitlines()
    n, rec = next((n, r) for n, r in enumerate(map(json.loads, lines))
                  if r["type"] == "generate" and r["cut_reason"] == "interrupt")
    rec["cut_after"] = rec["chunks"] = 99
    edit_lines(run / SCHEDULE_FILE, lambda ls: ls[:n] + [json.dumps(rec)] + ls[n + 1:])
    sign(run)
    replay_run(run, tmp_path / "cf", ["train.objective=decoupled"])
    a, b = (read_jsonl(d / "samples.jsonl") for d in (run, tmp_path / "cf"))
    assert [(r["slot"], r["attempt"], r["status"]) for r in a] == \
        [(r["slot"], r["attempt"], r["status"]) for r in b]

    def interrupts(d: Path) -> int:
        return sum(e["type"] == "interrupted_attempt" for e in read_jsonl(d / "events.jsonl"))
    assert interrupts(run) == interrupts(tmp_path / "cf") > 0


def test_the_same_objective_is_a_verification(paper_run: Path, tmp_path: Path):
    """The identity check: a replay under the run's own objective equals the run."""
    summary = replay_run(paper_run, tmp_path / "same", ["train.objective=pg"])
    assert summary["reproducibility"]["replay"]["kind"] == "verification"
    assert_reproduced(paper_run, tmp_path / "same")
