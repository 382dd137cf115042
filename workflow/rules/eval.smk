rule eval_run:
    input:
        summary=f"{R}/runs/{{mode}}/k{{k}}/{{objective}}/seed{{seed}}/summary.json",
    output:
        f"{R}/runs/{{mode}}/k{{k}}/{{objective}}/seed{{seed}}/eval.json",
    log:
        f"{R}/logs/eval/{{mode}}-k{{k}}-{{objective}}-seed{{seed}}.log",
    conda:
        "../envs/rlcore.yaml"
    params:
        run_dir=lambda wildcards, input: os.path.dirname(input.summary),
        code=sources_hash(["rlcore/evaluation.py", "rlcore/reward.py"]),
    shell:
        "rlcore eval {params.run_dir} > {log} 2>&1"
