"""docs/extending.md, done: an objective or a task suite added from outside rlcore is one
function (or class) and one registration, and a run trains with it; so does a dataset."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlcore.algo.objectives import Inputs, Knobs, LossStats, pg
from rlcore.algo.registry import Objective, names, objective, register, unregister
from rlcore.config import ConfigError, config_from_dict
from rlcore.runners import run_mode
from rlcore.tasks import registry as suites
from rlcore.tasks.registry import Suite
from rlcore.tasks.suites import Task, load_suite
from tests.conftest import small_config
from tests.toy_plugin import PLUGIN, install_plugin

ROOT = Path(__file__).resolve().parents[1]
CALLS: list[float] = []


def half_pg(x: Inputs, k: Knobs) -> tuple[torch.Tensor, LossStats]:
    """A toy objective: half of the plain policy gradient."""
    loss, stats = pg(x, k)
    CALLS.append(float(loss.detach()))
    return 0.5 * loss, stats


TOY = Objective("half_pg", "half of pg (a test)", f"{__name__}:half_pg")


@pytest.fixture
def toy():
    register(TOY)
    try:
        yield TOY
    finally:
        unregister(TOY.name)


def test_a_registered_objective_is_allowed_and_described(toy: Objective):
    assert names()[-1] == "half_pg" and objective("half_pg") is toy
    cfg = config_from_dict({"train": {"objective": "half_pg"}})
    assert cfg.train.objective == "half_pg"


def test_an_unregistered_objective_is_refused_with_the_registered_ones():
    with pytest.raises(ConfigError, match=f"allowed values: {', '.join(names())}$"):
        config_from_dict({"train": {"objective": "half_pg"}})


def test_a_correction_the_objective_does_not_take_is_refused(toy: Objective):
    with pytest.raises(ConfigError, match="train.dual_clip .* choose behav_clip, decoupled or "
                                          "a3po"):
        config_from_dict({"train": {"objective": "half_pg", "dual_clip": 3.0}})


@pytest.mark.slow
def test_a_sync_run_trains_with_an_objective_registered_outside_rlcore(
        toy: Objective, tiny_model_dir: Path, tmp_path: Path):
    CALLS.clear()
    cfg = config_from_dict(small_config(tiny_model_dir, train={"objective": "half_pg",
                                                               "updates": 3}))
    summary = run_mode(cfg, tmp_path / "run")
    assert summary["objective"] == "half_pg" and summary["run"]["objective"] == "half_pg"
    assert len(CALLS) == 3  # one minibatch an update
    assert summary["updates"] == 3


def test_names_are_checked_at_registration():
    with pytest.raises(ValueError, match="lower-case"):
        register(Objective("Half", "h", f"{__name__}:half_pg"))
    with pytest.raises(ValueError, match="unknown corrections"):
        register(Objective("h2", "h", f"{__name__}:half_pg", corrections=frozenset({"x"})))
    with pytest.raises(ValueError, match="registered already"):
        register(Objective("pg", "another", f"{__name__}:half_pg"))


class DoublesSuite:
    """A toy suite: 'a+a=' answered by 2a, the first three held out."""

    name = "doubles"

    def __init__(self, cfg):
        tasks = [Task(task_id=f"d{a}", prompt=f"{a}+{a}=", answer=str(2 * a))
                 for a in range(cfg.max_operand + 1)]
        self._splits = {"heldout": tasks[:3], "train": tasks[3:]}

    def split(self, name: str) -> list[Task]:
        return self._splits[name]


TOY_SUITE = Suite("doubles", "a+a= (a test)", f"{__name__}:DoublesSuite")


@pytest.fixture
def toy_suite():
    suites.register(TOY_SUITE)
    try:
        yield TOY_SUITE
    finally:
        suites.unregister(TOY_SUITE.name)


def prompts_trained_on(run_dir: Path) -> set[str]:
    """The task ids of a finished run's samples."""
    lines = (run_dir / "samples.jsonl").read_text().splitlines()
    return {json.loads(line)["task_id"] for line in lines if line}


def test_a_registered_suite_is_allowed_and_an_unknown_one_refused(toy_suite: Suite):
    assert suites.names()[-1] == "doubles"
    assert config_from_dict({"task": {"suite": "doubles"}}).task.suite == "doubles"
    with pytest.raises(ConfigError, match=f"allowed values: {', '.join(suites.names())}$"):
        config_from_dict({"task": {"suite": "triples"}})


def test_a_generated_suite_refuses_the_settings_of_task_files(toy_suite: Suite):
    with pytest.raises(ConfigError, match="task.fields applies to task files"):
        config_from_dict({"task": {"suite": "doubles", "fields": "gsm8k"}})


def test_a_suite_that_reads_files_needs_them():
    files = Suite("files2", "reads files (a test)", f"{__name__}:DoublesSuite",
                  reads_files=True)
    suites.register(files)
    try:
        with pytest.raises(ConfigError, match="task.suite 'files2' reads task files: set "
                                              "task.train_path and task.heldout_path"):
            config_from_dict({"task": {"suite": "files2"}})
    finally:
        suites.unregister("files2")


def test_a_suite_without_train_tasks_is_refused(toy_suite: Suite):
    cfg = config_from_dict({"task": {"suite": "doubles", "max_operand": 2}})
    with pytest.raises(ConfigError, match="task.suite 'doubles' has no train tasks"):
        load_suite(cfg.task)


def test_a_built_in_suite_cannot_be_unregistered():
    with pytest.raises(ValueError, match="built in"):
        suites.unregister("chain")


@pytest.mark.slow
def test_a_sync_run_trains_on_a_suite_registered_outside_rlcore(
        toy_suite: Suite, tiny_model_dir: Path, tmp_path: Path):
    cfg = config_from_dict(small_config(tiny_model_dir, task={"suite": "doubles"},
                                        train={"updates": 2}))
    summary = run_mode(cfg, tmp_path / "run")
    assert summary["updates"] == 2
    trained = prompts_trained_on(tmp_path / "run")
    assert trained and trained <= {f"d{a}" for a in range(3, cfg.task.max_operand + 1)}


@pytest.mark.slow
def test_a_sync_run_trains_on_a_dataset_of_its_own(tiny_model_dir: Path, tmp_path: Path):
    """docs/extending.md's dataset: two JSONL files under `task.suite: jsonl`."""
    def write(name: str, numbers: range) -> str:
        path = tmp_path / name
        path.write_text("".join(json.dumps({"id": f"t{n}", "prompt": f"{n}+1=",
                                            "answer": str(n + 1)}) + "\n" for n in numbers))
        return str(path)

    cfg = config_from_dict(small_config(
        tiny_model_dir, train={"updates": 2},
        task={"suite": "jsonl", "train_path": write("train.jsonl", range(20, 60)),
              "heldout_path": write("heldout.jsonl", range(0, 20))}))
    summary = run_mode(cfg, tmp_path / "run")
    assert summary["updates"] == 2
    trained = prompts_trained_on(tmp_path / "run")
    assert trained and trained <= {f"t{n}" for n in range(20, 60)}


def test_an_objective_in_an_installed_plugin_is_registered_in_every_process(tmp_path: Path):
    """A fresh process (a pipeline job) that reads a config naming the plugin's objective
    registers it from the entry point, with no import of the plugin by hand."""
    install_plugin(tmp_path)
    code = ("from rlcore.config import config_from_dict\n"
            "from rlcore.algo.registry import objective\n"
            "cfg = config_from_dict({'train': {'objective': 'third_pg'}})\n"
            "print(cfg.train.objective, objective('third_pg').help)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"},
                          cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "third_pg a third of pg (a plugin)"


def test_a_plugin_module_without_its_entry_point_is_not_registered(tmp_path: Path):
    """On the path but not named in the `rlcore.objectives` group, the module is not
    imported, and the config refuses its objective."""
    (tmp_path / "rlcore_toy_plugin.py").write_text(PLUGIN)
    code = ("from rlcore.config import config_from_dict\n"
            "config_from_dict({'train': {'objective': 'third_pg'}})\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"},
                          cwd=tmp_path, timeout=120)
    assert done.returncode != 0 and "train.objective" in done.stderr, done.stderr


def test_a_plugins_code_is_digested_for_the_jobs_that_use_it(tmp_path: Path):
    """The code parameter of a job that names the plugin's objective changes with the
    plugin's file; a job of built-ins adds nothing (its digest is the runtime part's); a warm
    launcher server, which may have imported the plugin, is not reused after the edit."""
    install_plugin(tmp_path)
    code = ("from rlcore.pipeline.grid import plugin_code\n"
            "from rlcore.launcher.protocol import server_key\n"
            "print(repr(plugin_code(['pg'], 'arith')), plugin_code(['third_pg'], 'arith'),"
            " plugin_code(['pg', 'third_pg'], 'arith'), server_key({}))\n")

    def digests() -> list[str]:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"},
                              cwd=tmp_path, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    builtin, plugin, replayed, server = digests()
    assert builtin == "''" and plugin.startswith("rlcore_toy_plugin:") and replayed == plugin
    assert digests() == [builtin, plugin, replayed, server]  # the same files, the same digest
    with (tmp_path / "rlcore_toy_plugin.py").open("a") as f:
        f.write("# an edit\n")
    edited = digests()
    assert edited[0] == builtin and edited[1] not in ("", plugin) and edited[3] != server
