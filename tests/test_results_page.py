"""tools/results_page.py writes docs/results.md from a make run's results: each table as the
pipeline wrote it, under a lead sentence that says what the table holds."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import ModuleType

import pytest

from tests.tool_module import load_tool

FINDINGS = (  # as rlcore/analysis/claims_text.py writes it: an item a line
    "- **C1** stricter freshness reduces accepted throughput (seed 000, Table 1): **supported** "
    "on this machine's clock; **unresolved at this power** on the emulated v100x2-qwen0.5b-fp16.\n"
    "- **C2** moderate staleness improves short-horizon quality relative to sync (seed 000, "
    "Table 1): **unresolved at this power** on the emulated v100x2-qwen0.5b-fp16.\n")
K_SWEEP = """\
| clock | mode | preset | staleness_k |
|---|---|---|---|
| wall | sync | none | 0 |
| wall | areal | areal_defaults | 2 |
| wall | areal | paper | 1 |
"""


@pytest.fixture
def tool(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    module = load_tool("results_page")
    monkeypatch.setattr(module, "measured_fingerprint", lambda results: "sha256:0")
    monkeypatch.setattr(module, "golden_fingerprint", lambda: "sha256:0")
    monkeypatch.setattr(module, "host", lambda results: "a CPU; 2 cores; kernels portable")
    return module


@pytest.fixture
def results(tmp_path: Path) -> Path:
    """A make run's results: one run of each kind of job, and the tables."""
    for kind, job_s in (("runs/wall/sync/none/k0/pg/seed0", 10.0),
                        ("runs/v100x2-qwen0.5b-fp16/sync/none/k0/pg/seed0", 17.0),
                        ("replays/v100x2-qwen0.5b-fp16/areal/paper/k1/pg/seed0/decoupled",
                         19.0)):
        (tmp_path / kind).mkdir(parents=True)
        (tmp_path / kind / "summary.json").write_text(json.dumps({"time": {"job_s": job_s}}))
    tables = tmp_path / "tables"
    tables.mkdir()
    (tables / "findings.md").write_text(FINDINGS)
    (tables / "k_sweep.md").write_text(K_SWEEP)
    (tables / "claims.md").write_text("| claim |\n|---|\n| C1 |\n")
    return tmp_path


def test_the_findings_stay_a_list_one_item_a_claim(tool: ModuleType, results: Path):
    page = tool.page(results)
    items = re.findall(r"^- \*\*C\d\*\*", page, re.M)
    assert items == ["- **C1**", "- **C2**"], "the findings were folded into one paragraph"
    findings = page.split("## Findings", 1)[1].split("\n## ", 1)[0].strip().split("\n\n")[1]
    lines = findings.splitlines()
    assert len(lines) > 2 and all(len(line) <= 92 for line in lines)  # each item wrapped
    assert all(line.startswith(("- **C", "  ")) for line in lines)  # continuations indented


def test_a_lead_sentence_keeps_a_paths_case(tool: ModuleType, results: Path):
    page = tool.page(results)
    assert "Docs/" not in page and "docs/claims.md says how a verdict is reached" in page


def test_the_k_sweep_lead_says_it_holds_every_configuration(tool: ModuleType, results: Path):
    """The K sweep table has a row per configuration of the grid, every preset's: its lead
    must not say it is one preset's."""
    section = tool.page(results).split("## The K sweep", 1)[1].split("\n## ", 1)[0]
    lead = section.strip().split("\n\n", 1)[0]
    assert "preset at each K" not in lead and "every configuration" in lead.lower()


def test_the_job_times_a_page_states_read_back(tool: ModuleType, results: Path):
    page = tool.page(results)
    medians, cores = tool.job_times(page)
    assert medians == {"live runs": 10.0, "emulated runs": 17.0, "replays": 19.0}
    assert cores == 2
    # 3 live runs alone, 4 emulated runs and 2 replays two at a time:
    # 3 * 10 + (4 * 17 + 2 * 19) / 2 = 30 + 53 = 83 s
    counts = {"live": 3, "virtual": 4, "replays": 2}
    assert tool.grid_seconds(counts, medians, cores) == pytest.approx(83.0)
    assert tool.duration(83.0) == "1 minute"
    assert tool.duration(89.4 * 60) == "89 minutes" and tool.duration(150 * 60) == "2.5 hours"


def real_results(root: Path) -> Path:
    """config/real.yaml's results: two seeds of one arm, the base model's eval, a table."""
    for seed, (greedy, sampled, wall) in enumerate([(0.75, 0.70, 200.0), (0.80, 0.74, 220.0)]):
        run = root / f"runs/wall/sync/none/k0/pg/seed{seed}"
        run.mkdir(parents=True)
        run.joinpath("summary.json").write_text(json.dumps({
            "run": {"mode": "sync", "preset": "none", "k": 0}, "updates": 25,
            "time": {"wall_s": wall, "job_s": wall + 40}, "load": {"contended": seed == 1}}))
        run.joinpath("eval.json").write_text(json.dumps(
            {"greedy_pass_rate": greedy, "sampled_pass_rate": sampled}))
    (root / "runs/wall/sync/none/k0/pg/seed0/eval_base.json").write_text(json.dumps(
        {"tasks": 100, "samples_per_task": 2, "greedy_pass_rate": 0.3,
         "sampled_pass_rate": 0.2}))
    (root / "tables").mkdir()
    (root / "tables/claims.md").write_text("| claim |\n|---|\n| R1 |\n")
    return root


def test_the_real_study_has_a_section_of_its_own(tool: ModuleType, results: Path,
                                                 tmp_path: Path):
    """`--real` writes the study's section after the default grid's part, and retaking
    either part keeps the other."""
    real = real_results(tmp_path / "real")
    out = tmp_path / "results.md"
    tool.main([str(results), "--out", str(out)])
    default_part = out.read_text()
    tool.main(["--real", str(real), "--out", str(out)])
    both = out.read_text()
    assert both.startswith(default_part) and tool.REAL_HEADING in both
    section = both.split(tool.REAL_HEADING, 1)[1]
    prose = re.sub(r"\s+", " ", section)
    # the base: 30 of 100 greedily (Wilson 0.219-0.396), 40 of 200 sampled (0.150-0.261)
    assert "greedy pass 0.300 (95 % 0.219-0.396), sampled 0.200 (0.150-0.261" in prose
    # the arm: mean of 0.75 and 0.80 +- t(1) x sd / sqrt 2 = 12.706 x 0.025; 8.4 s an update
    assert "| sync/none/k0 | 2 | 0.775 ± 0.318 | 0.720 ± 0.254 | 8.4 | 1 |" in section
    assert "### claims" in section
    tool.main([str(results), "--out", str(out)])  # the default part again: the section stays
    assert out.read_text() == both
