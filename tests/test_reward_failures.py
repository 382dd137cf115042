"""One reward-failure rule in every execution path: the harness itself raising (not a response
failing its tests) is counted, recorded on the sample, and stops the run once there are more
failures than `reward.max_harness_errors`, with one message naming the sample."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlcore.config import RewardConfig, RunConfig, config_from_dict
from rlcore.errors import HarnessFailed
from rlcore.record.rundir import is_complete, read_jsonl, validate_summary
from rlcore.replay.replayer import replay_run
from rlcore.runners import run_mode
from rlcore.runners.asynchronous.health import running
from rlcore.tasks import reward
from rlcore.tasks.prompts import Prompt
from rlcore.tasks.suites import Task
from tests.conftest import small_config
from tests.test_code_run import TASKS as CODE_TASKS

# sync, async (threads), areal (processes), and a replay (of a sync run) scoring anew
PATHS = ("sync", "async", "areal", "replay")
FAIL_ON = 3  # the scored sample on which the harness raises
BROKEN = "OSError: cannot start the sandbox"
ROLES = ("param_service", "rollout0", "trainer0")


def message(sample_id: str, task_id: str, group_id: str, limit: int = 0) -> str:
    """The message every path stops with."""
    return (f"reward harness failed on sample {sample_id} (task {task_id}, group {group_id}): "
            f"{BROKEN}; that is 1 harness failure, more than reward.max_harness_errors="
            f"{limit} allows. The run was stopped and no summary.json was written: fix the "
            "harness (e.g. the sandbox) or raise reward.max_harness_errors to score such "
            "samples 0 and go on")


def code_config(model_dir: Path, tmp: Path, mode: str, limit: int) -> RunConfig:
    """A short run on code tasks: every reward goes through the sandbox, in the reward
    pool's threads (where a failure used to become a silent 0 in the asynchronous modes)."""
    rows = [json.dumps(t) + "\n" for t in CODE_TASKS]
    (tmp / "train.jsonl").write_text("".join(rows[:6]))
    (tmp / "heldout.jsonl").write_text("".join(rows[6:]))
    return config_from_dict(small_config(
        model_dir, mode=mode,
        task={"suite": "jsonl", "train_path": str(tmp / "train.jsonl"),
              "heldout_path": str(tmp / "heldout.jsonl")},
        rollout={"max_new_tokens": 8},
        train={"updates": 2, "update_batch_size": 8},
        reward={"verifier": "code", "timeout_sec": 2.0, "workers": 2,
                "max_harness_errors": limit},
        runtime={"progress_every": 0, "save_policy": False}))


class BrokenHarness:
    """Once armed, the harness raises, as a sandbox that cannot start would, on the third
    response scored in this process (every mode scores here: the AReaL-style controller runs
    in the main process); `scored` holds the tasks scored since, in order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.monkeypatch = monkeypatch
        self.scored: list[Task] = []
        self._lock = threading.Lock()
        self._evaluate = reward.evaluate_response

    def _third_fails(self, text: str, task: Task, cfg: RewardConfig, slot: int = 0
                     ) -> dict[str, Any]:
        with self._lock:  # the reward pool's threads score at once
            self.scored.append(task)
            n = len(self.scored)
        if n == FAIL_ON:
            raise OSError("cannot start the sandbox")
        return self._evaluate(text, task, cfg, slot)

    def arm(self) -> None:
        self.monkeypatch.setattr(reward, "evaluate_response", self._third_fails)

    @property
    def failed_task(self) -> str:
        return self.scored[FAIL_ON - 1].task_id


@pytest.fixture
def harness(monkeypatch: pytest.MonkeyPatch) -> BrokenHarness:
    return BrokenHarness(monkeypatch)


def run_path(path: str, model_dir: Path, tmp: Path, limit: int, harness: BrokenHarness
             ) -> Path:
    """Run `path` with the harness armed to fail; returns the run directory. A replay
    replays an intact sync run, as a counterfactual (its rewards are scored anew, and
    compared with nothing)."""
    out = tmp / "out"
    if path == "replay":
        original = tmp / "original"
        run_mode(code_config(model_dir, tmp, "sync", limit), original)
        harness.arm()
        replay_run(original, out, ["train.objective=behav_clip"])
    else:
        cfg = code_config(model_dir, tmp, path, limit)
        harness.arm()
        run_mode(cfg, out)
    return out


def gone(alive: Callable[[], list[Any]], timeout: float = 5.0) -> bool:
    """Whether nothing is `alive` within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while alive():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize("path", PATHS)
def test_a_harness_failure_stops_every_path_alike(path: str, tiny_model_dir: Path,
                                                  tmp_path: Path, harness: BrokenHarness):
    t0 = time.monotonic()
    with pytest.raises(HarnessFailed) as info:
        run_path(path, tiny_model_dir, tmp_path, 0, harness)
    out, text = tmp_path / "out", str(info.value)
    named = re.fullmatch(r"reward harness failed on sample (\d+) \(task (\S+), group (\d+)\).*",
                         text, re.S)
    assert named is not None, text
    assert text == message(*named.groups())
    assert named[2] == harness.failed_task
    assert time.monotonic() - t0 < 120
    assert not is_complete(out)
    if path == "areal":  # failed fast, and no worker outlives the run
        pids = [e["pid"] for e in read_jsonl(out / "events.jsonl.partial")
                if e["type"] == "worker_ready"]
        assert len(pids) == len(ROLES)
        assert gone(lambda: [p for p in pids if running(p)])
    if path == "async":
        assert gone(lambda: [t for t in threading.enumerate() if t.name in ROLES])


@pytest.mark.slow
@pytest.mark.parametrize("path", PATHS)
def test_below_the_limit_every_path_finishes_and_counts(path: str, tiny_model_dir: Path,
                                                        tmp_path: Path, harness: BrokenHarness):
    out = run_path(path, tiny_model_dir, tmp_path, 5, harness)
    summary = json.loads((out / "summary.json").read_text())
    validate_summary(summary)
    assert summary["reward"]["harness_errors"] == 1
    assert summary["updates"] == 2
    rows = read_jsonl(out / "samples.jsonl")
    failed = [r for r in rows if "harness_error" in r]
    assert len(failed) == 1, failed
    row = failed[0]
    assert row["harness_error"] == BROKEN
    assert row["task_id"] == harness.failed_task
    assert (row["reward"], row["pass"]) == (0.0, False)
    # the harness's failure is not a verdict on the response: no test counts
    assert "tests_passed" not in row and "error" not in row
    assert all("tests_passed" in r for r in rows if r is not row
               and r["status"] != "dropped_interrupted")


def test_the_cli_reports_a_harness_failure_without_a_traceback(
        tiny_model_dir: Path, tmp_path: Path, harness: BrokenHarness,
        capsys: pytest.CaptureFixture):
    from rlcore.cli import main

    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(code_config(tiny_model_dir, tmp_path, "sync", 0).to_dict()))
    harness.arm()
    assert main(["run", str(config), "--out", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err
    # the tiny base was warm-started on arithmetic, not these code tasks: said first, and kept
    warning, _, err = err.partition("\n") if err.startswith("warning: ") else ("", "", err)
    assert "warm-started on another task" in warning
    assert err.startswith("rlcore: error: reward harness failed on sample 2 "), err
    assert "Traceback" not in err, err
    assert not is_complete(tmp_path / "run")


# --- what counts as a harness failure -----------------------------------------------------------
ANSWER = Prompt(task=Task(task_id="add", prompt="3+4=", answer="7"), group_id=5)


@pytest.mark.parametrize("scoring", ["submit", "map"])
def test_the_pool_scores_a_harness_failure_0_and_the_limit_stops_the_run(
        scoring: str, monkeypatch: pytest.MonkeyPatch):
    def broken(*args: Any, **kwargs: Any) -> dict[str, Any]:
        raise RuntimeError("the harness is broken")

    monkeypatch.setattr(reward, "evaluate_response", broken)
    pool = reward.RewardPool(RewardConfig(max_harness_errors=1))

    def score() -> dict[str, Any]:
        result = pool.submit(None, "7", ANSWER.task) if scoring == "submit" \
            else pool.map([("7", ANSWER.task)])[0]
        assert result is not None  # an answer task is scored at once
        return result

    try:
        first, second = score(), score()
        for result in (first, second):
            assert (result["reward"], result["pass"]) == (0.0, False)
            assert result["harness_error"] == "RuntimeError: the harness is broken"
        pool.admit(7, ANSWER, first)  # one is allowed
        with pytest.raises(HarnessFailed, match=r"^reward harness failed on sample 8 \(task "
                           r"add, group 5\): RuntimeError: the harness is broken; that is 2 "
                           r"harness failures, more than reward.max_harness_errors=1 allows"):
            pool.admit(8, ANSWER, second)
    finally:
        pool.close()


def test_failing_or_timed_out_tests_are_an_ordinary_reward_of_0():
    task = Task(task_id="inc", prompt="", entry_point="inc",
                tests=["assert inc(1) == 2", "assert inc(1) + 1 == 3"])
    pool = reward.RewardPool(RewardConfig(verifier="code", timeout_sec=1.0))
    try:
        wrong, hangs, mistyped = pool.map([
            ("def inc(x):\n    return x\n", task),
            ("def inc(x):\n    while True:\n        pass\n", task),
            ("def inc(x):\n    return str(x + 1)\n", task)])  # the second test raises
        for i, result in enumerate((wrong, hangs, mistyped)):
            assert result["reward"] == 0.0 and "harness_error" not in result
            pool.admit(i, Prompt(task=task, group_id=0), result)  # no failure: nothing raised
        assert wrong["error"] == "failed: assert inc(1) == 2"
        assert "timed out" in hangs["error"]
        assert mistyped["error"] == "failed: assert inc(1) == 2"  # the first failure is kept
        assert mistyped["tests_passed"] == 0
    finally:
        pool.close()


@pytest.mark.parametrize("side", ["run", "replay"])
def test_a_verification_names_a_harness_failure_behind_a_reward_that_differs(side: str):
    from types import SimpleNamespace

    from rlcore.policy.sampler import Generation
    from rlcore.record.schedule import Divergence
    from rlcore.replay.checks import Verifier

    judged = {"reward": 1.0, "pass": True}
    failed = {"reward": 0.0, "pass": False, "harness_error": BROKEN}
    recorded, replayed = (failed, judged) if side == "run" else (judged, failed)
    row = {"response_ids": [1, 2], "policy_version": 0, "policy_version_max": 0,
           "logprob_sum": -1.0, **recorded}
    original = SimpleNamespace(schedule=SimpleNamespace(sample=lambda *_: SimpleNamespace(
        sample_id=4)), samples={4: row})
    where = "the run's harness failed" if side == "run" else "the harness failed here"
    with pytest.raises(Divergence, match=f"sample 4 .* reward \\({where}: {BROKEN}\\)"):
        Verifier(original, None).sample((9, 0), Generation([0], [1, 2], [-0.5, -0.5], [0, 0]),
                                        replayed)
