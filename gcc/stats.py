"""What a statistic of a training step declares, once, where it is produced (docs/training.md, "train_log.csv
columns"): its name, how the step's micro-batches and ranks reduce it, which group of `train_log.csv` columns it
joins, and its console and plot labels. The objective's statistics are declared in `gcc/model/config.py`,
the batch's in `gcc/data/sample_rng.py`; `StepSync`, `TrainStats`, `gcc/training/columns.py`, the console line and
`gcc-plot` take them from there. Imports nothing, so that a tool reads the declarations without loading torch."""

from __future__ import annotations

from dataclasses import dataclass

# How a statistic becomes the step's value. Every one is summed over the step's micro-batches and ranks (StepSync's
# one SUM all-reduce); then
WEIGHTED = "weighted"  # a micro-batch mean, weighted by the micro-batch's clip count; the sum divided by n
MEAN = "mean"  # one value per clip; the sum divided by n (the step's clip count)
SUM = "sum"  # the sum itself (a count)
REDUCTIONS = (WEIGHTED, MEAN, SUM)

# The groups of train_log.csv columns a statistic joins, in the order gcc/training/columns.py lays them out
LOSS = "loss"  # right after `loss`: the loss's terms and draws
MODEL = "model"  # after `grad_norm`: the model's activation statistics
BATCH = "batch"  # after those: the batch's dropouts and mask
COLUMN_GROUPS = (LOSS, MODEL, BATCH)


@dataclass(frozen=True)
class Stat:
    name: str  # its train_log.csv column, TensorBoard's `train/<name>` and its StepSync total
    reduce: str  # one of REDUCTIONS
    column: str  # one of COLUMN_GROUPS; "" = not a train_log.csv column (a StepSync total only)
    key: str = ""  # a batch statistic: the batch key it is read from (default: its name)
    console: str = ""  # the format of its value on the console's progress line ("" = not shown there)
    plot: str = ""  # its legend in gcc-plot's statistics panel ("" = not plotted)

    def __post_init__(self):
        if self.reduce not in REDUCTIONS or self.column not in (*COLUMN_GROUPS, ""):
            raise ValueError(f"{self}: reduce must be one of {REDUCTIONS}, column one of {COLUMN_GROUPS} or ''")
