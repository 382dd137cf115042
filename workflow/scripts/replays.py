"""The paired table and the quality-vs-K figure of the counterfactual replays."""

from pathlib import Path

from rlcore.analysis.figures.staleness import draw_quality_vs_k_replayed
from rlcore.analysis.paired import paired_markdown, paired_table
from rlcore.analysis.tables import logged, read_runs, write_csv


def main(smk):
    table = paired_table(read_runs(smk.input.runs), read_runs(smk.input.runs, replays=True))
    write_csv(smk.output.csv, table)
    Path(smk.output.md).write_text(paired_markdown(table))
    draw_quality_vs_k_replayed(table, smk.output.figure, smk.output.figure_svg)


logged(snakemake.log[0], main, snakemake)  # noqa: F821 - injected by Snakemake
