"""`val_log.csv` rows and TensorBoard `val/*_t{t}`, `val/*_mean` after each validation (docs/design.md §9.8),
and the step-0 validation of the starting weights (`eval_first`).

The numbers come from the objective's `val_mse` metric (torchmetrics, synced over ranks), so any world size
gives the same rows.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

from composer.core import Callback, State
from composer.loggers import Logger
from composer.utils import dist

from gcc.model.config import VAL_VALUES
from gcc.training.callbacks.preemption import Preemption
from gcc.training.columns import VAL_COLUMNS


class ValidationLog(Callback):
    def __init__(self, label: str = "val"):
        self.label = label
        self.last: list[dict] = []

    def eval_end(self, state: State, logger: Logger) -> None:
        metric = state.eval_metrics.get(self.label, {}).get("val_mse")
        if metric is None:
            return
        rows = metric.rows()  # a collective: every rank calls it
        step = int(state.timestamp.batch)
        self.last = [{"step": step, **r} for r in rows]
        logger.log_table(VAL_COLUMNS, [[r[c] for c in VAL_COLUMNS] for r in self.last], name="val_log")
        scalars = {}
        for r in self.last:
            for k in VAL_VALUES:
                scalars[f"val/{k}_t{r['timestep']:.1f}"] = r[k]
        for k in VAL_VALUES:
            scalars[f"val/{k}_mean"] = sum(r[k] for r in self.last) / max(len(self.last), 1)
        logger.log_metrics(scalars)


class ValidateAtStart(Callback):
    """The validation a launch runs before its first step: the step-0 validation (`eval_first`: the starting weights
    validated, the run's baseline: step-0 rows in val_log.csv and every logger; only a launch that starts at step 0,
    `at_step0`), or on a resume the validation the preempted launch skipped at the step it resumes from (the
    checkpoint's weights are that step's: the same rows as an uninterrupted run's; gcc/training/callbacks/
    preemption.py). A resume never repeats the step-0 one.

    The step-0 one runs at the first EPOCH_START, after every FIT_START handler: the preemption signals are handled
    by then, and the CSV logger has already dropped the rows a launch that died before its first checkpoint left (it
    trims at FIT_START, once the checkpoint the launch resumes from, or none, is loaded). A signal that came during
    it stops every rank before step 1 (`Preemption.stop_before_first_step`). A resume may start mid-epoch (no
    EPOCH_START): its catch-up runs at FIT_START (this callback comes after the loggers and the preemption); a
    signal during it stops the next step as always. `inject_sigterm`: fault injection for tests
    (`faults.sigterm_at_val0`)."""

    def __init__(self, preemption: Preemption, at_step0: bool = True, inject_sigterm: bool = False):
        self.preemption, self.at_step0, self.inject_sigterm = preemption, at_step0, inject_sigterm
        self.evaluate: Callable[[], object] | None = None  # the Trainer's eval(): set once the Trainer exists

    def fit_start(self, state: State, logger: Logger) -> None:
        if self.evaluate is not None and self.preemption.catch_up("validation", int(state.timestamp.batch)):
            self.evaluate()  # ValidationLog logs the rows, TrainingSamples samples when due, at EVAL_END

    def epoch_start(self, state: State, logger: Logger) -> None:
        if not self.at_step0 or int(state.timestamp.batch) != 0 or self.evaluate is None:
            return
        if self.inject_sigterm and dist.get_global_rank() == dist.get_world_size() - 1:
            os.kill(os.getpid(), signal.SIGTERM)  # fault injection (tests): handled as the validation starts
        self.evaluate()  # the trainer's evaluators, as at eval_interval: ValidationLog logs the rows at EVAL_END
        self.preemption.stop_before_first_step(state)
