"""Every finished run and replay as one table, with their gains over the base model
(rlcore.analysis.tables.write_runs)."""

from pathlib import Path

from rlcore.analysis.tables import logged, write_runs


def main(smk):
    summaries = [*smk.input.summaries, *smk.input.replay_summaries]
    write_runs(smk.output[0], [Path(p).parent for p in summaries], smk.input.base_eval)


logged(snakemake.log[0], main, snakemake)  # noqa: F821 - injected by Snakemake
