"""Write docs/results.md from a finished `make run` of the default grid: its findings, claims
and tables as a run of them last gave, the host they were measured on, and what of them is
deterministic. Retaken, never edited:

    make run && python tools/results_page.py results
    make run CONFIG="config/config.yaml config/real.yaml" && \
        python tools/results_page.py --real results/real   # the real model's section
    make run CONFIG="config/config.yaml config/split.yaml" && \
        python tools/results_page.py --split results/split   # the split study's section

The emulated runs and the replays are a function of the config, so their rows hold on any
host; the page carries a fingerprint of their final weights, which tests/test_docs.py checks
against tests/golden/virtual_grid.json, so that a change of those results retakes the page.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import statistics
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "results.md"
GOLDEN = ROOT / "tests" / "golden" / "virtual_grid.json"
WEIGHTS = "policy/model.safetensors"
JOB_KINDS = ("live runs", "emulated runs", "replays")
TABLES = [  # (file under tables/, heading, the sentence that leads it)
    ("findings.md", "Findings", "Each claim's verdict on each clock, as the report's front "
     "page opens."),
    ("claims.md", "The claims table", "docs/claims.md says how a verdict is reached."),
    ("table1.md", "Table 1", "Every configuration of the grid, mean ± 95 % CI over seeds "
     "(docs/pipeline.md says how to read it)."),
    ("k_sweep.md", "The K sweep", "Every configuration of the grid, what staleness cost it: "
     "accepted and dropped samples, resubmissions, wasted tokens, accepted samples/s, the "
     "held-out pass rate and the prompt audit's length bias, mean ± 95 % CI over seeds; the "
     "paper's preset at K = 1 and 8 is its K sweep."),
    ("quality_vs_k.md", "Quality against K", "Held-out pass rate per objective and K "
     "(AReaL's Table 2) of the `figures.k_axis` arm, with sync as the K = 0 reference."),
    ("replays.md", "Replays", "Each run of `grid.replays.of` trained again under other "
     "objectives on its own schedule (docs/replay.md)."),
    ("paper_beside.md", "The paper beside us", "What each claim's source reported."),
]


def fingerprint(digests: dict[str, str]) -> str:
    """One digest over the final weights of the emulated runs and replays, by name."""
    lines = "".join(f"{name} {digests[name]}\n" for name in sorted(digests))
    return "sha256:" + hashlib.sha256(lines.encode()).hexdigest()


def golden_fingerprint() -> str:
    """The fingerprint tests/golden/virtual_grid.json's weights give."""
    runs = json.loads(GOLDEN.read_text())["runs"]
    return fingerprint({name: files[WEIGHTS] for name, files in runs.items()})


def measured_fingerprint(results: Path) -> str:
    """The fingerprint of the same runs and replays under `results`."""
    names = json.loads(GOLDEN.read_text())["runs"]
    return fingerprint({name: "sha256:" + hashlib.sha256(
        (results / name / WEIGHTS).read_bytes()).hexdigest() for name in names})


def jobs(results: Path) -> dict[str, list[float]]:
    """Seconds of each kind of job (time.job_s), from the summaries."""
    out: dict[str, list[float]] = {kind: [] for kind in JOB_KINDS}
    for summary in sorted(results.glob("runs/**/summary.json")):
        kind = "live runs" if "/runs/wall/" in summary.as_posix() else "emulated runs"
        out[kind].append(json.loads(summary.read_text())["time"]["job_s"])
    for summary in sorted(results.glob("replays/**/summary.json")):
        out["replays"].append(json.loads(summary.read_text())["time"]["job_s"])
    return out


def job_times(page: str) -> tuple[dict[str, float], int]:
    """The median seconds of each kind of job and the cores of the host, as a results page
    (docs/results.md) states them."""
    medians = {kind: float(median) for kind, median in
               re.findall(r"^\| (live runs|emulated runs|replays) \| \d+ \| \d+ \| ([\d.]+) \|$",
                          page, re.M)}
    cores = re.search(r"\*\*Host of the live runs:\*\*.*?; (\d+) cores;", page, re.S)
    if set(medians) != set(JOB_KINDS) or cores is None:
        raise ValueError("the results page states no job times or cores: retake it")
    return medians, int(cores[1])


def grid_seconds(counts: dict[str, int], medians: dict[str, float], cores: int) -> float:
    """How long a grid's run and replay jobs take at these median job times: a live run
    holds the machine alone, emulated runs and replays take a core each, `cores` at once
    (workflow/rules/common.smk). The base model, the plan and the analysis are not in it."""
    return (counts["live"] * medians["live runs"]
            + (counts["virtual"] * medians["emulated runs"]
               + counts["replays"] * medians["replays"]) / cores)


def duration(seconds: float) -> str:
    """A duration as the docs state an estimate: whole minutes, from 90 on hours to 0.1."""
    minutes = round(seconds / 60)
    if minutes >= 90:
        return f"{seconds / 3600:.1f} hours"
    return "1 minute" if minutes == 1 else f"{minutes} minutes"


def host(results: Path) -> str:
    """The CPU and kernels the live runs ran on."""
    config = next(results.glob("runs/wall/**/config.json"))
    env = json.loads(config.read_text())["environment"]
    cpu, kernels = env["cpu"], env["kernels"]
    return (f"{cpu['vendor']} {cpu['model_name']}, family {cpu['family']}, model "
            f"{cpu['model']}; flags {', '.join(cpu['flags'])}; {env['cpu_count']} cores; "
            f"kernels {kernels['setting']} (torch {kernels['torch_cpu_capability']}, MKL "
            f"{kernels['mkl_cbwr']})")


def page(results: Path) -> str:
    measured = measured_fingerprint(results)
    if measured != golden_fingerprint():
        raise SystemExit(f"{results}: the emulated runs' weights are not those of {GOLDEN}: "
                         "a make run of this commit's default grid is what the page shows")
    lines = [
        "# Results of the default grid",
        "",
        "What a fresh `make run` of `config/config.yaml` gave when this section was last "
        "retaken. Retaken, "
        "never edited: `make run && python tools/results_page.py results`.",
        "",
        "- **What holds on any host:** the rows on the emulated 2x V100 "
        "(`v100x2-qwen0.5b-fp16`) and the replays are a function of the config, bit for bit "
        "on any x86-64 CPU (docs/reproducibility.md). Their final weights have the "
        f"fingerprint `{measured}`, that of tests/golden/virtual_grid.json.",
        "- **What is this host's:** the rows on this machine's clock (`wall`): times, "
        "throughput, and through them which policy version each sample met. They move "
        "between hosts and between hours (by up to 40 % in an hour on the hosts seen); "
        "the claims on this clock are paired by block to take the hour out.",
        f"- **Host of the live runs:** {host(results)}.",
        "",
        "| jobs | count | seconds (sum) | median |",
        "|---|---|---|---|",
    ]
    for kind, seconds in jobs(results).items():
        if seconds:
            lines.append(f"| {kind} | {len(seconds)} | {sum(seconds):.0f} | "
                         f"{statistics.median(seconds):.1f} |")
    lines = [wrapped(line) for line in lines]
    for name, heading, lead in TABLES:
        table = results / "tables" / name
        if table.is_file():  # line by line: a table as it is, a list an item at a time
            lines += ["", f"## {heading}", "", wrapped(lead), "",
                      *map(wrapped, table.read_text().rstrip().splitlines())]
    return "\n".join(lines) + "\n"


REAL_HEADING = "## A real pretrained model: SmolLM2-135M-Instruct"
REAL_TABLES = ("findings.md", "claims.md", "table1.md")


def wilson(passes: float, n: int) -> tuple[float, float]:
    """The 95 % Wilson interval of a pass rate of `passes` in `n` scored samples."""
    if n == 0:
        return float("nan"), float("nan")
    p, z = passes / n, 1.96
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5
    return centre - half, centre + half


def real_section(results: Path) -> list[str]:
    """The section of config/real.yaml's study: the base model's held-out pass rates, each
    arm's after training and its seconds per update, then the study's own tables."""
    from rlcore.analysis.tables import mean_ci95

    base_file = next(results.glob("runs/**/eval_base.json"))
    base = json.loads(base_file.read_text())
    n = base["tasks"]
    arms: dict[str, list[dict]] = {}
    for summary in sorted(results.glob("runs/wall/**/summary.json")):
        s = json.loads(summary.read_text())
        ev = json.loads((summary.parent / "eval.json").read_text())
        run = s["run"]
        arm = f"{run['mode']}/{run['preset']}/k{run['k']}"
        arms.setdefault(arm, []).append({
            "greedy": ev["greedy_pass_rate"], "sampled": ev["sampled_pass_rate"],
            "s_per_update": s["time"]["wall_s"] / s["updates"], "job_s": s["time"]["job_s"],
            "contended": s["load"]["contended"]})
    job_s = [r["job_s"] for rows in arms.values() for r in rows]
    g_lo, g_hi = wilson(base["greedy_pass_rate"] * n, n)
    m = n * base["samples_per_task"]
    s_lo, s_hi = wilson(base["sampled_pass_rate"] * m, m)
    lines = [
        REAL_HEADING, "",
        "What `make run CONFIG=\"config/config.yaml config/real.yaml\"` gave when this "
        "section was last retaken: "
        "the model fetched from its registry package and trained on additions asked in "
        "words, sync and AReaL-style at K = 2, every weight and LoRA rank 8, on this "
        "machine's clock. Retaken, never edited: `python tools/results_page.py --real "
        "results/real`.", "",
        f"- **Host:** {host(results)}.",
        f"- **Jobs:** {len(job_s)} runs, {sum(job_s) / 60:.0f} job-minutes (median "
        f"{statistics.median(job_s):.0f} s).",
        f"- **The base model** on the {n} held-out problems: greedy pass "
        f"{base['greedy_pass_rate']:.3f} (95 % {g_lo:.3f}-{g_hi:.3f}), sampled "
        f"{base['sampled_pass_rate']:.3f} ({s_lo:.3f}-{s_hi:.3f}; {base['samples_per_task']} "
        "samples a problem).", "",
        "Each arm after training, mean ± 95 % CI over seeds; seconds per update are the "
        "run's wall time over its updates, median over seeds (runs the machine shared with "
        "other work are marked).", "",
        "| arm | seeds | held-out greedy | held-out sampled | s / update | shared |",
        "|---|---|---|---|---|---|",
    ]
    for arm, rows in arms.items():
        g, gh = mean_ci95([r["greedy"] for r in rows])
        sp, sh = mean_ci95([r["sampled"] for r in rows])
        per = statistics.median(r["s_per_update"] for r in rows)
        shared = sum(r["contended"] for r in rows)
        lines.append(f"| {arm} | {len(rows)} | {g:.3f} ± {gh:.3f} | {sp:.3f} ± {sh:.3f} | "
                     f"{per:.1f} | {shared} |")
    return [wrapped(line) for line in lines] + study_tables(results, REAL_TABLES)


def study_tables(results: Path, names: tuple[str, ...]) -> list[str]:
    """A study's tables under headings of their own, each as its rule wrote it."""
    lines: list[str] = []
    for name in names:
        table = results / "tables" / name
        if table.is_file():
            lines += ["", f"### {name.removesuffix('.md')}", "",
                      *map(wrapped, table.read_text().rstrip().splitlines())]
    return lines


SPLIT_HEADING = "## How to split a few GPUs: config/split.yaml"
SPLIT_TABLES = ("findings.md", "claims.md")
# The studies' sections, in the page's order after the default grid's part
SECTIONS = (REAL_HEADING, SPLIT_HEADING)


def split_section(results: Path) -> list[str]:
    """The section of config/split.yaml's study: its host and job-minutes, then the split
    table (the plan's pick against the best split, every arm beside its plan) and claims."""
    job_s = [json.loads(f.read_text())["time"]["job_s"]
             for f in sorted(results.glob("runs/**/summary.json"))]
    live = [json.loads(f.read_text()) for f in sorted(results.glob("runs/wall/**/summary.json"))]
    lines = [
        SPLIT_HEADING, "",
        "What `make run CONFIG=\"config/config.yaml config/split.yaml\"` gave when this "
        "section was last retaken: the default task on 4 and 8 emulated V100s, every split "
        "into rollout workers + trainer ranks at K = 1, 2 and 4 beside sync on as many GPUs, "
        "and four live layouts on this machine's CPU, each arm planned by `rlcore plan` "
        "before it ran (docs/placement.md, *The split study*). The emulated rows are the tiny "
        "model's "
        "learning priced as Qwen2.5-0.5B's tokens on derived V100 profiles. Retaken, never "
        "edited: `python tools/results_page.py --split results/split`.", "",
        f"- **Host of the live runs:** {host(results)}; "
        f"{sum(s['load']['contended'] for s in live)} of {len(live)} shared the machine.",
        f"- **Jobs:** {len(job_s)} runs, {sum(job_s) / 60:.0f} job-minutes (median "
        f"{statistics.median(job_s):.0f} s).",
        "- **Figure:** `results/split/figures/split.png`, updates/s by split with the plan "
        "beside each point.",
    ]
    split = results / "tables" / "split.md"  # headed by its own subsections
    if split.is_file():
        lines += ["", *split.read_text().rstrip().splitlines()]
    return [wrapped(line) for line in lines] + study_tables(results, SPLIT_TABLES)


def with_sections(text: str, new: dict[str, list[str] | None], old: str) -> str:
    """`text` (the default grid's part) followed by each study's section: the new one where
    it was retaken, else the one the old page had."""
    found = sorted((old.index(h), h) for h in SECTIONS if h in old)
    kept = {h: old[at:next((a for a, _ in found if a > at), len(old))].rstrip("\n")
            for at, h in found}
    parts = [text.rstrip("\n")]
    for heading in SECTIONS:
        lines = new.get(heading)
        section = "\n".join(lines) if lines is not None else kept.get(heading)
        if section:
            parts.append(section)
    return "\n\n".join(parts) + "\n"


def wrapped(line: str) -> str:
    """A prose line wrapped at 92 columns (a bullet's continuation indented); tables as are."""
    if not line or line.startswith(("|", "#")):
        return line
    indent = "  " if line.startswith("- ") else ""
    return textwrap.fill(line, 92, subsequent_indent=indent, break_long_words=False,
                         break_on_hyphens=False)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", type=Path, nargs="?",
                   help="a finished make run's results directory (default: keep the page's "
                        "default-grid part)")
    p.add_argument("--real", type=Path, default=None,
                   help="config/real.yaml's finished results (results/real): retake its "
                        "section (default: keep the page's)")
    p.add_argument("--split", type=Path, default=None,
                   help="config/split.yaml's finished results (results/split): retake its "
                        "section (default: keep the page's)")
    p.add_argument("--out", type=Path, default=PAGE)
    args = p.parse_args(argv)
    old = args.out.read_text() if args.out.is_file() else ""
    if args.results is not None:
        text = page(args.results)
    else:
        first = min((old.index(h) for h in SECTIONS if h in old), default=len(old))
        text = old[:first]
    new = {REAL_HEADING: real_section(args.real) if args.real is not None else None,
           SPLIT_HEADING: split_section(args.split) if args.split is not None else None}
    args.out.write_text(with_sections(text, new, old))
    retaken = [str(p) for p in (args.real, args.split) if p is not None]
    print(f"{args.out}: written from {args.results or 'itself'}"
          f"{''.join(f' and {r}' for r in retaken)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
