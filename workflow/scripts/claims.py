"""The claims table from the runs and replays its claims name (rlcore.analysis.claims), its
findings in words (the report's front page), the paper beside it and its forest plot."""

from pathlib import Path

from rlcore.analysis.claims import (
    claim_from_config,
    claims_table,
    row_key,
    sesoi_from_config,
)
from rlcore.analysis.claims_text import (
    claims_findings,
    claims_markdown,
    conditions_text,
    paper_beside,
)
from rlcore.analysis.figures.claims import draw_claims_forest
from rlcore.analysis.prompts import LENGTH_BIASES, run_length_biases
from rlcore.analysis.tables import logged, model_parameters, read_runs, write_csv


def main(smk):
    claims = [claim_from_config(c) for c in smk.params.claims]
    rows = read_runs(smk.input.runs, replays=None)
    # the prompt audit reads a run's samples.jsonl: only for the runs a claim needs it of
    audited = {a.key() for c in claims if c.metric in LENGTH_BIASES for a in c.arms}
    for r in rows:
        if r["replayed"] is None and row_key(r) in audited:
            r.update(run_length_biases(Path(r["run_dir"])))
    table = claims_table(claims, rows, smk.params.budget_min, sesoi_from_config(smk.params.sesoi))
    write_csv(smk.output.csv, table)
    Path(smk.output.md).write_text(claims_markdown(table))
    Path(smk.output.findings).write_text(
        conditions_text(table, smk.params.priced, smk.params.model,
                        model_parameters(smk.params.model))
        + claims_findings(table))
    Path(smk.output.paper).write_text(paper_beside(table, smk.params.reported))
    draw_claims_forest(table, smk.output.forest, smk.output.forest_svg)


logged(snakemake.log[0], main, snakemake)  # noqa: F821 - injected by Snakemake
