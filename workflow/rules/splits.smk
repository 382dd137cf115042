# The split study (config `splits`, config/split.yaml): each sync and AReaL-style arm
# planned from its own config by `rlcore plan`, with response lengths from its clock's sync
# arm (what a user has before any split runs), then every split's measured updates/s beside
# its plan, the plan's pick against the best split, and sync on as many devices.


rule plan_split:
    input:
        config=split_arm_config,
        lengths=split_lengths_run,
    output:
        f"{R}/plans/split/{{clock}}/{{mode}}-{{preset}}-k{{k}}.json",
    log:
        f"{R}/logs/plans/split/{{clock}}/{{mode}}-{{preset}}-k{{k}}.log",
    conda:
        "../envs/rlcore.yaml"
    params:
        hardware=split_hardware,
        profile=split_profile,
        lengths=lambda wildcards, input: f"--lengths {os.path.dirname(input.lengths)}",
        code=PLAN_CODE,
    shell:
        "rlcore plan {input.config} {params.hardware} {params.lengths} --out {output} "
        "> {log} 2>&1"


rule split_table:
    input:
        runs=RUNS_TABLE,
        plans=split_plans(),
    output:
        csv=f"{R}/tables/split.csv",
        groups_csv=f"{R}/tables/split_groups.csv",
        md=report(
            f"{R}/tables/split.md",
            caption="../../reports/split.rst",
            category="Splits",
        ),
        png=report(
            f"{R}/figures/split.png",
            caption="../../reports/split_figure.rst",
            category="Splits",
        ),
        svg=f"{R}/figures/split.svg",
    log:
        f"{R}/logs/split_table.log",
    conda:
        "../envs/rlcore.yaml"
    params:
        arms=[list(arm) for arm in split_arms()],
        within=lambda wildcards: config["splits"]["within"],
        code=analysis_code("splits.py"),
    script:
        "../scripts/splits.py"
