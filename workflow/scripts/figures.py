"""The paper's figures from the runs (rlcore.analysis.figures); one script for both figure
rules."""

import json
from pathlib import Path

from rlcore.analysis.figures import learning as figures
from rlcore.analysis.figures import staleness as staleness_figures
from rlcore.analysis.figures import traces as traces_of
from rlcore.analysis.figures.length_bias import draw_length_bias, runs_by_k
from rlcore.analysis.figures.lengths import draw_response_lengths
from rlcore.analysis.figures.planner import draw_plan_vs_measured
from rlcore.analysis.figures.prompts import draw_prompt_audit
from rlcore.analysis.figures.style import arm_title
from rlcore.analysis.tables import logged, read_runs


def grid_figures(smk):
    rows = read_runs(smk.input.runs)
    out = smk.output
    figures.draw_pass_rate(rows, out.pass_rate, out.pass_rate_svg)
    figures.draw_time_to_threshold(rows, out.time_to_threshold, out.time_to_threshold_svg)
    figures.draw_reward_per_1k(rows, out.reward_per_1k, out.reward_per_1k_svg)
    staleness_figures.draw_quality_throughput(rows, out.quality_throughput,
                                              out.quality_throughput_svg)
    staleness_figures.draw_quality_vs_k(rows, out.quality_vs_k, out.quality_vs_k_svg,
                                        **smk.params.k_axis)
    staleness_figures.draw_staleness(rows, out.staleness, out.staleness_svg)
    figures.draw_end_to_end(rows, out.end_to_end, out.end_to_end_svg)
    axis = smk.params.k_axis
    title = arm_title(axis["mode"], axis["preset"], axis["clock"])
    draw_length_bias(runs_by_k(rows, **axis), out.length_bias, out.length_bias_svg, title)
    draw_prompt_audit(runs_by_k(rows, **axis), out.prompt_audit, out.prompt_audit_svg, title)
    draw_response_lengths(Path(smk.input.base_eval),
                          [(r["mode"], Path(r["run_dir"]) / "eval.json") for r in rows],
                          out.response_lengths, out.response_lengths_svg)


def trace_figures(smk):
    traces = {mode: Path(p).parent for mode, p in zip(smk.params.modes, smk.input, strict=True)}
    window = tuple(smk.params.window)
    out = smk.output
    traces_of.draw_queue_depth(traces, window, out.queue_depth, out.queue_depth_svg)
    traces_of.draw_worker_activity(traces, window, out.worker_activity,
                                   out.worker_activity_svg)


def plan_figure(smk):
    plans = json.loads(Path(smk.input.plans).read_text())
    out = smk.output
    draw_plan_vs_measured(plans, [Path(p).parent for p in smk.input.summaries],
                          out.plan_vs_measured, out.plan_vs_measured_svg, **smk.params.k_axis)


RULES = {"figures": grid_figures, "trace_figures": trace_figures, "plan_figure": plan_figure}
logged(snakemake.log[0], RULES[snakemake.rule], snakemake)  # noqa: F821 - injected by Snakemake
