"""W&B and MLflow under Composer 0.32.1: what gcc relies on beyond their documented API (gcc/compat/__init__.py).

Composer 0.32.1's extras cap `wandb<0.19` and `mlflow<3`; gcc pins wandb 0.31.0 and mlflow-skinny 3.18.0
(constraints.txt), the versions that install beside this project's protobuf and torch. What was checked, by
tests/training/test_loggers.py running both for real (a W&B offline run, an MLflow file store) and by
tests/compat/test_wandb_mlflow_contract.py: Composer's WandBLogger and MLFlowLogger log metrics, hyperparameters and
the run's name through them, resume the same run on a relaunch, and close it. Two differences need help:

- `wandb_for_composer`: Composer reads the run's URL with `Run.get_url()`, which wandb removed (0.20) for
  `Run.url`; the method is put back, as an alias.
- `mlflow_run`: the client and run id of Composer's MLFlowLogger (its private `_mlflow_client`, `_run_id`), to
  log the training samples as artifacts (Composer's logger has no call for a file that is not an image).
- `allow_mlflow_file_store`: MLflow 3 refuses its file store (a local run folder's `mlruns/`) unless
  `MLFLOW_ALLOW_FILE_STORE` is set; Composer's logger does not set it.

Both libraries are optional (the `loggers` extra): their versions are checked when a run asks for them.
"""

from __future__ import annotations

import os

from gcc.compat import require


def wandb_for_composer() -> None:
    require("wandb", "gcc/compat/loggers.py")
    import wandb  # optional: only when the yaml asks for W&B

    if not hasattr(wandb.Run, "get_url"):
        wandb.Run.get_url = lambda run: run.url


def allow_mlflow_file_store() -> None:
    require("mlflow-skinny", "gcc/compat/loggers.py")
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")


def mlflow_run(logger) -> tuple:
    """(MlflowClient, run id) of a Composer MLFlowLogger; the run id is None before its INIT and off rank 0."""
    return getattr(logger, "_mlflow_client", None), getattr(logger, "_run_id", None)


def check_installed(names) -> None:
    """Stop before the run starts when a logger the yaml names is outside its verified version."""
    if "wandb" in names:
        require("wandb", "gcc/compat/loggers.py")
    if "mlflow" in names:
        require("mlflow-skinny", "gcc/compat/loggers.py")
