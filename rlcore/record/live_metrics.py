"""Live metrics (`runtime.tensorboard: true`): every applied update's scalars and the final
held-out evaluation, as TensorBoard event files in the run directory, so that a running grid
can be watched with `tensorboard --logdir results/runs`.

Each scalar is keyed by the policy version its update made (TensorBoard's step) and by the
time it was committed (its wall time), so both x axes of TensorBoard work. A run writes into
`tensorboard.partial/` and finalize moves it to `tensorboard/`, like every other file of a
run; a crashed run's curves stay readable there. The writer is the tensorboard package's,
through torch's SummaryWriter, imported only when asked for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

TB_DIR = "tensorboard"
FLUSH_S = 10  # how stale the curves of a running job may be
_NOT_SCALARS = frozenset({"version", "batch_id", "sample_ids", "t_commit"})


def update_scalars(row: dict[str, Any]) -> dict[str, float]:
    """The scalars of one updates.jsonl row, by tag: the batch's own under `train/`, the
    objective's and timing statistics under the names they are recorded with."""
    return {key if "/" in key else f"train/{key}": float(value)
            for key, value in row.items()
            if key not in _NOT_SCALARS and isinstance(value, int | float)
            and not isinstance(value, bool)}


def eval_scalars(result: dict[str, Any]) -> dict[str, float]:
    """The held-out evaluation's pass rates, by tag."""
    return {f"eval/{key}": float(result[key])
            for key in ("greedy_pass_rate", "sampled_pass_rate")}


class LiveMetrics:
    """A TensorBoard writer for one run directory's event files."""

    def __init__(self, log_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(log_dir), flush_secs=FLUSH_S)

    def write(self, scalars: dict[str, float], step: int, walltime: float) -> None:
        for tag, value in scalars.items():
            self._writer.add_scalar(tag, value, global_step=step, walltime=walltime)

    def close(self) -> None:
        self._writer.close()
