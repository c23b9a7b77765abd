"""The columns of a run's `train_log.csv` and `val_log.csv` (docs/training.md, "train_log.csv columns"), and those a
resumed run must reproduce to the last digit. Composed from the statistics' declarations (gcc/stats.py) and the
trainer's own columns; shared by the writers (gcc/training/callbacks), `gcc-compare` and the tests' own exactness
check. Loads no torch, so that a tool reads it without loading the trainer. A resumed run appends to its CSV and
`gcc-compare` compares by column: the order below is the logs' (tests/training/test_columns.py pins it)."""

from __future__ import annotations

from gcc.data.sample_rng import BATCH_STATS
from gcc.model.config import TRAIN_STATS, VAL_ROW_FIELDS
from gcc.stats import BATCH, LOSS, MODEL

# the statistics a step sums over its micro-batches and ranks (StepSync, TrainStats), each declared where it is made
STEP_STATS = (*TRAIN_STATS, *BATCH_STATS)


def _group(column: str) -> list[str]:
    return [s.name for s in STEP_STATS if s.column == column]


TRAIN_COLUMNS = [
    "step",
    "loss",
    *_group(LOSS),
    "lr",
    "cond_lr",
    "grad_norm",
    *_group(MODEL),
    *_group(BATCH),
    "step_time",
    "data_time",
    "mem_gb",
    "epoch",
    "time",
    "clips",
]
VAL_COLUMNS = ["step", *VAL_ROW_FIELDS]

# wall-clock and memory measurements: they differ between any two launches
TIMING_COLUMNS = ["step_time", "data_time", "mem_gb", "time"]
# what a resumed run reproduces exactly (docs/training.md, "Resuming"): the step's clips, epoch, draws (timestep,
# drops, mask) and every number computed from them; validation rows entirely
EXACT_TRAIN = [c for c in TRAIN_COLUMNS if c not in TIMING_COLUMNS]
EXACT_VAL = list(VAL_COLUMNS)
