"""`val_log.csv` rows and TensorBoard `val/*_t{t}`, `val/*_mean` after each validation (docs/design.md §9.8).

The numbers come from the objective's `val_mse` metric (torchmetrics, synced over ranks), so any world size
gives the same rows.
"""
from __future__ import annotations

from composer.core import Callback, State
from composer.loggers import Logger

from gcc.train.columns import VAL_COLUMNS
_VALUES = ["mse", "mse_uncond", "mse_nulltext", "gap_uncond", "gap_nulltext"]


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
            for k in _VALUES:
                scalars[f"val/{k}_t{r['timestep']:.1f}"] = r[k]
        for k in _VALUES:
            scalars[f"val/{k}_mean"] = sum(r[k] for r in self.last) / max(len(self.last), 1)
        logger.log_metrics(scalars)
