"""Composer's TensorboardLogger, one event file per launch instead of one per flush.

Composer 0.32.1 closes its SummaryWriter at every flush (every `flush_interval` steps, every epoch end and
every validation) so that a finished file can be uploaded to object storage; locally that leaves a new event
file each time (hundreds per run, which TensorBoard then loads one by one). The run folder is local, so
here a flush only flushes.
"""
from __future__ import annotations

from composer.loggers import Logger, TensorboardLogger
from composer.utils import dist


class LocalTensorboardLogger(TensorboardLogger):
    def _flush(self, logger: Logger) -> None:
        if self.writer is not None and not (self.rank_zero_only and dist.get_global_rank() != 0):
            self.writer.flush()

    def close(self, state, logger: Logger) -> None:
        if self.writer is not None:
            self.writer.close()
        self.writer = None
