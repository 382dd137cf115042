rule runs_table:
    # Every finished run and replay, a row each: its name and its summary's figures. The
    # tables, claims and figures read this one file rather than every run directory.
    input:
        summaries=all_runs("summary.json"),
        evals=all_runs("eval.json"),
        replay_summaries=all_replays("summary.json"),
        replay_evals=all_replays("eval.json"),
        base_eval=base_eval_file(),
    output:
        RUNS_TABLE,
    log:
        f"{R}/logs/runs_table.log",
    conda:
        "../envs/rlcore.yaml"
    params:
        code=analysis_code("runs.py"),
    script:
        "../scripts/runs.py"


rule tables:
    input:
        runs=RUNS_TABLE,
    output:
        table1_csv=f"{R}/tables/table1.csv",
        table1_md=report(
            f"{R}/tables/table1.md",
            caption="../../reports/table1.rst",
            category="Tables",
        ),
        k_sweep_csv=f"{R}/tables/k_sweep.csv",
        k_sweep_md=report(
            f"{R}/tables/k_sweep.md",
            caption="../../reports/k_sweep.rst",
            category="Tables",
        ),
        quality_vs_k_csv=f"{R}/tables/quality_vs_k.csv",
        quality_vs_k_md=report(
            f"{R}/tables/quality_vs_k.md",
            caption="../../reports/quality_vs_k_table.rst",
            category="Tables",
        ),
        environment_csv=f"{R}/tables/environment.csv",
        environment_md=report(
            f"{R}/tables/environment.md",
            caption="../../reports/environment.rst",
            category="Tables",
        ),
    log:
        f"{R}/logs/tables.log",
    conda:
        "../envs/rlcore.yaml"
    params:
        k_axis=k_axis(),
        code=analysis_code("tables.py"),
    script:
        "../scripts/tables.py"


rule claims:
    # The claims table, first in the report: each claim of config `claims` tested on the
    # runs and replays its contrast names, with a verdict from its intervals and the
    # smallest effect of its metric that matters (config `sesoi`).
    input:
        runs=RUNS_TABLE,
    output:
        csv=f"{R}/tables/claims.csv",
        md=report(
            f"{R}/tables/claims.md",
            caption="../../reports/claims.rst",
            category="Claims",
        ),
        # one sentence per row, which the report's front page opens with
        findings=report(
            f"{R}/tables/findings.md",
            caption="../../reports/findings.rst",
            category="Claims",
        ),
        # each claim's source's own figure beside our verdicts (config `reported`)
        paper=report(
            f"{R}/tables/paper_beside.md",
            caption="../../reports/paper_beside.rst",
            category="Claims",
        ),
        forest=report(
            f"{R}/figures/claims_forest.png",
            caption="../../reports/claims_forest.rst",
            category="Claims",
        ),
        forest_svg=f"{R}/figures/claims_forest.svg",
    log:
        f"{R}/logs/claims.log",
    conda:
        "../envs/rlcore.yaml"
    params:
        claims=config.get("claims", []),
        budget_min=config["claims_budget_min"],
        sesoi=config.get("sesoi", {}),
        reported=config.get("reported", {}),
        priced=clocks_priced(),
        model=model_path(),
        code=analysis_code("claims.py"),
    script:
        "../scripts/claims.py"
