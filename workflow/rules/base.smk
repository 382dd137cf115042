# The settings sit beside the model, not in a results directory: grids that share a model
# path (a study overlay and the default grid) share one base, rebuilt only when they differ.
rule base_config:
    output:
        base_config_path(),
    log:
        f"{R}/logs/configs/base.log",
    conda:
        "../envs/rlcore.yaml"
    params:
        settings=lambda wildcards: json.dumps(base_settings(), sort_keys=True),
    shell:
        "printf '%s\\n' {params.settings:q} > {output} 2> {log}"


rule base_model:
    input:
        config=base_config_path(),
    output:
        directory(model_path()),
    log:
        f"{R}/logs/base_model.log",
    conda:
        "../envs/rlcore.yaml"
    threads: config["run"]["base"]["threads"]
    params:
        code=base_code(),
    shell:
        base_command()
