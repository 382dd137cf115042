"""tools/profile_run.py: which runs it profiles, and how it reads a profile."""

from __future__ import annotations

import cProfile
import importlib.util
from pathlib import Path

from tests.tool_module import load_tool

ROOT = Path(__file__).resolve().parents[1]


def test_it_profiles_the_first_wall_clock_sync_run_and_an_emulated_areal_run():
    tool = load_tool("profile_run")
    points = tool.profiled_points(tool.pipeline_config([ROOT / "config" / "config.yaml"]))
    assert (points["sync"]["mode"], points["sync"]["clock"]) == ("sync", "wall")
    assert points["areal"]["mode"] == "areal" and points["areal"]["clock"] != "wall"


def test_a_part_sums_the_calls_and_seconds_of_its_function_in_its_file(tmp_path: Path):
    tool = load_tool("profile_run")
    source = tmp_path / "rlcore" / "policy" / "decoders.py"
    source.parent.mkdir(parents=True)
    source.write_text("def forward(n):\n    return sum(range(n))\n")
    spec = importlib.util.spec_from_file_location("toy_decoders", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    profiler = cProfile.Profile()
    profiler.runcall(lambda: [module.forward(10_000) for _ in range(3)])
    profiler.dump_stats(tmp_path / "p.prof")
    parts = tool.parts(tmp_path / "p.prof")
    assert parts["decode step"]["calls"] == 3 and parts["decode step"]["s"] > 0
    assert parts["update"] == {"s": 0.0, "calls": 0.0}
