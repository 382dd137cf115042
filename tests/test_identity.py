"""A run's name: formatted, parsed and derived in rlcore/record/identity.py only."""

from __future__ import annotations

import pytest

from rlcore.config import config_from_dict
from rlcore.errors import ConfigError
from rlcore.record.identity import WALL_CLOCK, RunId, format_arm, parse_arm


class TestFormats:
    run = RunId("wall", "areal", "paper", 8, "pg", 3)

    def test_a_run_formats_its_directory_file_stem_and_arm(self):
        assert self.run.path() == "wall/areal/paper/k8/pg/seed3"
        assert self.run.file_stem() == "wall/areal-paper-k8-pg-seed3"
        assert self.run.arm() == "wall/areal/paper/k8/pg"
        assert not self.run.is_replay

    def test_a_replay_adds_the_objective_it_is_replayed_under(self):
        replay = self.run.replayed_under("a3po")
        assert replay.path() == "wall/areal/paper/k8/pg/seed3/a3po"
        assert replay.file_stem() == "wall/areal-paper-k8-pg-seed3-a3po"
        assert replay.arm() == "wall/areal/paper/k8/pg/a3po"
        assert replay.is_replay and self.run.replayed is None  # the run is unchanged

    def test_the_dict_round_trips(self):
        replay = self.run.replayed_under("decoupled")
        assert RunId.from_dict(replay.to_dict()) == replay
        assert self.run.to_dict() == {"clock": "wall", "mode": "areal", "preset": "paper",
                                      "k": 8, "objective": "pg", "seed": 3, "replayed": None}


class TestArms:
    @pytest.mark.parametrize("name", [RunId("v100", "sync", "none", 0, "pg", 0),
                                      RunId("wall", "async", "areal", 2, "a3po", 1,
                                            replayed="pg")])
    def test_an_arm_parses_back_to_its_fields(self, name: RunId):
        fields = parse_arm(name.arm())
        assert fields == {k: v for k, v in name.to_dict().items() if k != "seed"}
        assert format_arm(**fields) == name.arm()

    @pytest.mark.parametrize("text", ["wall/areal/paper/1/pg", "wall/areal/paper/k1",
                                      "wall/areal/paper/k1/pg/a3po/x", "wall//paper/k1/pg",
                                      "wall/areal/paper/kx/pg"])
    def test_a_malformed_arm_says_how_to_write_one(self, text: str):
        with pytest.raises(ConfigError, match="CLOCK/MODE/PRESET/kK/OBJECTIVE"):
            parse_arm(text)


class TestFromConfig:
    def test_a_wall_clock_run_of_a_named_preset(self):
        cfg = config_from_dict({"mode": "areal", "seed": 2, "preset_name": "paper",
                                "staleness": {"staleness_k": 4},
                                "train": {"objective": "decoupled"}})
        name = RunId.of(cfg, {"kind": "wall", "hardware": None})
        assert name == RunId(WALL_CLOCK, "areal", "paper", 4, "decoupled", 2)

    def test_a_virtual_run_is_named_by_its_profile_and_an_unnamed_preset_is_custom(self):
        cfg = config_from_dict({"mode": "sync"})
        name = RunId.of(cfg, {"kind": "virtual", "hardware": "v100x2-qwen0.5b-fp16"})
        assert name.path() == "v100x2-qwen0.5b-fp16/sync/custom/k0/pg/seed0"

    def test_a_preset_name_that_cannot_be_a_path_level_is_refused(self):
        with pytest.raises(ConfigError, match="preset_name"):
            config_from_dict({"preset_name": "a/b"})
