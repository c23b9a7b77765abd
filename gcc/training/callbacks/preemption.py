"""SIGTERM / SIGUSR1 -> every rank finishes the current step, a checkpoint is written, the run exits 0 (docs/design.md §9.6).

A signal only sets a flag. The flag travels in each step's one reduction (`StepSync`, before the update), so
the ranks agree on the same step even when the signal reached them at different moments; at that step's
BATCH_END every rank calls `state.stop_training()`, and Composer's CheckpointSaver saves at its
BATCH_CHECKPOINT (end of training always saves). A signal that arrives after the reduction stops the next step.

Before step 1 there is one more place: after the step-0 validation (`eval_first`), which takes a while before
any step's reduction. There the ranks agree on the flag in a reduction of its own (`stop_before_first_step`) and
all stop before step 1: nothing was trained, so there is nothing to checkpoint (`PreemptedBeforeFirstStep`).

The flag is read only between steps, so a rank blocked waiting for data (or in a collective with such a rank)
would never get there. The signal therefore also arms a deadline of `grace_s` on the rank's StallWatchdog,
which a thread keeps: a rank that has not checkpointed and exited by then writes every thread's stack to the
run folder and exits non-zero (gcc/training/watchdog.py).
"""

from __future__ import annotations

import signal
from typing import Any

import torch
from composer.core import Callback, State
from composer.loggers import Logger
from composer.utils import dist

from gcc import exit_codes
from gcc.training.callbacks.step_sync import StepSync
from gcc.training.watchdog import StallWatchdog
from gcc.workers import PREEMPTION_SIGNALS


class PreemptedBeforeFirstStep(Exception):
    """A preemption signal came before step 1 (during the step-0 validation): every rank stops, nothing to save."""

    exit_code = exit_codes.OK


class Preemption(Callback):
    def __init__(self, watchdog: StallWatchdog, grace_s: float, sync: StepSync):
        self.watchdog, self.grace_s, self.sync = watchdog, grace_s, sync
        sync.flag("preempt", lambda: self.requested)
        self.requested = False  # this rank received a signal
        self.preempted_at: int | None = None  # the step all ranks stopped after
        self._old: dict[int, Any] = {}  # signal -> the handler it had before

    def _handler(self, signum, frame):
        self.requested = True

    def fit_start(self, state: State, logger: Logger) -> None:
        for s in PREEMPTION_SIGNALS:
            self._old[s] = signal.signal(s, self._handler)
            self.watchdog.on_signal(
                s,
                self.grace_s,
                f"{signal.Signals(s).name} received, and the rank did not "
                f"checkpoint and exit within preemption_grace_s={self.grace_s:g} s",
            )

    def stop_before_first_step(self, state: State) -> None:
        """Raise PreemptedBeforeFirstStep on every rank if any rank received a signal so far (a collective: every
        rank calls it, at the same point)."""
        flag = state.device.tensor_to_device(torch.tensor([1.0 if self.requested else 0.0]))
        if dist.get_world_size() > 1:
            dist.all_reduce(flag, reduce_operation="SUM")
        if flag.item() > 0:
            self.preempted_at = int(state.timestamp.batch)
            raise PreemptedBeforeFirstStep(
                f"preempted: stopped before step {self.preempted_at + 1}, after the "
                f"step-{self.preempted_at} validation; nothing was trained, so there is no "
                f"checkpoint: relaunch the same command to start the run"
            )

    def batch_end(self, state: State, logger: Logger) -> None:
        if self.sync.totals.get("preempt", 0.0) > 0 and self.preempted_at is None:
            self.preempted_at = int(state.timestamp.batch)
            state.stop_training()

    def fit_end(self, state: State, logger: Logger) -> None:
        self.watchdog.close()  # deadlines already armed by a signal still hold until the process exits
        for s, h in self._old.items():
            signal.signal(s, h)
