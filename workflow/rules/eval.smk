rule eval_run:
    # In the Snakemake process: scoring takes a fraction of a second, while a fresh
    # interpreter spends seconds importing torch and transformers, once per run.
    input:
        summary=f"{R}/runs/{{mode}}/k{{k}}/{{objective}}/seed{{seed}}/summary.json",
    output:
        f"{R}/runs/{{mode}}/k{{k}}/{{objective}}/seed{{seed}}/eval.json",
    log:
        f"{R}/logs/eval/{{mode}}-k{{k}}-{{objective}}-seed{{seed}}.log",
    params:
        code=sources_hash(["rlcore/evaluation.py", "rlcore/reward.py"]),
    run:
        evaluate_into_log(os.path.dirname(input.summary), log[0])
