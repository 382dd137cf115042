"""Documentation that is generated from code stays in step with it."""

from __future__ import annotations

from pathlib import Path

from rlcore.config import config_from_dict, config_reference_markdown, read_config_file

ROOT = Path(__file__).resolve().parents[1]


def test_config_readme_is_current():
    expected = config_reference_markdown() + "\n"
    assert (ROOT / "config" / "README.md").read_text() == expected, (
        "config/README.md is stale: run `rlcore config-schema --markdown > config/README.md`")


def test_shipped_configs_validate():
    for path in sorted((ROOT / "config").glob("*.yaml")):
        config_from_dict(read_config_file(path))


def test_summary_schema_is_shared_with_the_workflow():
    workflow = ROOT / "workflow" / "schemas" / "summary.schema.json"
    assert workflow.read_text() == (ROOT / "rlcore" / "schemas" / "summary.schema.json").read_text()
