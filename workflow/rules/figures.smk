# The paper's figures (PNG for the report, SVG beside it) from the finished runs.


rule figures:
    input:
        runs=RUNS_TABLE,
        base_eval=base_eval_file(),
    output:
        pass_rate=figure("pass_rate", "Learning"),
        pass_rate_svg=f"{R}/figures/pass_rate.svg",
        time_to_threshold=figure("time_to_threshold", "Learning"),
        time_to_threshold_svg=f"{R}/figures/time_to_threshold.svg",
        reward_per_1k=figure("reward_per_1k", "Learning"),
        reward_per_1k_svg=f"{R}/figures/reward_per_1k.svg",
        quality_throughput=figure("quality_throughput", "Staleness"),
        quality_throughput_svg=f"{R}/figures/quality_throughput.svg",
        quality_vs_k=figure("quality_vs_k", "Staleness"),
        quality_vs_k_svg=f"{R}/figures/quality_vs_k.svg",
        staleness=figure("staleness", "Staleness"),
        staleness_svg=f"{R}/figures/staleness.svg",
        end_to_end=figure("end_to_end", "Learning"),
        end_to_end_svg=f"{R}/figures/end_to_end.svg",
        length_bias=figure("length_bias", "Staleness"),
        length_bias_svg=f"{R}/figures/length_bias.svg",
        prompt_audit=figure("prompt_audit", "Staleness"),
        prompt_audit_svg=f"{R}/figures/prompt_audit.svg",
        response_lengths=figure("response_lengths", "Learning"),
        response_lengths_svg=f"{R}/figures/response_lengths.svg",
    log:
        f"{R}/logs/figures.log",
    conda:
        "../envs/rlcore.yaml"
    params:
        k_axis=k_axis(),
        code=analysis_code("figures.py"),
    script:
        "../scripts/figures.py"


rule trace_figures:
    input:
        trace_runs,
    output:
        queue_depth=figure("queue_depth", "System"),
        queue_depth_svg=f"{R}/figures/queue_depth.svg",
        worker_activity=figure("worker_activity", "System"),
        worker_activity_svg=f"{R}/figures/worker_activity.svg",
    log:
        f"{R}/logs/trace_figures.log",
    conda:
        "../envs/rlcore.yaml"
    params:
        modes=trace_modes(),
        window=config["figures"]["window_s"],
        code=analysis_code("figures.py"),
    script:
        "../scripts/figures.py"
