"""Table 1 and the K sweep from the runs' summaries and evaluations (rlcore.analysis.tables)."""

from pathlib import Path

from rlcore.analysis.tables import (
    GROUP,
    K_SWEEP,
    PROVENANCE,
    TABLE1,
    environment_markdown,
    k_sweep,
    logged,
    quality_vs_k,
    quality_vs_k_markdown,
    read_runs,
    row_order,
    table1,
    to_markdown,
    write_csv,
)


def main(smk):
    rows = read_runs(smk.input.runs)
    for table, metrics, csv_out, md_out in (
        (table1(rows), TABLE1, smk.output.table1_csv, smk.output.table1_md),
        (k_sweep(rows), K_SWEEP, smk.output.k_sweep_csv, smk.output.k_sweep_md),
    ):
        write_csv(csv_out, table)
        Path(md_out).write_text(to_markdown(table, metrics))
    rows.sort(key=lambda r: (*row_order([r[k] for k in GROUP]), r["seed"]))
    write_csv(smk.output.environment_csv,
              [{k: r[k] for k in (*GROUP, "seed", *PROVENANCE)} for r in rows])
    Path(smk.output.environment_md).write_text(environment_markdown(rows))
    by_k = quality_vs_k(rows, **smk.params.k_axis)
    write_csv(smk.output.quality_vs_k_csv, by_k)
    Path(smk.output.quality_vs_k_md).write_text(quality_vs_k_markdown(by_k))


logged(snakemake.log[0], main, snakemake)  # noqa: F821 - injected by Snakemake
