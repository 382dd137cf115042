rule run_config:
    output:
        "results/configs/{mode}-k{k}-{objective}-seed{seed}.json",
    log:
        "results/logs/configs/{mode}-k{k}-{objective}-seed{seed}.log",
    conda:
        "../envs/rlcore.yaml"
    params:
        settings=lambda wildcards: json.dumps(run_settings(wildcards), sort_keys=True),
    shell:
        "echo '{params.settings}' > {output} 2> {log}"


rule run:
    input:
        config="results/configs/{mode}-k{k}-{objective}-seed{seed}.json",
        base=base_input,
    output:
        summary="results/runs/{mode}/k{k}/{objective}/seed{seed}/summary.json",
    log:
        "results/logs/runs/{mode}-k{k}-{objective}-seed{seed}.log",
    conda:
        "../envs/rlcore.yaml"
    resources:
        gpu=2,
    params:
        run_dir=lambda wildcards, output: os.path.dirname(output.summary),
        code=sources_hash(RUNTIME_SOURCES),
    shell:
        "rlcore run {input.config} --out {params.run_dir} --force > {log} 2>&1"
