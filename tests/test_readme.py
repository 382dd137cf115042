"""README states what the default config runs, and what it states matches the config: the
task, its answer lengths, the model's size and the grid's counts. Deleting a statement fails
these tests as surely as a wrong one."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from snakemake.utils import validate

from rlcore.config import RunConfig, config_from_dict
from rlcore.pipeline.grid import grid_points, replay_points, wall_points
from rlcore.policy.tiny import build_char_tokenizer, build_model
from rlcore.tasks.suites import load_suite

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


@pytest.fixture(scope="module")
def default() -> tuple[dict[str, Any], RunConfig]:
    """config/config.yaml as the Snakefile holds it (schema defaults filled), and its run."""
    data = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    validate(data, str(ROOT / "workflow" / "schemas" / "config.schema.yaml"))
    return data, config_from_dict(data["run"])


def stated(pattern: str) -> tuple[str, ...]:
    """The groups of README's one statement matching `pattern`."""
    found = re.findall(pattern, re.sub(r"\s+", " ", README))
    assert len(found) == 1, f"README should state {pattern!r} once; found {found}"
    return found[0] if isinstance(found[0], tuple) else (found[0],)


def test_readme_is_a_front_page():
    assert len(README.splitlines()) <= 150, "README is a front page: move reference to docs/"


def test_the_task_and_its_answer_lengths(default: tuple[dict[str, Any], RunConfig]):
    _, cfg = default
    assert stated(r"the `(\w+)` task") == (cfg.task.suite,)
    tokenizer = build_char_tokenizer()
    suite = load_suite(cfg.task)
    # a response is its answer and the stop token the policy must sample to end it
    lengths = [len(tokenizer.encode(t.answer, add_special_tokens=False)) + 1
               for split in ("train", "heldout") for t in suite.split(split)]
    low, high = stated(r"answers of (\d+) to (\d+) tokens")
    assert (int(low), int(high)) == (min(lengths), max(lengths))


def test_the_model_size(default: tuple[dict[str, Any], RunConfig]):
    _, cfg = default
    params = sum(p.numel() for p in build_model(cfg.base, build_char_tokenizer()).parameters())
    (size,) = stated(r"a (\d+)k-parameter `Qwen2ForCausalLM`")
    assert int(size) == round(params / 1e4) * 10  # to two figures: 129,792 is "130k"


def test_the_grid(default: tuple[dict[str, Any], RunConfig]):
    data, cfg = default
    live, virtual, replays = stated(
        r"There are (\d+) runs on this machine's clock, (\d+) under the virtual clock of the "
        r"paper's two V100s, and (\d+) replays")
    assert int(live) == len(wall_points(data))
    assert int(virtual) == len(grid_points(data)) - len(wall_points(data))
    assert int(replays) == len(replay_points(data))
    assert stated(r"(\d+) updates of (\d+) samples each") == (
        str(cfg.train.updates), str(cfg.train.update_batch_size))
    seeds = data["grid"]["seeds"]
    assert stated(r"seeds (\d+) to (\d+)") == (str(min(seeds)), str(max(seeds)))


def test_the_documentation_list_names_every_page():
    """README's *Documentation* names each page of docs/ once, and no page that is not
    there: the list is the reader's map."""
    section = README.split("## Documentation", 1)[1]
    named = re.findall(r"^- (docs/[\w.]+\.md|config/README\.md):", section, re.M)
    pages = sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))
    assert sorted(n for n in named if n.startswith("docs/")) == pages
    assert len(named) == len(set(named)) and "config/README.md" in named
