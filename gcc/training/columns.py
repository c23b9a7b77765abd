"""The columns of a run's `train_log.csv` and `val_log.csv` (docs/training.md, "train_log.csv columns"), and those a
resumed run must reproduce to the last digit. One list, shared by the writers (gcc/training/callbacks), `gcc-compare`
and the tests' own exactness check. Imports nothing, so that a tool reads it without loading the trainer."""

from __future__ import annotations

TRAIN_COLUMNS = [
    "step",
    "loss",
    "mse",
    "timestep",
    "lr",
    "cond_lr",
    "grad_norm",
    "sem_rms",
    "x_rms",
    "text_drop",
    "cond_drop",
    "mask_frac",
    "step_time",
    "data_time",
    "mem_gb",
    "epoch",
    "time",
    "clips",
]
VAL_COLUMNS = ["step", "timestep", "mse", "mse_uncond", "mse_nulltext", "gap_uncond", "gap_nulltext", "n"]

# wall-clock and memory measurements: they differ between any two launches
TIMING_COLUMNS = ["step_time", "data_time", "mem_gb", "time"]
# what a resumed run reproduces exactly (docs/training.md, "Resuming"): the step's clips, epoch, draws (timestep,
# drops, mask) and every number computed from them; validation rows entirely
EXACT_TRAIN = [c for c in TRAIN_COLUMNS if c not in TIMING_COLUMNS]
EXACT_VAL = list(VAL_COLUMNS)
