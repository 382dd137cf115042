rule run_config:
    output:
        f"{R}/configs/{FILE_PATTERN}.json",
    log:
        f"{R}/logs/configs/{FILE_PATTERN}.log",
    priority: block_priority
    conda:
        "../envs/rlcore.yaml"
    params:
        settings=lambda wildcards: json.dumps(point_settings(wildcards), sort_keys=True),
    shell:
        "printf '%s\\n' {params.settings:q} > {output} 2> {log}"


rule run:
    # Trains, then scores the final policy on the held-out split (`--eval`, eval.json) in the
    # same process on the same GPUs: torch and the run's device are already set up, and the
    # Snakemake process itself never imports torch. job_code covers both steps.
    input:
        config=f"{R}/configs/{FILE_PATTERN}.json",
        base=base_input,
        hardware=hardware_input,
    output:
        summary=f"{R}/runs/{RUN_PATTERN}/summary.json",
        eval=f"{R}/runs/{RUN_PATTERN}/eval.json",
    log:
        f"{R}/logs/runs/{FILE_PATTERN}.log",
    priority: block_priority
    conda:
        "../envs/rlcore.yaml"
    threads: job_threads
    resources:
        gpu=job_gpus,
    params:
        run_dir=lambda wildcards, output: os.path.dirname(output.summary),
        code=job_code,
    # `python -m rlcore.launcher run` is `rlcore run`, forked from a server that has imported
    # torch already (docs/launcher.md; `launcher: cold` in the config for a fresh process).
    # exec: the launcher's client replaces the shell and becomes Snakemake's own child, so
    # that with --exit-with-parent a killed Snakemake takes the client with it, and the
    # server then the run (and its workers).
    shell:
        "exec python -m rlcore.launcher run {input.config} --out {params.run_dir} --force "
        "--eval --exit-with-parent > {log} 2>&1"


rule base_eval:
    # The base model scored on the held-out split with the runs' settings, beside the first
    # grid point's run (its config says how): the response-length figure's reference.
    input:
        run=f"{R}/runs/{RUN_PATTERN}/summary.json",
    output:
        f"{R}/runs/{RUN_PATTERN}/eval_base.json",
    log:
        f"{R}/logs/base_eval/{FILE_PATTERN}.log",
    conda:
        "../envs/rlcore.yaml"
    resources:
        gpu=1,
    params:
        run_dir=lambda wildcards, input: os.path.dirname(input.run),
        code=job_code,
    shell:
        "exec python -m rlcore.launcher eval --weights base {params.run_dir} > {log} 2>&1"
