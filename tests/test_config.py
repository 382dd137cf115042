"""The run config: defaults, file loading, schema validation messages, overrides, the schema."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rlcore.config import (
    ConfigError,
    RunConfig,
    config_from_dict,
    load_config,
    read_config_file,
    read_run_config,
    run_config_schema,
)
from rlcore.config.files import apply_overrides

TOP_LEVEL_KEYS = ["base", "eval", "mode", "model", "preset_name", "reward", "rollout", "runtime",
                  "seed", "staleness", "task", "train"]


def error_of(data: Any) -> str:
    with pytest.raises(ConfigError) as info:
        config_from_dict(data)
    return str(info.value)


class TestDefaults:
    def test_empty_dict_gives_the_documented_defaults(self) -> None:
        cfg = config_from_dict({})
        assert cfg == RunConfig()
        assert cfg.mode == "sync"
        assert cfg.model.path == "models/tiny"
        assert cfg.task.suite == "arith"
        assert cfg.task.operators == ("+",)
        assert cfg.train.updates == 400
        assert cfg.train.lr == pytest.approx(3e-4)
        assert cfg.train.betas == (0.9, 0.999)
        assert cfg.staleness.staleness_k == 0
        assert cfg.staleness.rollout_train_ratio is None

    def test_sequences_are_immutable_and_the_config_hashable(self) -> None:
        cfg = config_from_dict({"task": {"operators": ["+", "-"]}})
        with pytest.raises(AttributeError):
            cfg.task.operators.append("*")  # type: ignore[attr-defined]
        assert hash(cfg) == hash(config_from_dict({"task": {"operators": ["+", "-"]}}))

    def test_to_dict_round_trips_through_validation(self) -> None:
        cfg = config_from_dict({"seed": 3, "train": {"objective": "a3po", "lr": 1.0e-3}})
        assert config_from_dict(cfg.to_dict()) == cfg

    @pytest.mark.parametrize("data", [[], "mode: sync", 3, None])
    def test_a_non_mapping_is_rejected(self, data: Any) -> None:
        assert "must be a mapping" in error_of(data)


class TestConfigFiles:
    def test_partial_yaml_file_is_filled_with_defaults(self, tmp_path: Path) -> None:
        path = tmp_path / "run.yaml"
        path.write_text("seed: 7\ntrain:\n  updates: 12\n  lr: 1.0e-3\n")
        cfg = load_config(path)
        assert (cfg.seed, cfg.train.updates, cfg.train.lr) == (7, 12, 1e-3)
        assert cfg.train.update_batch_size == 32  # untouched key keeps its default
        assert cfg.rollout == RunConfig().rollout

    def test_partial_json_file_loads(self, tmp_path: Path) -> None:
        path = tmp_path / "run.json"
        path.write_text(json.dumps({"mode": "sync", "rollout": {"group_size": 8}}))
        cfg = load_config(path)
        assert cfg.rollout.group_size == 8
        assert cfg.train.update_batch_size == 32

    def test_empty_yaml_file_gives_defaults(self, tmp_path: Path) -> None:
        path = tmp_path / "empty.yaml"
        path.write_text("# nothing but a comment\n")
        assert load_config(path) == RunConfig()

    def test_overrides_apply_on_top_of_the_file(self, tmp_path: Path) -> None:
        path = tmp_path / "run.yaml"
        path.write_text("train:\n  updates: 12\n")
        cfg = load_config(path, ["train.updates=5", "seed=2"])
        assert (cfg.train.updates, cfg.seed) == (5, 2)

    def test_missing_file(self, tmp_path: Path) -> None:
        path = tmp_path / "nope.yaml"
        with pytest.raises(ConfigError, match="does not exist") as info:
            load_config(path)
        assert "nope.yaml" in str(info.value)

    def test_invalid_yaml(self, tmp_path: Path) -> None:
        path = tmp_path / "bad.yaml"
        path.write_text("train:\n  updates: [1, 2\n")
        with pytest.raises(ConfigError, match="not valid yaml") as info:
            load_config(path)
        assert "bad.yaml" in str(info.value)

    def test_invalid_json(self, tmp_path: Path) -> None:
        path = tmp_path / "bad.json"
        path.write_text('{"seed": 1,}')
        with pytest.raises(ConfigError, match="not valid json"):
            read_config_file(path)

    def test_top_level_list_is_rejected(self, tmp_path: Path) -> None:
        path = tmp_path / "list.yaml"
        path.write_text("- seed\n- 1\n")
        with pytest.raises(ConfigError, match="mapping at the top level"):
            read_config_file(path)

    def test_an_invalid_value_in_a_file_is_reported_with_its_key(self, tmp_path: Path) -> None:
        path = tmp_path / "run.yaml"
        path.write_text("rollout:\n  group_size: 0\n")
        with pytest.raises(ConfigError, match=r"rollout\.group_size"):
            load_config(path)


class TestUnknownKeys:
    def test_unknown_top_level_key(self) -> None:
        msg = error_of({"seed": 1, "learning_rate": 0.1})
        assert "unknown config key" in msg
        assert "learning_rate" in msg
        assert "allowed keys: " + ", ".join(TOP_LEVEL_KEYS) in msg

    def test_unknown_nested_key_names_its_section(self) -> None:
        msg = error_of({"train": {"updates": 3, "learning_rate": 0.1}})
        assert "learning_rate" in msg
        assert "under 'train'" in msg
        allowed = msg.split("allowed keys:", 1)[1]
        for key in ("updates", "lr", "objective", "max_grad_norm"):
            assert key in allowed
        assert "staleness_k" not in allowed  # only the keys of this section are listed

    def test_every_error_is_reported_at_once(self) -> None:
        msg = error_of({"bogus": 1, "model": {"paht": "x"}, "train": {"lr": "abc"}})
        assert "bogus" in msg
        assert "paht" in msg and "under 'model'" in msg
        assert "train.lr" in msg


class TestTypes:
    def test_wrong_type_names_key_value_and_expected_type(self) -> None:
        msg = error_of({"train": {"lr": "abc"}})
        assert "train.lr" in msg
        assert '"abc"' in msg
        assert "number" in msg

    def test_a_boolean_is_not_an_integer(self) -> None:
        msg = error_of({"seed": True})
        assert "'seed'" in msg and "integer" in msg

    def test_a_section_must_be_a_mapping(self) -> None:
        msg = error_of({"train": 5})
        assert "'train'" in msg and "object" in msg

    def test_list_items_are_type_checked(self) -> None:
        msg = error_of({"train": {"betas": [0.9, "x"]}})
        assert "train.betas.1" in msg

    def test_integral_float_for_an_integer_field_is_rejected_or_converted(self) -> None:
        try:
            cfg = config_from_dict({"train": {"updates": 4.0}})
        except ConfigError:
            return
        assert isinstance(cfg.train.updates, int)


class TestAllowedValues:
    def test_enum_violation_lists_the_allowed_values(self) -> None:
        msg = error_of({"train": {"objective": "ppo"}})
        assert "train.objective" in msg
        assert '"ppo"' in msg
        assert "allowed values: pg, behav_clip, decoupled, a3po" in msg

    def test_enum_inside_a_list(self) -> None:
        msg = error_of({"task": {"operators": ["+", "/"]}})
        assert "task.operators.1" in msg
        assert '"/"' in msg

    def test_minimum_violation(self) -> None:
        msg = error_of({"train": {"updates": 0}})
        assert "train.updates" in msg
        assert "is 0" in msg and ">= 1" in msg

    def test_exclusive_minimum_rejects_the_bound_itself(self) -> None:
        assert "train.lr" in error_of({"train": {"lr": 0}})

    def test_maximum_violation(self) -> None:
        msg = error_of({"train": {"clip_eps": 1.5}})
        assert "train.clip_eps" in msg and "<= 1" in msg

    def test_pattern_violation(self) -> None:
        assert "model.rollout_device" in error_of({"model": {"rollout_device": "gpu0"}})

    def test_values_on_the_bounds_are_accepted(self) -> None:
        cfg = config_from_dict({"train": {"updates": 1, "clip_eps": 1.0},
                                "eval": {"threshold": 0.0}})
        assert (cfg.train.updates, cfg.train.clip_eps, cfg.eval.threshold) == (1, 1.0, 0.0)

    def test_bound_in_the_message_is_not_mangled(self) -> None:
        msg = error_of({"base": {"warm_start_label_noise": 9}})
        assert "<= 0.95" in msg and "0.5" not in msg


class TestOptionalField:
    def test_null_is_accepted(self) -> None:
        cfg = config_from_dict({"staleness": {"rollout_train_ratio": None}})
        assert cfg.staleness.rollout_train_ratio is None

    def test_a_positive_number_is_accepted(self) -> None:
        cfg = config_from_dict({"staleness": {"rollout_train_ratio": 2.5}})
        assert cfg.staleness.rollout_train_ratio == 2.5

    @pytest.mark.parametrize("value", [-1, 0])
    def test_non_positive_is_rejected_against_the_number_branch(self, value: int) -> None:
        msg = error_of({"staleness": {"rollout_train_ratio": value}})
        assert "staleness.rollout_train_ratio" in msg
        assert "> 0" in msg

    def test_wrong_type_is_explained_against_the_number_branch(self) -> None:
        msg = error_of({"staleness": {"rollout_train_ratio": "fast"}})
        assert "staleness.rollout_train_ratio" in msg
        assert "number" in msg


class TestCrossFieldRules:
    @pytest.mark.parametrize(("data", "fragment"), [
        ({"mode": "sync"}, "sync on several devices runs on the virtual clock only"),
        ({"mode": "async"}, "the threaded baseline trains in one thread"),
        ({"mode": "areal", "runtime": {"trainer_workers": 2}}, "do not combine"),
        # B = 8, groups of 4: 5 samples may be two groups' remnants, one to a minibatch of 2
        ({"mode": "areal", "train": {"update_batch_size": 8, "minibatches": 2}},
         "may hold only 1 groups of up to 4, and every rank needs one"),
        # sync's batch is whole: 8 samples in 2 minibatches are one group each
        ({"mode": "sync", "train": {"update_batch_size": 8, "minibatches": 2},
          "runtime": {"clock": "virtual", "hardware": "v100x4-qwen0.5b-fp16"}},
         "may hold only 1 groups of up to 4, and every rank needs one"),
    ], ids=["sync-live", "async", "racing-trainers", "too-few-groups", "sync-too-few-groups"])
    def test_trainer_ranks_where_they_cannot_work(self, data: dict, fragment: str) -> None:
        data = {**data, "rollout": {"group_size": 4},
                "runtime": {**data.get("runtime", {}), "trainer_ranks": 2}}
        assert fragment in error_of(data)
        for mode, clock in (("areal", "wall"), ("sync", "virtual")):
            config_from_dict({"mode": mode, "rollout": {"group_size": 4},
                              "train": {"update_batch_size": 8},
                              "runtime": {"trainer_ranks": 2, "clock": clock}})

    def test_update_batch_size_must_be_a_multiple_of_group_size(self) -> None:
        msg = error_of({"train": {"update_batch_size": 10}, "rollout": {"group_size": 4}})
        assert "train.update_batch_size (10)" in msg
        assert "rollout.group_size (4)" in msg

    def test_update_batch_size_must_be_divisible_by_minibatches(self) -> None:
        msg = error_of({"train": {"update_batch_size": 8, "minibatches": 3},
                        "rollout": {"group_size": 4}})
        assert "train.minibatches (3)" in msg

    def test_async_minibatches_fit_the_smallest_batch_of_whole_groups(self) -> None:
        # B = 8, groups of 4: a batch of whole groups may hold 8 - 4 + 1 = 5 samples
        msg = error_of({"mode": "areal", "train": {"update_batch_size": 8, "minibatches": 8},
                        "rollout": {"group_size": 4}})
        assert "train.minibatches (8)" in msg and "smallest batch of whole groups (5" in msg
        config_from_dict({"mode": "areal", "train": {"update_batch_size": 8, "minibatches": 4},
                          "rollout": {"group_size": 4}})
        config_from_dict({"mode": "sync", "train": {"update_batch_size": 8, "minibatches": 8},
                          "rollout": {"group_size": 4}})  # sync batches are always B

    @pytest.mark.parametrize("paths", [{}, {"train_path": "t.jsonl"},
                                       {"heldout_path": "h.jsonl"}])
    def test_jsonl_suite_needs_both_paths(self, paths: dict[str, str]) -> None:
        msg = error_of({"task": {"suite": "jsonl", **paths}})
        assert "task.train_path" in msg and "task.heldout_path" in msg

    def test_jsonl_suite_with_both_paths_is_valid(self) -> None:
        cfg = config_from_dict({"task": {"suite": "jsonl", "train_path": "t.jsonl",
                                         "heldout_path": "h.jsonl"}})
        assert cfg.task.train_path == "t.jsonl"

    @pytest.mark.parametrize("setting", [{"fields": "gsm8k"},
                                         {"prompt_template": "Q: {prompt}"},
                                         {"system_prompt": "Be brief."}])
    def test_file_prompt_settings_are_refused_on_a_generated_suite(
            self, setting: dict[str, str]) -> None:
        msg = error_of({"model": {"prompt_format": "chat"}, "task": {"suite": "chain", **setting}})
        assert f"task.{next(iter(setting))}" in msg and "'chain'" in msg

    @pytest.mark.parametrize(("template", "fragment"), [
        ("Q: {question}", "no other field"),
        ("Put the answer in \\boxed{}. {prompt}", "no other field"),
        ("{prompt} {", "Single '{'"),
        ("no field at all", "must contain {prompt}"),
        ("{prompt} {0}", "no other field"),
    ])
    def test_a_bad_prompt_template_is_refused_before_any_job(self, template: str,
                                                            fragment: str) -> None:
        msg = error_of({"task": {"suite": "jsonl", "train_path": "t.jsonl",
                                 "heldout_path": "h.jsonl", "prompt_template": template}})
        assert "task.prompt_template" in msg and fragment in msg

    def test_a_system_prompt_needs_the_chat_format(self) -> None:
        task = {"suite": "jsonl", "train_path": "t.jsonl", "heldout_path": "h.jsonl",
                "system_prompt": "Reason step by step.",
                "prompt_template": "{prompt}\nPut the final answer in \\boxed{{}}."}
        msg = error_of({"task": task})
        assert "task.system_prompt" in msg and "model.prompt_format 'chat'" in msg
        cfg = config_from_dict({"task": task, "model": {"prompt_format": "chat"}})
        assert cfg.task.system_prompt == "Reason step by step."

    def test_sync_mode_rejects_staleness(self) -> None:
        msg = error_of({"mode": "sync", "staleness": {"staleness_k": 1}})
        assert "staleness.staleness_k" in msg and "got 1" in msg

    def test_async_mode_allows_staleness(self) -> None:
        cfg = config_from_dict({"mode": "async", "staleness": {"staleness_k": 1}})
        assert cfg.staleness.staleness_k == 1

    @pytest.mark.parametrize("knob", [{"dual_clip": 2.0}, {"clip_eps_high": 0.28},
                                      {"behav_weight_cap": 5.0}])
    def test_pg_refuses_the_correction_knobs(self, knob: dict[str, float]) -> None:
        msg = error_of({"train": {"objective": "pg", **knob}})
        assert f"train.{next(iter(knob))}" in msg and "'pg'" in msg

    def test_behav_clip_refuses_a_behaviour_weight_cap(self) -> None:
        msg = error_of({"train": {"objective": "behav_clip", "behav_weight_cap": 5.0}})
        assert "train.behav_weight_cap" in msg and "decoupled or a3po" in msg

    def test_clamp_mode_needs_a_cap(self) -> None:
        msg = error_of({"train": {"objective": "decoupled", "behav_weight_mode": "clamp"}})
        assert "train.behav_weight_cap" in msg

    def test_dual_clip_must_exceed_one(self) -> None:
        assert "train.dual_clip" in error_of({"train": {"objective": "decoupled",
                                                        "dual_clip": 1.0}})

    @pytest.mark.parametrize("objective", ["decoupled", "a3po"])
    def test_every_knob_together_is_valid_where_it_means_something(self, objective: str
                                                                   ) -> None:
        cfg = config_from_dict({"train": {
            "objective": objective, "clip_eps_high": 0.28, "dual_clip": 3.0,
            "behav_weight_cap": 5.0, "behav_weight_mode": "clamp"}})
        assert (cfg.train.dual_clip, cfg.train.behav_weight_mode) == (3.0, "clamp")


class TestOverrides:
    def test_dotted_keys_and_yaml_values(self) -> None:
        out = apply_overrides({"train": {"updates": 3}}, [
            "train.updates=10",
            "train.lr=0.001",
            "train.normalize_advantage=true",
            "task.operators=[+, '-']",
            "model.path=some/dir",
            "staleness.rollout_train_ratio=null",
            "seed=5",
        ])
        assert out == {
            "train": {"updates": 10, "lr": 0.001, "normalize_advantage": True},
            "task": {"operators": ["+", "-"]},
            "model": {"path": "some/dir"},
            "staleness": {"rollout_train_ratio": None},
            "seed": 5,
        }
        cfg = config_from_dict(out)
        assert cfg.task.operators == ("+", "-")

    def test_the_input_mapping_is_not_changed(self) -> None:
        data = {"train": {"updates": 3}}
        apply_overrides(data, ["train.updates=10", "rollout.group_size=2"])
        assert data == {"train": {"updates": 3}}

    def test_later_override_wins_and_value_may_contain_equals(self) -> None:
        out = apply_overrides({}, ["seed=1", "seed=2", "model.path=a=b"])
        assert out == {"seed": 2, "model": {"path": "a=b"}}

    def test_a_value_that_yaml_reads_as_a_string_is_caught_by_validation(self) -> None:
        with pytest.raises(ConfigError, match="train.updates"):
            config_from_dict(apply_overrides({}, ["train.updates=ten"]))

    def test_override_without_equals_is_malformed(self) -> None:
        with pytest.raises(ConfigError, match="train.updates") as info:
            apply_overrides({}, ["train.updates"])
        assert "section.key=value" in str(info.value)

    def test_override_through_a_scalar_is_rejected(self) -> None:
        with pytest.raises(ConfigError, match="'seed' is not a section"):
            apply_overrides({"seed": 0}, ["seed.value=1"])

    def test_unparseable_value_raises_config_error(self) -> None:
        with pytest.raises(ConfigError, match="train.betas"):
            apply_overrides({}, ["train.betas=[0.9"])

    def test_exponent_without_a_dot_is_a_number(self) -> None:
        cfg = config_from_dict(apply_overrides({}, ["train.lr=1e-4"]))
        assert cfg.train.lr == pytest.approx(1e-4)


def _properties(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """Every (dotted path, property schema) pair, recursing into sections, lists and anyOf."""
    if isinstance(node, dict):
        for name, prop in node.get("properties", {}).items():
            yield f"{path}{name}", prop
            yield from _properties(prop, f"{path}{name}.")
        for branch in node.get("anyOf", []):
            yield from _properties(branch, path)
        if "items" in node:
            yield from _properties(node["items"], path)


class TestSchema:
    def test_every_property_has_a_description(self) -> None:
        props = dict(_properties(run_config_schema()))
        # Guard against a walk that silently finds nothing.
        assert {"mode", "train", "train.lr", "staleness.rollout_train_ratio",
                "base.warm_start_label_noise"} <= set(props)
        missing = [p for p, s in props.items()
                   if not (isinstance(s.get("description"), str) and s["description"].strip())]
        assert missing == []

    def test_every_section_is_closed(self) -> None:
        schema = run_config_schema()
        assert schema["additionalProperties"] is False
        for name in TOP_LEVEL_KEYS:
            if schema["properties"][name].get("type") == "object":
                assert schema["properties"][name]["additionalProperties"] is False, name

    def test_schema_is_json_serialisable_and_names_its_dialect(self) -> None:
        schema = json.loads(json.dumps(run_config_schema()))
        assert schema["$schema"].endswith("2020-12/schema")
        assert set(schema["properties"]) == set(TOP_LEVEL_KEYS)

    def test_optional_field_keeps_its_constraint_on_the_non_null_branch(self) -> None:
        prop = run_config_schema()["properties"]["staleness"]["properties"]["rollout_train_ratio"]
        number, null = prop["anyOf"]
        assert number == {"type": "number", "exclusiveMinimum": 0}
        assert null == {"type": "null"}

    def test_shipped_config_file_is_valid(self) -> None:
        path = Path(__file__).resolve().parent.parent / "config" / "config.yaml"
        assert config_from_dict(read_config_file(path)).train.lr == pytest.approx(3e-4)

    def test_pipeline_config_contributes_its_run_section(self, tmp_path: Path) -> None:
        path = tmp_path / "pipeline.yaml"
        path.write_text("run: {seed: 5}\ngrid: {modes: {sync: [0]}}\n")
        assert read_config_file(path) == {"seed": 5}
        assert read_run_config(path)[1] == (
            f"{path}: running its 'run:' section (grid: the pipeline's, ignored here)")

    def test_a_run_section_alone_runs(self, tmp_path: Path) -> None:
        # the shape of config/config.yaml without its grid: refused as ['run'] before
        path = tmp_path / "mine.yaml"
        path.write_text("run: {mode: sync, train: {updates: 3}}\n")
        assert load_config(path).train.updates == 3
        assert read_run_config(path)[1] == f"{path}: running its 'run:' section"

    def test_an_overlay_runs_its_run_section_over_its_bases(self, tmp_path: Path) -> None:
        (tmp_path / "base.yaml").write_text("run: {seed: 5, train: {updates: 3, lr: 0.1}}\n")
        (tmp_path / "mid.yaml").write_text("overlays: base.yaml\nrun: {train: {lr: 0.2}}\n")
        (tmp_path / "top.yaml").write_text("overlays: mid.yaml\ngrid: {seeds: [0]}\n")
        assert read_config_file(tmp_path / "mid.yaml") == {
            "seed": 5, "train": {"updates": 3, "lr": 0.2}}
        assert read_config_file(tmp_path / "top.yaml") == read_config_file(tmp_path / "mid.yaml")
        assert read_run_config(tmp_path / "mid.yaml")[1] == (
            f"{tmp_path / 'mid.yaml'}: running its 'run:' section laid over that of base.yaml")

    def test_an_overlay_cycle_is_refused(self, tmp_path: Path) -> None:
        (tmp_path / "a.yaml").write_text("overlays: b.yaml\n")
        (tmp_path / "b.yaml").write_text("overlays: a.yaml\n")
        with pytest.raises(ConfigError, match="overlays: a cycle"):
            read_config_file(tmp_path / "a.yaml")

    def test_the_shipped_gsm8k_overlay_runs_the_papers_model_on_gsm8k(self) -> None:
        config = Path(__file__).resolve().parent.parent / "config"
        cfg = config_from_dict(read_config_file(config / "paper-gsm8k.yaml"))
        paper = config_from_dict(read_config_file(config / "paper.yaml"))
        assert (cfg.task.suite, cfg.reward.verifier) == ("jsonl", "math")
        assert cfg.model == paper.model and cfg.train == paper.train

    def test_a_run_key_beside_the_run_section_is_refused_not_lost(self, tmp_path: Path) -> None:
        path = tmp_path / "mixed.yaml"
        path.write_text("run: {mode: sync}\nseed: 3\n")
        with pytest.raises(ConfigError, match=r"run keys beside it \(seed\): move them"):
            read_config_file(path)

    def test_a_runs_record_runs_its_recorded_config(self, tmp_path: Path) -> None:
        # a run directory's config.json: the resolved config beside what the run recorded
        recorded = dataclasses.asdict(config_from_dict({"seed": 7}))
        (tmp_path / "config.json").write_text(json.dumps(
            {"config": recorded, "environment": {}, "base_model": {}, "devices": {},
             "clock": {}}))
        for given in (tmp_path, tmp_path / "config.json"):  # the directory or its file
            assert load_config(given).seed == 7
        assert "is a run's record" in (read_run_config(tmp_path)[1] or "")


class TestFrozen:
    def test_top_level_field_cannot_be_assigned(self) -> None:
        cfg = config_from_dict({})
        with pytest.raises(dataclasses.FrozenInstanceError):
            cfg.seed = 1  # type: ignore[misc]

    def test_section_cannot_be_replaced_or_changed(self) -> None:
        cfg = config_from_dict({})
        with pytest.raises(dataclasses.FrozenInstanceError):
            cfg.train = cfg.train  # type: ignore[misc]
        with pytest.raises(dataclasses.FrozenInstanceError):
            cfg.train.lr = 1.0  # type: ignore[misc]

    def test_replace_makes_a_new_object(self) -> None:
        cfg = config_from_dict({})
        changed = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, updates=7))
        assert (changed.train.updates, cfg.train.updates) == (7, 400)
