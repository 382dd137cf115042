"""The warm launcher (rlcore/launcher/): a job forked from its server is the cold job, from
the client's side (status, stdout, stderr, signals) and in its results (bit for bit); the
client stays light; a code change replaces the server; a killed client takes its job along;
a launcher that cannot work runs the command cold.

The tests run against a copy of the source tree, so that one of them can edit the code, and
share one server (a module fixture) started on the copy in a directory of their own.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlcore.record.machine_load import process_age_s, set_job_start
from rlcore.runners.asynchronous.health import running
from tests.conftest import small_config

ROOT = Path(__file__).resolve().parent.parent
ENDLESS = {"train": {"updates": 100000, "update_batch_size": 8}}


class Tree:
    """A copy of rlcore/ with the environment that runs commands from it, cold or warm."""

    def __init__(self, base: Path):
        self.base, self.src = base, base / "src"
        shutil.copytree(ROOT / "rlcore", self.src / "rlcore",
                        ignore=shutil.ignore_patterns("__pycache__"))
        self.dir = base / "launcher"
        self.env = {**os.environ, "PYTHONPATH": str(self.src),
                    "RLCORE_LAUNCHER_DIR": str(self.dir), "RLCORE_LAUNCHER_IDLE_S": "120"}
        self.env.pop("RLCORE_LAUNCHER", None)

    # `python -m` puts its directory first on sys.path: never the checkout's
    def warm(self, *argv: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "rlcore.launcher", *argv],
                              capture_output=True, text=True, env=kw.pop("env", self.env),
                              cwd=kw.pop("cwd", self.base), timeout=120, **kw)

    def cold(self, *argv: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "rlcore", *argv], capture_output=True,
                              text=True, env=self.env, cwd=kw.pop("cwd", self.base),
                              timeout=120, **kw)

    def server_pid(self) -> int | None:
        out = self.warm("--status").stdout
        return int(out.split()[1].rstrip(",")) if out.startswith("server ") else None

    def stop(self) -> None:
        pid = self.server_pid()
        self.warm("--stop")
        wait_until(lambda: pid is None or not running(pid), 10, "the server to exit")


def wait_until(cond: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout} s for {what}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tree]:
    """The copied tree, its server started by a first command."""
    t = Tree(tmp_path_factory.mktemp("launcher"))
    assert t.warm("config-schema").returncode == 0
    assert t.server_pid() is not None
    yield t
    t.stop()


def write_config(path: Path, model: Path, **sections: Any) -> Path:
    path.write_text(yaml.safe_dump(small_config(model, **sections)))
    return path


def records(run: Path, name: str) -> list[dict[str, Any]]:
    """A run's rows without their timing fields (t_*, time/*)."""
    rows = [json.loads(line) for line in (run / name).read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(("t_", "time/"))} for r in rows]


def processes_in(directory: Path) -> list[int]:
    """Live processes whose current directory is in `directory`."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cwd = Path(os.readlink(proc / "cwd"))
        except OSError:
            continue
        if cwd.is_relative_to(directory) and running(int(proc.name)):
            pids.append(int(proc.name))
    return pids


class TestClient:
    def test_imports_no_torch(self, tree: Tree):
        """The client's own imports (python -X importtime), with the job forked elsewhere."""
        result = subprocess.run([sys.executable, "-X", "importtime", "-m", "rlcore.launcher",
                                 "config-schema"], capture_output=True, text=True,
                                env=tree.env, cwd=tree.base, timeout=60)
        assert result.returncode == 0 and "running the command cold" not in result.stderr
        imported = [line.rsplit("|", 1)[1].strip() for line in result.stderr.splitlines()
                    if line.startswith("import time:")]
        assert "rlcore.launcher.client" in imported
        assert [m for m in imported if m.split(".")[0] in ("torch", "transformers",
                                                          "numpy")] == []

    def test_the_job_start_dates_the_startup(self):
        try:
            set_job_start(time.time() - 5.0)
            assert process_age_s() == pytest.approx(5.0, abs=0.5)
        finally:
            set_job_start(None)


class TestRelay:
    @pytest.mark.parametrize("argv", [
        ["config-schema", "--markdown"],
        ["run", "missing.yaml", "--out", "out"],  # a ConfigError: one line, status 2
        ["run", "missing.yaml"],  # argparse: usage, status 2
    ], ids=["stdout", "config-error", "usage"])
    def test_status_stdout_and_stderr_are_the_cold_commands(self, tree: Tree,
                                                            tmp_path: Path, argv: list[str]):
        warm = tree.warm(*argv, cwd=tmp_path)
        cold = tree.cold(*argv, cwd=tmp_path)
        assert (warm.returncode, warm.stdout, warm.stderr) == \
            (cold.returncode, cold.stdout, cold.stderr)
        assert not (tmp_path / "out").exists()

    @pytest.mark.slow
    def test_an_uncaught_exception_is_the_cold_commands(self, tree: Tree, tmp_path: Path,
                                                        tiny_model_dir: Path):
        config = write_config(tmp_path / "c.yaml", tiny_model_dir)
        (tmp_path / "file").write_text("")
        argv = ("run", str(config), "--out", str(tmp_path / "file" / "run"))
        warm, cold = tree.warm(*argv), tree.cold(*argv)
        assert warm.returncode == cold.returncode == 1
        assert warm.stdout == cold.stdout
        # the same traceback from the raise up to rlcore.cli.main; above it, the launcher's
        # frames in place of rlcore/__main__.py's
        assert warm.stderr.splitlines()[-1] == cold.stderr.splitlines()[-1]
        assert warm.stderr.startswith("Traceback (most recent call last):")
        assert cold.stderr.endswith(warm.stderr[warm.stderr.index(
            '  File "' + str(tree.src / "rlcore" / "cli.py")):])

    def test_sigterm_reaches_the_job_and_the_client_dies_by_it(self, tree: Tree,
                                                             tmp_path: Path,
                                                             tiny_model_dir: Path):
        config = write_config(tmp_path / "c.yaml", tiny_model_dir, **ENDLESS)
        client = started_job(tree, config, tmp_path / "job")
        client.send_signal(signal.SIGTERM)
        assert client.wait(timeout=30) == -signal.SIGTERM
        wait_until(lambda: not processes_in(tmp_path / "job"), 10, "the job to end")


def started_job(tree: Tree, config: Path, cwd: Path, mode: str = "sync"
                ) -> subprocess.Popen[bytes]:
    """A warm `rlcore run` of `config` in `cwd`, returned once its run has begun."""
    cwd.mkdir()
    client = subprocess.Popen(
        [sys.executable, "-m", "rlcore.launcher", "run", str(config), "--out", "run",
         "--set", f"mode={mode}"], cwd=cwd, env=tree.env, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    wait_until(lambda: (cwd / "run" / "events.jsonl.partial").exists()
               or client.poll() is not None, 60, "the run to begin")
    assert client.poll() is None, "the job ended before it could be killed"
    return client


class TestNoOrphans:
    def test_a_killed_client_kills_its_job_and_workers(self, tree: Tree, tmp_path: Path,
                                                        tiny_model_dir: Path):
        config = write_config(tmp_path / "c.yaml", tiny_model_dir,
                              staleness={"staleness_k": 2}, **ENDLESS)
        client = started_job(tree, config, tmp_path / "job", mode="areal")
        wait_until(lambda: len(processes_in(tmp_path / "job")) >= 5, 30,
                   "the job, its fork server and its three workers")
        client.kill()  # SIGKILL: nothing in the client can pass it on
        client.wait()
        wait_until(lambda: not processes_in(tmp_path / "job"), 10, "the job to be killed")
        assert not (tmp_path / "job" / "run" / "summary.json").exists()
        assert tree.server_pid() is not None  # the server serves on


class TestResults:
    @pytest.mark.slow
    def test_a_warm_run_is_the_cold_run_bit_for_bit(self, tree: Tree, tmp_path: Path,
                                                    tiny_model_dir: Path):
        config = write_config(tmp_path / "c.yaml", tiny_model_dir)
        argv = ("run", str(config), "--eval", "--out")
        t0 = time.time()
        warm = tree.warm(*argv, str(tmp_path / "warm"))
        elapsed = time.time() - t0
        cold = tree.cold(*argv, str(tmp_path / "cold"))
        assert warm.returncode == cold.returncode == 0, warm.stderr + cold.stderr
        w, c = tmp_path / "warm", tmp_path / "cold"
        assert re.sub(r"in [0-9.]+s", "", warm.stdout.replace(str(w), str(c))) == \
            re.sub(r"in [0-9.]+s", "", cold.stdout)
        for name in ("samples.jsonl", "updates.jsonl"):
            assert records(w, name) == records(c, name)
        assert (w / "policy" / "model.safetensors").read_bytes() == \
            (c / "policy" / "model.safetensors").read_bytes()
        scores = [{k: v for k, v in json.loads((d / "eval.json").read_text()).items()
                   if k not in ("eval_s", "model_path")} for d in (w, c)]
        assert scores[0] == scores[1]
        # the job's start-up counts from the client's start, and within what it waited
        startup = json.loads((w / "summary.json").read_text())["time"]["startup_s"]
        assert 0.0 < startup < elapsed

    @pytest.mark.slow
    def test_the_job_that_starts_the_server_leaves_its_start_out_of_startup(
            self, tree: Tree, tmp_path: Path, tiny_model_dir: Path):
        """The server's start is the grid's, once: the first job of a grid would otherwise
        report seconds of start-up (the server's imports of torch and the runners) that no
        other job has. The first job's start-up is a later job's, give or take."""
        env = {**tree.env, "RLCORE_LAUNCHER_DIR": str(tmp_path / "launcher")}  # no server
        config = write_config(tmp_path / "c.yaml", tiny_model_dir)
        startups = []
        try:
            for name in ("first", "second"):
                t0 = time.time()
                run = tree.warm("run", str(config), "--out", str(tmp_path / name), env=env)
                assert run.returncode == 0, run.stderr
                startups.append((json.loads((tmp_path / name / "summary.json").read_text())[
                    "time"]["startup_s"], time.time() - t0))
        finally:
            tree.warm("--stop", env=env)
        (first, first_elapsed), (second, second_elapsed) = startups
        # the server's start made the first command longer; its job's start-up is not
        assert first_elapsed > second_elapsed + 1.0, startups
        assert 0.0 < first < second + 1.0, startups

    @pytest.mark.slow
    def test_a_warm_areal_run_replays_bit_for_bit(self, tree: Tree, tmp_path: Path,
                                                  tiny_model_dir: Path):
        """The AReaL-style workers, forked from a fork server forked from the job: their
        run's verification replay (itself warm, cold is slower) reproduces it exactly."""
        config = write_config(tmp_path / "c.yaml", tiny_model_dir,
                              staleness={"staleness_k": 2})
        run = tree.warm("run", str(config), "--out", str(tmp_path / "run"), "--set",
                        "mode=areal")
        assert run.returncode == 0, run.stderr
        replay = tree.warm("replay", str(tmp_path / "run"), "--out", str(tmp_path / "replay"))
        assert replay.returncode == 0, replay.stderr
        assert "verified" in replay.stdout


class TestServer:
    @pytest.mark.slow
    def test_an_edit_replaces_the_server_and_two_clients_share_the_new_one(self, tree: Tree):
        old = tree.server_pid()
        assert old is not None
        with (tree.src / "rlcore" / "errors.py").open("a") as f:
            f.write("# an edit\n")
        clients = [subprocess.Popen([sys.executable, "-m", "rlcore.launcher", "config-schema"],
                                    env=tree.env, cwd=tree.base, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True) for _ in range(2)]
        outs = [c.communicate(timeout=120) for c in clients]
        assert [c.returncode for c in clients] == [0, 0]
        assert all(err == "" for _, err in outs), outs
        new = tree.server_pid()
        assert new is not None and new != old
        wait_until(lambda: not running(old), 10, "the old server to exit")
        log = (tree.dir / "server.log").read_text()
        assert log.count("imports done") == 2  # the first server and one new one


class TestFallback:
    def test_an_unusable_launcher_directory_runs_the_command_cold(self, tree: Tree,
                                                                 tmp_path: Path):
        (tmp_path / "file").write_text("")
        env = {**tree.env, "RLCORE_LAUNCHER_DIR": str(tmp_path / "file" / "launcher")}
        warm = tree.warm("config-schema", env=env)
        cold = tree.cold("config-schema")
        assert (warm.returncode, warm.stdout) == (cold.returncode, cold.stdout)
        lines = warm.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("rlcore launcher: cannot use")
        assert lines[0].endswith("; running the command cold")

    def test_a_server_that_cannot_start_runs_the_command_cold(self, tree: Tree,
                                                             tmp_path: Path):
        # torch, which the server imports and neither the client nor this command does,
        # broken
        env = {**tree.env, "RLCORE_LAUNCHER_DIR": str(tmp_path / "ld"),
               "PYTHONPATH": f"{tree.src}{os.pathsep}{tmp_path / 'broken'}"}
        broken = tmp_path / "broken" / "torch"
        broken.mkdir(parents=True)
        (broken / "__init__.py").write_text("raise ImportError('no torch here')\n")
        warm = tree.warm("config-schema", env=env)
        assert warm.returncode == 0
        lines = warm.stderr.splitlines()
        assert len(lines) == 1 and "the server exited at its start" in lines[0], lines

    def test_cold_mode_runs_the_command_cold_without_a_word(self, tree: Tree,
                                                           tmp_path: Path):
        env = {**tree.env, "RLCORE_LAUNCHER": "cold",
               "RLCORE_LAUNCHER_DIR": str(tmp_path / "ld")}
        warm = tree.warm("config-schema", env=env)
        assert warm.returncode == 0 and warm.stderr == ""
        assert not (tmp_path / "ld").exists()
