"""The pipeline config's grid and checks, called as Python: what the Snakefile calls when it
is read (tests/test_workflow.py shows that it does, and what Snakemake makes of it)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from snakemake.utils import update_config, validate

from rlcore.clock.profile import HARDWARE_DIR
from rlcore.config import config_from_dict
from rlcore.config.files import parse_yaml
from rlcore.errors import ConfigError
from rlcore.pipeline.checks import check_pipeline
from rlcore.pipeline.grid import (
    block_priorities,
    config_files,
    gpus_named,
    grid_points,
    replay_points,
    run_settings,
    stands_alone,
)
from rlcore.policy.stand_in import build_stand_in
from rlcore.tasks.reward import check_suite
from tests.conftest import small_pipeline_config

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "workflow" / "schemas" / "config.schema.yaml"
V100 = "v100x2-qwen0.5b-fp16"


def checked(data: dict[str, Any]) -> dict[str, Any]:
    """`data` as the Snakefile holds it: schema defaults filled, `run` resolved, checked."""
    validate(data, str(SCHEMA))
    data["run"] = config_from_dict(data["run"]).to_dict()
    check_pipeline(data)
    return data


class TestGrid:
    def test_the_small_grid_is_two_runs_and_two_replays(self):
        config = checked(small_pipeline_config())
        assert grid_points(config) == [
            {"clock": "wall", "mode": "sync", "preset": "none", "k": 0, "objective": "pg",
             "seed": 0},
            {"clock": "wall", "mode": "areal", "preset": "paper", "k": 1, "objective": "pg",
             "seed": 0}]
        assert [p["replayed"] for p in replay_points(config)] == ["pg", "decoupled"]

    def test_a_point_two_blocks_make_is_one_run_and_a_block_may_set_its_seeds(self):
        data = small_pipeline_config()
        data["grid"]["blocks"].append({"modes": ["sync"], "presets": ["none"], "ks": [0],
                                       "objectives": ["pg"], "seeds": [0, 5]})
        points = grid_points(checked(data))
        assert [(p["mode"], p["seed"]) for p in points] == [("sync", 0), ("areal", 0),
                                                            ("sync", 5)]

    def test_wall_runs_go_block_by_block_and_virtual_ones_after(self):
        data = small_pipeline_config()
        data["grid"]["seeds"] = [0, 1]
        data["grid"]["blocks"].append({"modes": ["areal"], "presets": ["paper"], "ks": [8],
                                       "objectives": ["pg"], "seeds": [2]})
        data["grid"]["blocks"].append({"modes": ["sync"], "presets": ["none"], "ks": [0],
                                       "objectives": ["pg"], "clock": f"virtual:{V100}"})
        priority = block_priorities(checked(data))
        # the highest runs first: seed 0's sync and areal, then seed 1's, then seed 2's
        assert sorted(priority, key=priority.get, reverse=True) == [
            "wall/sync/none/k0/pg/seed0", "wall/areal/paper/k1/pg/seed0",
            "wall/sync/none/k0/pg/seed1", "wall/areal/paper/k1/pg/seed1",
            "wall/areal/paper/k8/pg/seed2"]
        assert sorted(priority.values()) == [1, 2, 3, 4, 5]  # virtual runs: none, so 0

    def test_the_resolving_overlay_runs_the_emulated_arms_at_the_seeds_their_claims_need(self):
        """config/resolve.yaml laid over config/config.yaml, as Snakemake lays a second
        --configfile: the default's live runs, the emulated K = 2 arms and sync at 26 seeds,
        the paper's preset at K = 1 and 8 at 20 with both replays, the default's claims."""
        shipped = parse_yaml((ROOT / "config" / "config.yaml").read_text())
        config = parse_yaml((ROOT / "config" / "config.yaml").read_text())
        update_config(config, parse_yaml((ROOT / "config" / "resolve.yaml").read_text()))
        config = checked(config)
        points = grid_points(config)
        walls = [p for p in points if p["clock"] == "wall"]
        emulated = [p for p in points if p["clock"] == V100]
        assert (len(walls), len(emulated)) == (3 * 3 + 2 * 4, 26 * 3 + 20 * 2)
        assert {p["seed"] for p in emulated if p["k"] == 2} == set(range(26))
        assert {p["seed"] for p in emulated if p["k"] in (1, 8)} == set(range(20))
        assert len(replay_points(config)) == 20 * 2 * 2
        assert [(c["id"], c["contrast"]) for c in config["claims"]] == \
            [(c["id"], c["contrast"]) for c in shipped["claims"]]
        assert config["results"] == "results/resolve"

    def test_the_k2_overlay_adds_seeds_to_the_emulated_k2_arms_in_the_default_results(self):
        """config/resolve-k2.yaml over config/config.yaml: every default run, the emulated
        sync and K = 2 arms at 26 seeds, the paper's preset at the default's 3 with its
        replays, the default's claims, in the default's results directory."""
        shipped = parse_yaml((ROOT / "config" / "config.yaml").read_text())
        config = parse_yaml((ROOT / "config" / "config.yaml").read_text())
        update_config(config, parse_yaml((ROOT / "config" / "resolve-k2.yaml").read_text()))
        config = checked(config)
        default = {tuple(p.values()) for p in grid_points(checked(shipped))}
        points = grid_points(config)
        added = [p for p in points if tuple(p.values()) not in default]
        assert default <= {tuple(p.values()) for p in points}
        assert len(added) == 23 * 3
        assert {(p["clock"], p["k"]) for p in added} == {(V100, 0), (V100, 2)}
        assert {p["seed"] for p in added} == set(range(3, 26))
        assert len(replay_points(config)) == len(replay_points(checked(shipped)))
        assert config["claims"] == shipped["claims"]
        assert config["results"] == shipped["results"]

    def test_the_papers_setup_tests_its_claims_on_its_own_runs(self, tmp_path: Path):
        """config/paper.yaml alone: its claims name arms of its grid (check_pipeline refuses
        any that do not), and the schema's smallest effects fill in for its metrics."""
        config = parse_yaml((ROOT / "config" / "paper.yaml").read_text())
        build_stand_in(tmp_path / "m", "tiny")
        config["run"]["model"]["path"] = str(tmp_path / "m")
        config = checked(config)
        assert {c["id"] for c in config["claims"]} >= {"C1", "C2", "C3", "C4", "C6"}
        assert {c["metric"] for c in config["claims"]} <= set(config["sesoi"])
        assert gpus_named(config["run"]["model"]) == 2

    def test_the_gpu_overlay_is_the_papers_setup_reduced_to_one_gpu(self, tmp_path: Path):
        """config/gpu-smoke.yaml over config/paper.yaml, as Snakemake lays a second
        --configfile: sync and AReaL-style at K = 2 and 8, one seed, both roles on cuda:0,
        so that a run job asks for one GPU and `--resources gpu=1` runs the grid."""
        config = parse_yaml((ROOT / "config" / "paper.yaml").read_text())
        update_config(config, parse_yaml((ROOT / "config" / "gpu-smoke.yaml").read_text()))
        build_stand_in(tmp_path / "m", "tiny")
        config["run"]["model"]["path"] = str(tmp_path / "m")
        config = checked(config)
        assert sorted((p["mode"], p["k"], p["seed"]) for p in grid_points(config)) == [
            ("areal", 2, 0), ("areal", 8, 0), ("sync", 0, 0)]
        assert gpus_named(config["run"]["model"]) == 1
        assert config["run"]["train"]["updates"] == 24 and config["claims"]

    @pytest.mark.parametrize(("rollout", "trainer", "gpus"), [
        ("auto", "auto", 2), ("cuda:0", "cuda:0", 1), ("cuda", "cuda:0", 1),
        ("cuda:0", "cuda:1", 2), ("cpu", "cpu", 0), ("cpu", "cuda:1", 1)])
    def test_a_run_holds_the_gpus_its_devices_name(self, rollout: str, trainer: str,
                                                  gpus: int):
        assert gpus_named({"rollout_device": rollout, "trainer_device": trainer}) == gpus

    @pytest.mark.parametrize(("model", "runtime", "gpus"), [
        ({}, {"rollout_workers": 2, "trainer_ranks": 2}, 4),  # auto: a GPU each
        ({}, {"rollout_workers": 1, "trainer_ranks": 1}, 2),  # the pair
        ({"rollout_devices": ["cuda:0", "cuda:0"], "trainer_devices": ["cuda:1", "cuda:2"]},
         {"rollout_workers": 2, "trainer_ranks": 2}, 3),
        ({"rollout_device": "cpu", "trainer_device": "cpu"},
         {"rollout_workers": 2, "trainer_ranks": 2}, 0),
    ])
    def test_a_run_holds_a_gpu_for_each_worker_and_rank_it_places(
            self, model: dict, runtime: dict, gpus: int):
        assert gpus_named(model, runtime) == gpus

    def test_a_points_settings_are_run_then_its_preset_then_the_point(self):
        data = small_pipeline_config()
        data["grid"]["blocks"].append({"modes": ["areal"], "presets": ["paper"], "ks": [8],
                                       "objectives": ["a3po"], "clock": f"virtual:{V100}"})
        config = checked(data)
        point = grid_points(config)[-1]
        settings = run_settings(config, point)
        assert (settings["mode"], settings["preset_name"], settings["seed"]) == \
            ("areal", "paper", 0)
        assert settings["staleness"]["staleness_k"] == 8
        assert settings["staleness"]["interrupt"] == "resubmit"  # the preset's
        assert settings["train"]["objective"] == "a3po"
        assert settings["train"]["updates"] == config["run"]["train"]["updates"]  # run's
        assert settings["runtime"] == {**settings["runtime"], "clock": "virtual",
                                       "hardware": V100}
        # Snakemake's wildcards are strings: the same settings
        as_wildcards = {k: str(v) for k, v in point.items()}
        assert run_settings(config, as_wildcards) == settings


def edit_task_file(tmp_path: Path, fields: str, lines: list[dict[str, Any]],
                   verifier: str) -> Callable[[dict[str, Any]], None]:
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in lines))
    (tmp_path / "heldout.jsonl").write_text(json.dumps(
        {"gsm8k": GSM8K_LINE, "math": {"problem": "1+1?", "solution": "\\boxed{2}"}}[fields])
        + "\n")

    def edit(d: dict[str, Any]) -> None:
        d["run"]["task"] = {"suite": "jsonl", "fields": fields,
                            "train_path": str(tmp_path / "train.jsonl"),
                            "heldout_path": str(tmp_path / "heldout.jsonl")}
        d["run"]["reward"] = {"verifier": verifier}
    return edit


GSM8K_LINE = {"question": "What is 2 + 3?", "answer": "2 + 3 = 5\n#### 5"}


class TestChecks:
    @pytest.mark.parametrize(("edit", "message"), [
        # a path no run builds: the default's models/tiny is there after a make run
        (lambda d: (d.update(build_base=False),
                    d["run"].setdefault("model", {}).update(path="models/not-built")),
         "is not a Hugging Face model directory"),
        (lambda d: d.update(build_base="smollm2-135m"),
         "build_base 'smollm2-135m' names no packaged model: use one of "
         "smollm2-135m-instruct"),
        (lambda d: d["grid"]["blocks"][1].update(presets=["papr"]),
         "names preset 'papr', which is not in presets ['none', 'paper']"),
        (lambda d: d["grid"]["blocks"][0].update(ks=[0, 2]), "sync is on-policy"),
        (lambda d: d["figures"]["k_axis"].update(preset="none"), "the grid has no areal run"),
        (lambda d: d["grid"]["blocks"][1].update(clock="virtual:v100"),
         ("grid.blocks[1].clock = 'virtual:v100': there is no hardware profile 'v100'",
          "use one of " + ", ".join(sorted(p.stem for p in HARDWARE_DIR.glob("*.yaml"))))),
        (lambda d: d["grid"]["blocks"][1].update(clock="virtual:wall"), "NAME not 'wall'"),
        (lambda d: d["run"]["runtime"].update(clock="virtual"),
         "each grid block sets its runs' clock"),
        (lambda d: d["figures"]["k_axis"].update(clock=f"virtual:{V100}"),
         f"the grid has no areal run under preset 'paper' on clock 'virtual:{V100}'"),
        (lambda d: d["grid"]["blocks"].__setitem__(
            slice(None), [{**b, "clock": f"virtual:{V100}"} for b in d["grid"]["blocks"]]),
         "grid.blocks has no wall-clock block"),
        (lambda d: d["grid"]["replays"]["of"].update(ks=[8]), "selects no run of the grid"),
        (lambda d: d["figures"].update(window_s=[1.0, 0.5]), "the start must be before"),
        (lambda d: d["claims"][0]["contrast"].update({"wall/areal/paper/k8/pg": 1}),
         "claims[0] (T1) names the run arm 'wall/areal/paper/k8/pg', which the grid does not "
         "make"),
        (lambda d: d["claims"][1]["contrast"].update({"wall/areal/paper/k1/pg/a3po": 1}),
         "claims[1] (T2) names the replay arm 'wall/areal/paper/k1/pg/a3po'"),
        (lambda d: d["presets"]["paper"].update(task={
            "suite": "jsonl", "fields": "gsm8k",
            "train_path": str(ROOT / "rlcore" / "tasks" / "data" / "math" / "train.jsonl"),
            "heldout_path": str(ROOT / "rlcore" / "tasks" / "data" / "math" / "heldout.jsonl")}),
         "math/train.jsonl:1: 'question' is a required property"),
        (lambda d: d["sesoi"].pop("short_bias"),
         "claims[2] (T3) is on metric 'short_bias', which sesoi does not give a delta"),
        (lambda d: d.update(reported={"T9": {"figure": "0.2"}}),
         "reported.T9 names no claim of `claims` (T1, T2, T3)"),
    ], ids=["missing-model", "unknown-package", "unknown-preset", "sync-k", "k-axis",
            "unknown-profile", "profile-named-wall", "run-clock", "k-axis-clock", "no-wall-block",
            "replays-select-nothing", "window", "claim-arm", "claim-replay-arm",
            "preset-task-file", "claim-sesoi", "reported-id"])
    def test_what_the_schema_cannot_say_is_refused_with_the_fix(
            self, edit: Callable[[dict[str, Any]], None], message: str | tuple[str, ...]):
        data = small_pipeline_config()
        edit(data)
        with pytest.raises(ConfigError) as e:
            checked(data)
        for part in (message,) if isinstance(message, str) else message:
            assert part in str(e.value)

    @pytest.mark.parametrize(("fields", "lines", "message"), [
        ("gsm8k", [GSM8K_LINE, {"question": "What is 1 + 1?", "solution": "#### 2"}],
         "train.jsonl:2: 'answer' is a required property (task.fields 'gsm8k' reads the "
         "prompt from 'question' and the answer from 'answer')"),
        ("gsm8k", [{"question": 7, "answer": "#### 7"}],
         "train.jsonl:1: question: 7 is not of type 'string'"),
        ("gsm8k", [], "task file"),
    ], ids=["missing-column", "non-string-prompt", "empty-file"])
    def test_a_bad_task_file_is_refused_naming_its_line(self, tmp_path: Path, fields: str,
                                                         lines: list[dict[str, Any]],
                                                         message: str):
        data = small_pipeline_config()
        edit_task_file(tmp_path, fields, lines, "math")(data)
        with pytest.raises(ConfigError, match="holds no tasks" if not lines else None) as e:
            checked(data)
        assert message in str(e.value)

    def test_golds_are_left_to_the_run_so_reading_the_config_starts_no_worker(
            self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
        """A gold math-verify cannot read passes the config's checks (they start no
        math-verify process) and stops the run's preflight, which checks golds."""
        data = small_pipeline_config()
        edit_task_file(tmp_path, "math", [{"problem": "Expand.",
                                           "solution": "It is \\boxed{x^2+}"}], "math")(data)

        def no_workers(*args: Any, **kwargs: Any) -> None:
            raise AssertionError("a math-verify worker was started")

        with monkeypatch.context() as m:
            m.setattr("rlcore.tasks.reward.shared_verifier", no_workers)
            config = checked(data)
        cfg = config_from_dict(config["run"])
        with pytest.raises(ConfigError, match="math-verify reads no mathematical expression "
                                              "from the gold answer 'x\\^2\\+'"):
            check_suite(cfg.task, cfg.reward)  # what every run's preflight calls


CONFIG = ROOT / "config"


def test_an_overlay_given_alone_is_laid_over_its_base():
    files, said = config_files([CONFIG / "gpu-smoke.yaml"], ROOT, replaced=False)
    assert files == [CONFIG / "paper.yaml", CONFIG / "gpu-smoke.yaml"]
    assert said == ["config/gpu-smoke.yaml is laid over config/paper.yaml: reading that first"]


def test_bases_are_followed_as_a_chain_and_not_laid_twice():
    chain = [CONFIG / "paper.yaml", CONFIG / "paper-gsm8k.yaml", CONFIG / "gsm8k-sample.yaml"]
    assert config_files(chain[2:], ROOT, replaced=True)[0] == chain
    assert config_files(chain, ROOT, replaced=False) == (chain, [])


def test_the_workflow_config_lies_under_an_overlay_of_it_unless_a_whole_config_comes_first():
    study = CONFIG / "study.yaml"
    default = [CONFIG / "config.yaml", study]
    assert config_files([study], ROOT, replaced=False) == (default, [])
    assert config_files([study], ROOT, replaced=True) == (default, [])  # make run CONFIG=...
    assert config_files([CONFIG / "paper.yaml"], ROOT, replaced=False) == (
        [CONFIG / "paper.yaml"], [])


def test_an_overlay_cycle_or_a_missing_base_is_refused(tmp_path: Path):
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "a.yaml").write_text("overlays: b.yaml\n")
    (tmp_path / "config" / "b.yaml").write_text("overlays: a.yaml\n")
    (tmp_path / "config" / "c.yaml").write_text("overlays: gone.yaml\n")
    with pytest.raises(ConfigError, match="a cycle"):
        config_files([tmp_path / "config" / "a.yaml"], tmp_path, replaced=True)
    with pytest.raises(ConfigError, match="overlays: gone.yaml is no file beside it"):
        config_files([tmp_path / "config" / "c.yaml"], tmp_path, replaced=True)


def test_every_shipped_overlay_names_its_base():
    """An overlay (a config file that is no whole pipeline config) says what it lies over."""
    schema = ROOT / "workflow" / "schemas" / "config.schema.yaml"
    for path in sorted((ROOT / "config").glob("*.yaml")):
        data = parse_yaml(path.read_text())
        if "grid" in data or "run" in data or "results" in data:  # a pipeline config
            assert stands_alone([path], schema) or "overlays" in data, path.name
