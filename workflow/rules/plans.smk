# The capacity planner's K sweep (`rlcore plan`, docs/virtual_clock.md) beside the measured
# one: what the schedule of the k_axis arm would do at each K without a model, priced by the
# arm's hardware profile, with each K's response lengths from that K's own run (seed of the
# plan point), drawn per task.


rule plan_k_sweep:
    input:
        config=f"{R}/configs/{FILE_PATTERN.format(**plan_point())}.json",
        runs=plan_length_runs(),
    output:
        f"{R}/plans/k_sweep.json",
    log:
        f"{R}/logs/plan_k_sweep.log",
    conda:
        "../envs/rlcore.yaml"
    params:
        ks=plan_ks(),
        lengths=lambda wildcards, input: " ".join(
            f"--lengths {os.path.dirname(run)}" for run in input.runs
        ),
        code=PLAN_CODE,
        profile=plan_profile(),
    shell:
        "rlcore plan {input.config} --sweep staleness.staleness_k={params.ks} "
        "{params.lengths} --out {output} > {log} 2>&1"


rule plan_figure:
    input:
        plans=f"{R}/plans/k_sweep.json",
        summaries=plan_runs(),
    output:
        plan_vs_measured=figure("plan_vs_measured", "Staleness"),
        plan_vs_measured_svg=f"{R}/figures/plan_vs_measured.svg",
    log:
        f"{R}/logs/plan_figure.log",
    conda:
        "../envs/rlcore.yaml"
    params:
        k_axis=k_axis(),
        code=analysis_code("figures.py"),
    script:
        "../scripts/figures.py"
