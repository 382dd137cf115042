rule tables:
    input:
        summaries=all_runs("summary.json"),
        evals=all_runs("eval.json"),
    output:
        table1_csv="results/tables/table1.csv",
        table1_md=report(
            "results/tables/table1.md",
            caption="../../reports/table1.rst",
            category="Tables",
        ),
        k_sweep_csv="results/tables/k_sweep.csv",
        k_sweep_md=report(
            "results/tables/k_sweep.md",
            caption="../../reports/k_sweep.rst",
            category="Tables",
        ),
    log:
        "results/logs/tables.log",
    conda:
        "../envs/rlcore.yaml"
    params:
        code=sources_hash(["rlcore/analysis.py", "workflow/scripts/tables.py"]),
    script:
        "../scripts/tables.py"
