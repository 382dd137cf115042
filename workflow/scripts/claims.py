"""The claims table from the runs and replays its claims name (rlcore.analysis.claims)."""

import json
from pathlib import Path

from rlcore.analysis.claims import claim_from_config, claims_markdown, claims_table, row_key
from rlcore.analysis.paired import replay_row
from rlcore.analysis.prompts import run_short_bias
from rlcore.analysis.tables import logged, run_row, write_csv


def row(summary):
    """A run's row or a replay's, keyed as the claims' arms are."""
    d = Path(summary).parent
    if json.loads(Path(summary).read_text())["run"]["replayed"] is not None:
        r = replay_row(d)
        return {**r, "objective": r["live_objective"], "replayed": r["objective"]}
    return {**run_row(d), "replayed": None}


def main(smk):
    claims = [claim_from_config(c) for c in smk.params.claims]
    rows = [row(p) for p in smk.input.summaries]
    # the prompt audit reads a run's samples.jsonl: only for the runs a claim needs it of
    audited = {a.key() for c in claims if c.metric == "short_bias" for a in c.arms}
    for r in rows:
        if r["replayed"] is None and row_key(r) in audited:
            r["short_bias"] = run_short_bias(Path(r["run_dir"]))
    table = claims_table(claims, rows, smk.params.budget_min)
    write_csv(smk.output.csv, table)
    Path(smk.output.md).write_text(claims_markdown(table))


logged(snakemake.log[0], main, snakemake)  # noqa: F821 - injected by Snakemake
