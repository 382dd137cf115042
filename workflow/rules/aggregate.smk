rule tables:
    input:
        summaries=all_runs("summary.json"),
        evals=all_runs("eval.json"),
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
    log:
        f"{R}/logs/tables.log",
    conda:
        "../envs/rlcore.yaml"
    params:
        code=sources_hash(["rlcore/analysis.py", "workflow/scripts/tables.py"]),
    script:
        "../scripts/tables.py"
