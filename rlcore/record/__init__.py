"""What a run writes: the ledger, the summary, the schedule format, the run directory,
live metrics and the machine-load meter."""
