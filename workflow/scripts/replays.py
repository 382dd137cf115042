"""The paired table and the quality-vs-K figure of the counterfactual replays."""

from pathlib import Path

from rlcore.analysis.figures.staleness import draw_quality_vs_k_replayed
from rlcore.analysis.paired import paired_markdown, paired_table, replay_row
from rlcore.analysis.tables import logged, run_row, write_csv


def main(smk):
    live = [run_row(Path(p).parent) for p in smk.input.live]
    replays = [replay_row(Path(p).parent) for p in smk.input.replays]
    table = paired_table(live, replays)
    write_csv(smk.output.csv, table)
    Path(smk.output.md).write_text(paired_markdown(table))
    draw_quality_vs_k_replayed(table, smk.output.figure, smk.output.figure_svg)


logged(snakemake.log[0], main, snakemake)  # noqa: F821 - injected by Snakemake
