"""The AReaL-style runner on code tasks: rewards come from the sandbox, off the controller's
path, and hostile responses do not stall it.

What the controller costs per sample is a figure (`scheduling.controller_ms_per_sample`,
reported by `rlcore bench`), not a bound asserted here: on a shared machine it measures the
machine. What is asserted is that the controller's loop goes on while a hanging response is
being evaluated."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlcore.config import config_from_dict
from rlcore.runners import run_mode
from rlcore.runners.asynchronous.controller import Controller
from rlcore.tasks import reward
from tests.conftest import small_config

HANG = "def inc(x):\n    while True:\n        pass\n"
TASKS = [  # prompts short enough for the tiny model's 256 positions
    {"id": f"inc-{i}", "prompt": f"def inc(x): # x+{i}\n", "entry_point": "inc",
     "tests": [f"assert inc(1) == {1 + i}", {"args": [5], "expected": 5 + i}]}
    for i in range(1, 9)
]


def write_tasks(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.slow
def test_areal_run_on_code_tasks_with_hostile_responses(tmp_path: Path, tiny_model_dir: Path,
                                                        monkeypatch):
    cfg = config_from_dict(small_config(
        tiny_model_dir, mode="areal",
        task={"suite": "jsonl", "train_path": write_tasks(tmp_path / "train.jsonl", TASKS[:6]),
              "heldout_path": write_tasks(tmp_path / "heldout.jsonl", TASKS[6:])},
        rollout={"max_new_tokens": 12},
        train={"updates": 4, "update_batch_size": 8},
        staleness={"staleness_k": 2},
        reward={"verifier": "code", "timeout_sec": 0.5, "workers": 2},
    ))
    seen = {"n": 0}
    on_sample, pump, evaluate = Controller.on_sample, Controller.pump, reward.evaluate_response

    def every_third_hangs(self, msg):  # as if the policy had written an infinite loop
        seen["n"] += 1
        if seen["n"] % 3 == 0:
            msg.text = HANG
        on_sample(self, msg)

    # The controller's loop: one pump per message or poll interval, unless it is held up.
    loop: dict[str, Any] = {"turns": 0, "controller": None}

    def counted_pump(self):
        loop["turns"] += 1
        loop["controller"] = self
        pump(self)

    overlaps: list[tuple[int, bool]] = []  # per hanging evaluation: (turns meanwhile, in run)

    def watched_evaluate(response_text, task, cfg, slot=0):
        turns = loop["turns"]
        result = evaluate(response_text, task, cfg, slot)
        if response_text == HANG:
            controller = loop["controller"]
            overlaps.append((loop["turns"] - turns,
                             controller is not None and controller.t_done is None))
        return result

    monkeypatch.setattr(Controller, "on_sample", every_third_hangs)
    monkeypatch.setattr(Controller, "pump", counted_pump)
    monkeypatch.setattr(reward, "evaluate_response", watched_evaluate)
    summary = run_mode(cfg, tmp_path / "run")
    assert summary["updates"] == 4
    rows = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").open()]
    scored = [r for r in rows if r["status"] != "dropped_interrupted"]
    assert scored and all(r["reward"] in (0.0, 1.0) and "tests_passed" in r for r in scored)
    hung = [r for r in scored if r["response"] == HANG]
    assert hung and all(r["reward"] == 0.0 and "timed out" in r["error"] for r in hung)
    # Each hanging response holds a pool thread for 0.5 s; the controller itself does not
    # wait: its loop went round while each one that ended before the last update was scored.
    during_run = [turns for turns, in_run in overlaps if in_run]
    assert during_run, f"no hanging response was scored while the run went on: {overlaps}"
    assert all(turns > 0 for turns in during_run), overlaps
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["sandbox"]["verdict_outside_sandbox"] is True
