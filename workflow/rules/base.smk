rule base_config:
    output:
        "results/configs/base.json",
    log:
        "results/logs/configs/base.log",
    conda:
        "../envs/rlcore.yaml"
    params:
        settings=json.dumps(base_settings(), sort_keys=True),
    shell:
        "echo '{params.settings}' > {output} 2> {log}"


rule base_model:
    input:
        config="results/configs/base.json",
    output:
        directory(model_path()),
    log:
        "results/logs/base_model.log",
    conda:
        "../envs/rlcore.yaml"
    params:
        code=sources_hash(["rlcore/tiny.py", "rlcore/tasks.py"]),
    shell:
        "rlcore build-base {output} --config {input.config} --force > {log} 2>&1"
