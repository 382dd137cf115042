rule run_config:
    output:
        f"{R}/configs/{{mode}}-{{policy}}-k{{k}}-{{objective}}-seed{{seed}}.json",
    log:
        f"{R}/logs/configs/{{mode}}-{{policy}}-k{{k}}-{{objective}}-seed{{seed}}.log",
    conda:
        "../envs/rlcore.yaml"
    params:
        settings=lambda wildcards: json.dumps(run_settings(wildcards), sort_keys=True),
    shell:
        "echo '{params.settings}' > {output} 2> {log}"


rule run:
    # Trains, then scores the final policy on the held-out split (`--eval`, eval.json) in the
    # same process on the same GPUs: torch and the run's device are already set up, and the
    # Snakemake process itself never imports torch. RUNTIME_CODE covers both steps.
    input:
        config=f"{R}/configs/{{mode}}-{{policy}}-k{{k}}-{{objective}}-seed{{seed}}.json",
        base=base_input,
    output:
        summary=f"{R}/runs/{{mode}}/{{policy}}/k{{k}}/{{objective}}/seed{{seed}}/summary.json",
        eval=f"{R}/runs/{{mode}}/{{policy}}/k{{k}}/{{objective}}/seed{{seed}}/eval.json",
    log:
        f"{R}/logs/runs/{{mode}}-{{policy}}-k{{k}}-{{objective}}-seed{{seed}}.log",
    conda:
        "../envs/rlcore.yaml"
    resources:
        gpu=2,
    params:
        run_dir=lambda wildcards, output: os.path.dirname(output.summary),
        code=RUNTIME_CODE,
    # exec: rlcore replaces the shell and becomes Snakemake's own child, so that with
    # --exit-with-parent a killed Snakemake takes the run (and its workers) with it.
    shell:
        "exec rlcore run {input.config} --out {params.run_dir} --force --eval "
        "--exit-with-parent > {log} 2>&1"
