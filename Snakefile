# The experiment pipeline: base model -> one run per grid point (trained, then scored on the
# held-out split in the same job) -> counterfactual replays of selected runs -> tables and
# figures.
# Run it with `snakemake --cores all --resources gpu=2` (or `--profile workflow/profiles/default`):
# a wall-clock run holds the machine alone, virtual runs and replays pair up (rules/common.smk).
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "reports/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/base.smk"
include: "workflow/rules/runs.smk"
include: "workflow/rules/replays.smk"
include: "workflow/rules/aggregate.smk"
include: "workflow/rules/figures.smk"
include: "workflow/rules/plans.smk"
include: "workflow/rules/splits.smk"


# Rules that take seconds: on a cluster they run where Snakemake runs, not through the
# queue (a submission waits longer than they take). The rest (the base model, runs,
# replays, the base model's scoring) go to the executor.
localrules:
    all,
    base_config,
    run_config,
    plan_k_sweep,
    plan_figure,
    plan_split,
    split_table,
    runs_table,
    replay_table,
    tables,
    claims,
    figures,
    trace_figures,


rule all:
    default_target: True
    input:
        all_outputs(),
