"""What the training objective (gcc/model/objective.py) reports, declared once: the statistics `GcTrainModel.loss`
puts in `outputs["stats"]` and the fields of a validation row (docs/model.md). Kept apart from the objective
because the column lists (gcc/training/columns.py) and the tools read it without loading torch.

A new loss term: compute it in `GcTrainModel.loss` (`outputs["stats"][name]`) and declare it here; the step's
reduction, `train_log.csv`, every logger's `train/<name>` and, with labels, the console line and gcc-plot follow."""

from __future__ import annotations

from gcc.stats import LOSS, MODEL, WEIGHTED, Stat

# outputs["stats"] of each micro-batch, detached scalars; in this order in their column groups
TRAIN_STATS = (
    Stat("mse", WEIGHTED, LOSS),
    Stat("timestep", WEIGHTED, LOSS),
    Stat("sem_rms", WEIGHTED, MODEL, console=".4f", plot="sem_rms (condition)"),
    Stat("x_rms", WEIGHTED, MODEL, plot="x_rms (latent stream)"),
)
# TensorBoard scalars `train/<name>` computed from a train_log row: numerator / denominator (nan when it is 0)
RATIOS = {"sem_over_x": ("sem_rms", "x_rms")}

# a validation row's measured values (each logged per timestep and as the mean over timesteps), then its row
VAL_VALUES = ("mse", "mse_uncond", "mse_nulltext", "gap_uncond", "gap_nulltext")
VAL_ROW_FIELDS = ("timestep", *VAL_VALUES, "n")
