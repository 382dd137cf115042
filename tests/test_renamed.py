"""Config keys renamed this release: read under their new names, with a message, for one release."""

from __future__ import annotations

import copy

from rlcore.config import config_from_dict
from rlcore.config.renamed import PIPELINE_RENAMES, RUN_RENAMES, upgrade
from rlcore.record.identity import RunId

OLD_PIPELINE = {
    "run": {"mode": "sync", "policy_name": "none"},
    "grid": {"seeds": [0],
             "blocks": [{"modes": ["sync"], "policies": ["none"], "ks": [0],
                         "objectives": ["pg"]},
                        {"modes": ["areal"], "presets": ["paper"], "ks": [1],
                         "objectives": ["pg"]}],
             "replays": {"of": {"modes": ["areal"], "policies": ["paper"], "ks": [1],
                                "objectives": ["pg"]}, "objectives": ["a3po"]}},
    "policies": {"none": {}, "paper": {"staleness": {"interrupt": "resubmit"}}},
    "figures": {"trace": {"policy": "paper", "k": 1, "objective": "pg", "seed": 0},
                "k_axis": {"mode": "areal", "policy": "paper"}},
}


def test_every_old_pipeline_key_moves_to_its_new_name_with_a_message_each():
    config = copy.deepcopy(OLD_PIPELINE)
    messages = upgrade(config, PIPELINE_RENAMES)
    assert config["presets"] == OLD_PIPELINE["policies"] and "policies" not in config
    assert config["grid"]["blocks"][0]["presets"] == ["none"]
    assert config["grid"]["blocks"][1] == OLD_PIPELINE["grid"]["blocks"][1]  # new already
    assert config["grid"]["replays"]["of"]["presets"] == ["paper"]
    assert config["figures"]["trace"]["preset"] == "paper"
    assert config["figures"]["k_axis"] == {"mode": "areal", "preset": "paper"}
    assert config["run"] == {"mode": "sync", "preset_name": "none"}
    # one message per moved key, naming where it was: six old keys, the second block's new
    assert len(messages) == 6
    assert messages[0].startswith("config.policies is now config.presets (")
    assert "config.grid.blocks[0].policies is now config.grid.blocks[0].presets" in messages[1]
    assert all("read in this release only" in m for m in messages)
    assert upgrade(config, PIPELINE_RENAMES) == []  # an upgraded config has nothing left


def test_an_old_name_laid_over_the_shipped_new_one_wins():
    """Snakemake lays a user's old-style --configfile over the shipped config: both names."""
    config = {"presets": {"none": {}, "areal_defaults": {"x": 1}},
              "policies": {"areal": {"y": 2}, "none": {"z": 3}},
              "figures": {"trace": {"preset": "areal_defaults", "policy": "areal"}}}
    messages = upgrade(config, PIPELINE_RENAMES)
    assert config["presets"] == {"none": {"z": 3}, "areal_defaults": {"x": 1}, "areal": {"y": 2}}
    assert config["figures"]["trace"] == {"preset": "areal"}
    assert "laid over the presets also set there" in messages[0]


def test_a_run_config_with_the_old_key_loads_and_says_so(capsys):
    data = {"mode": "areal", "policy_name": "paper"}
    cfg = config_from_dict(data)
    assert cfg.preset_name == "paper"
    assert data == {"mode": "areal", "policy_name": "paper"}  # the caller's mapping is kept
    err = capsys.readouterr().err
    assert "rlcore: config.policy_name is now config.preset_name" in err
    assert upgrade({"preset_name": "paper"}, RUN_RENAMES) == []


def test_a_summary_written_before_the_rename_still_names_its_run():
    old = {"clock": "wall", "mode": "areal", "policy": "paper", "k": 2, "objective": "pg",
           "seed": 0, "replayed": None}
    run = RunId.from_dict(old)
    assert run.preset == "paper" and run.path() == "wall/areal/paper/k2/pg/seed0"
