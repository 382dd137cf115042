"""The AReaL-style runner on code tasks: rewards come from the sandbox, off the controller's
path, and hostile responses do not stall it."""

from __future__ import annotations

import json
from pathlib import Path

from rlcore.config import config_from_dict
from rlcore.runners import run_mode
from rlcore.runners.asynchronous.controller import Controller
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


def test_areal_run_on_code_tasks_with_hostile_responses(tmp_path: Path, tiny_model_dir: Path,
                                                        monkeypatch):
    cfg = config_from_dict(small_config(
        tiny_model_dir, mode="areal",
        task={"suite": "jsonl", "train_path": write_tasks(tmp_path / "train.jsonl", TASKS[:6]),
              "heldout_path": write_tasks(tmp_path / "heldout.jsonl", TASKS[6:])},
        rollout={"max_new_tokens": 12},
        train={"updates": 4, "update_batch_size": 8},
        staleness={"staleness_k": 2},
        reward={"timeout_sec": 0.5, "workers": 2},
    ))
    seen = {"n": 0}
    on_sample = Controller.on_sample

    def every_third_hangs(self, msg):  # as if the policy had written an infinite loop
        seen["n"] += 1
        if seen["n"] % 3 == 0:
            msg.text = HANG
        on_sample(self, msg)

    monkeypatch.setattr(Controller, "on_sample", every_third_hangs)
    summary = run_mode(cfg, tmp_path / "run")
    assert summary["updates"] == 4
    rows = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").open()]
    scored = [r for r in rows if r["status"] != "dropped_interrupted"]
    assert scored and all(r["reward"] in (0.0, 1.0) and "tests_passed" in r for r in scored)
    hung = [r for r in scored if r["response"] == HANG]
    assert hung and all(r["reward"] == 0.0 and "timed out" in r["error"] for r in hung)
    # Each hanging response holds a pool thread for 0.5 s; the controller itself does not wait.
    assert summary["scheduling"]["controller_ms_per_sample"] < 5.0
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["sandbox"]["verdict_outside_sandbox"] is True
