"""SIGTERM / SIGUSR1 -> every rank finishes the current step, a checkpoint is written, the run exits 0 (SPEC §9.6).

A signal only sets a flag. At each BATCH_END the ranks all-reduce it (MAX), so they agree on the same step
even when the signal reached them at different moments, and call `state.stop_training()`; Composer's
CheckpointSaver then saves at that step's BATCH_CHECKPOINT (end of training always saves).
"""
from __future__ import annotations

import signal

import torch
from composer.core import Callback, State
from composer.loggers import Logger
from composer.utils import dist

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class Preemption(Callback):
    def __init__(self):
        self.requested = False  # this rank received a signal
        self.preempted_at: int | None = None  # the step all ranks stopped after
        self._old = {}

    def _handler(self, signum, frame):
        self.requested = True

    def fit_start(self, state: State, logger: Logger) -> None:
        for s in SIGNALS:
            self._old[s] = signal.signal(s, self._handler)

    def batch_end(self, state: State, logger: Logger) -> None:
        flag = state.device.tensor_to_device(torch.tensor([1.0 if self.requested else 0.0]))
        dist.all_reduce(flag, reduce_operation="MAX")
        if float(flag.item()) > 0 and self.preempted_at is None:
            self.preempted_at = int(state.timestamp.batch)
            state.stop_training()

    def fit_end(self, state: State, logger: Logger) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
