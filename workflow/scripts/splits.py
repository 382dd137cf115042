"""The split study's table and figure (rlcore.analysis.splits)."""

import json
from pathlib import Path

from rlcore.analysis.figures.splits import draw_splits
from rlcore.analysis.splits import arms, groups, markdown
from rlcore.analysis.tables import logged, read_runs, write_csv


def split_study(smk):
    planned = {}
    for (clock, mode, preset, k), path in zip(smk.params.arms, smk.input.plans, strict=True):
        (plan,) = json.loads(Path(path).read_text())
        planned[(clock, mode, preset, int(k))] = plan["updates_per_s"]
    table = arms(read_runs(smk.input.runs), planned)
    grouped = groups(table, smk.params.within)
    write_csv(smk.output.csv, table)
    write_csv(smk.output.groups_csv, grouped)
    Path(smk.output.md).write_text(markdown(table, grouped, smk.params.within))
    draw_splits(table, grouped, smk.output.png, smk.output.svg)


logged(snakemake.log[0], split_study, snakemake)  # noqa: F821 - injected by Snakemake
