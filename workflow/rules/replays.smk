# Counterfactual replays (docs/replay.md): each run grid.replays.of selects (on the clock it
# names), replayed on its own schedule under each objective of grid.replays.objectives, then compared
# in pairs.


rule replay:
    # A live run's change (its summary.json) makes its replays stale. Under the run's own
    # objective the replay is a verification: it fails unless it reproduces the run bit
    # for bit.
    input:
        run=f"{R}/runs/{RUN_PATTERN}/summary.json",
    output:
        summary=f"{R}/replays/{REPLAY_PATTERN}/summary.json",
        eval=f"{R}/replays/{REPLAY_PATTERN}/eval.json",
    log:
        f"{R}/logs/replays/{FILE_PATTERN}-{{replayed}}.log",
    conda:
        "../envs/rlcore.yaml"
    threads: job_threads
    resources:
        gpu=job_gpus,
    params:
        run_dir=lambda wildcards, input: os.path.dirname(input.run),
        out_dir=lambda wildcards, output: os.path.dirname(output.summary),
        code=job_code,
    # started as a run is (rules/runs.smk)
    shell:
        "exec python -m rlcore.launcher replay {params.run_dir} --out {params.out_dir} "
        "--set train.objective={wildcards.replayed} --force --eval --exit-with-parent "
        "> {log} 2>&1"


rule replay_table:
    input:
        runs=RUNS_TABLE,
    output:
        csv=f"{R}/tables/replays.csv",
        md=report(
            f"{R}/tables/replays.md",
            caption="../../reports/replays_table.rst",
            category="Tables",
        ),
        figure=figure("quality_vs_k_replayed", "Staleness"),
        figure_svg=f"{R}/figures/quality_vs_k_replayed.svg",
    log:
        f"{R}/logs/replay_table.log",
    conda:
        "../envs/rlcore.yaml"
    params:
        code=analysis_code("replays.py"),
    script:
        "../scripts/replays.py"
