"""SIGTERM / SIGUSR1 -> every rank finishes the current step, a checkpoint is written, the run exits 0 (docs/design.md §9.6).

A signal only sets a flag. At each BATCH_END the ranks all-reduce it (MAX), so they agree on the same step
even when the signal reached them at different moments, and call `state.stop_training()`; Composer's
CheckpointSaver then saves at that step's BATCH_CHECKPOINT (end of training always saves).

The flag is read only between steps, so a rank blocked waiting for data (or in a collective with such a rank)
would never get there. The signal therefore also arms a deadline of `grace_s` on the rank's StallWatchdog,
which a thread keeps: a rank that has not checkpointed and exited by then writes every thread's stack to the
run folder and exits non-zero (gcc/train/watchdog.py).
"""
from __future__ import annotations

import signal

import torch
from composer.core import Callback, State
from composer.loggers import Logger
from composer.utils import dist

from gcc.data.workers import PREEMPTION_SIGNALS
from gcc.train.watchdog import StallWatchdog


class Preemption(Callback):
    def __init__(self, watchdog: StallWatchdog, grace_s: float):
        self.watchdog, self.grace_s = watchdog, grace_s
        self.requested = False  # this rank received a signal
        self.preempted_at: int | None = None  # the step all ranks stopped after
        self._old = {}

    def _handler(self, signum, frame):
        self.requested = True

    def fit_start(self, state: State, logger: Logger) -> None:
        for s in PREEMPTION_SIGNALS:
            self._old[s] = signal.signal(s, self._handler)
            self.watchdog.on_signal(s, self.grace_s, f"{signal.Signals(s).name} received, and the rank did not "
                                    f"checkpoint and exit within preemption_grace_s={self.grace_s:g} s")

    def batch_end(self, state: State, logger: Logger) -> None:
        flag = state.device.tensor_to_device(torch.tensor([1.0 if self.requested else 0.0]))
        dist.all_reduce(flag, reduce_operation="MAX")
        if float(flag.item()) > 0 and self.preempted_at is None:
            self.preempted_at = int(state.timestamp.batch)
            state.stop_training()

    def fit_end(self, state: State, logger: Logger) -> None:
        self.watchdog.close()  # deadlines already armed by a signal still hold until the process exits
        for s, h in self._old.items():
            signal.signal(s, h)
