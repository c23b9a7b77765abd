"""Composer's TensorboardLogger, one event file per launch instead of one per flush.

Composer 0.32.1 closes its SummaryWriter at every flush (every `flush_interval` steps, every epoch end and
every validation) so that a finished file can be uploaded to object storage; locally that leaves a new event
file each time (hundreds per run, which TensorBoard then loads one by one). It also opens an (empty) event
file on every rank, and writes one more hparams file per validation. The run folder is local: here only
rank 0 writes, a flush only flushes, and there are no hparams files (`config.json` holds the config).

Composer writes each scalar as its own event (a protobuf, a queue put and a lock each: ~60 us, 22 scalars a
step, over 1 ms); here one `log_metrics` call is one event holding all its scalars, which TensorBoard reads the
same way.
"""

from __future__ import annotations

import time

from composer.core import State
from composer.loggers import Logger, TensorboardLogger
from composer.utils import dist


class LocalTensorboardLogger(TensorboardLogger):
    def _silent(self) -> bool:
        return self.rank_zero_only and dist.get_global_rank() != 0

    def init(self, state: State, logger: Logger) -> None:
        if self._silent():
            self.run_name = state.run_name
        else:
            super().init(state, logger)

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if self._silent():
            return
        from tensorboard.compat.proto.summary_pb2 import Summary

        self.current_metrics.update(metrics)
        values = []
        for tag, metric in metrics.items():
            if isinstance(metric, str):
                continue
            try:  # a number or a one-element tensor/array; anything else is skipped, as Composer does
                values.append(Summary.Value(tag=tag, simple_value=float(metric)))
            except (TypeError, ValueError, RuntimeError):
                continue
        if values and self.writer is not None:
            self.writer._get_file_writer().add_summary(Summary(value=values), step, time.time())

    def eval_end(self, state: State, logger: Logger) -> None:
        self._flush(logger)

    def _flush(self, logger: Logger) -> None:
        if self.writer is not None:
            self.writer.flush()

    def close(self, state: State, logger: Logger) -> None:
        if self.writer is not None:
            self.writer.close()
        self.writer = None
