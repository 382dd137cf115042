"""The paired table and the quality-vs-K figure of the counterfactual replays."""

import csv
import sys
from pathlib import Path

from rlcore.analysis import run_row
from rlcore.paired import paired_markdown, paired_table, replay_row
from rlcore.staleness_figures import draw_quality_vs_k_replayed


def main(smk):
    live = [run_row(Path(p).parent) for p in smk.input.live]
    replays = [replay_row(Path(p).parent) for p in smk.input.replays]
    table = paired_table(live, replays)
    with open(smk.output.csv, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)
    Path(smk.output.md).write_text(paired_markdown(table))
    draw_quality_vs_k_replayed(table, smk.output.figure, smk.output.figure_svg)


with open(snakemake.log[0], "w") as log:  # noqa: F821 - injected by Snakemake
    sys.stderr = log
    main(snakemake)  # noqa: F821
