"""SIGTERM / SIGUSR1 / SIGINT (Ctrl-C) -> every rank finishes the current step, a checkpoint is written, the run exits
0 (docs/design.md §9.6). A second Ctrl-C stops every rank at once (exit 130), without a checkpoint.

A signal only sets a flag. The flag travels in each step's one reduction (`StepSync`, before the update), so
the ranks agree on the same step even when the signal reached them at different moments; at that step's
BATCH_END every rank calls `state.stop_training()`, and Composer's CheckpointSaver saves at its
BATCH_CHECKPOINT (end of training always saves). A signal that arrives after the reduction stops the next step.

The grace is spent on the save (docs/training.md, "Preemption grace"): the work due at the preempted step that
Composer would run between its BATCH_END and BATCH_CHECKPOINT (the validation, and the training samples at its
EVAL_END) or at BATCH_END (the export) is skipped on every rank (each registers what is due when with `skippable`
and asks `skips`), one log line says what, and the checkpoint records it (`state_dict`). The relaunch resumes from
that checkpoint with the weights of that step and runs the skipped work before its first step (`catch_up`): the
run's logs and exports are the uninterrupted run's. A signal at the last step stops nothing: the run ends there,
its last validation and export run as usual.

Before step 1 there is one more place: after the step-0 validation (`eval_first`), which takes a while before
any step's reduction. There the ranks agree on the flag in a reduction of its own (`stop_before_first_step`) and
all stop before step 1: nothing was trained, so there is nothing to checkpoint (`PreemptedBeforeFirstStep`).

The flag is read only between steps, so a rank blocked waiting for data (or in a collective with such a rank)
would never get there. The signal therefore also arms a deadline of `grace_s` on the rank's StallWatchdog,
which a thread keeps: a rank that has not checkpointed and exited by then writes every thread's stack to the
run folder and exits non-zero (gcc/training/watchdog.py).
"""

from __future__ import annotations

import logging
import math
import os
import signal
import statistics
from collections.abc import Callable
from typing import Any

import torch
from composer.core import Callback, State
from composer.loggers import Logger
from composer.utils import dist

from gcc import exit_codes
from gcc.training.callbacks.step_sync import StepSync
from gcc.training.console import ALL_RANKS
from gcc.training.watchdog import StallWatchdog
from gcc.workers import PREEMPTION_SIGNALS

log = logging.getLogger(__name__)  # not `logger`: Composer passes its Logger under that name


class PreemptedBeforeFirstStep(Exception):
    """A preemption signal came before step 1 (during the step-0 validation): every rank stops, nothing to save."""

    exit_code = exit_codes.OK


class Preemption(Callback):
    def __init__(
        self, watchdog: StallWatchdog, grace_s: float, sync: StepSync, signal_at: dict[int, int] | None = None
    ):
        """`signal_at`: fault injection for tests, {step: the signal the last rank sends the launch's process group
        as it starts} (`faults.sigterm_at_step`, `faults.sigint_at_step`; step 0 is none)."""
        self.watchdog, self.grace_s, self.sync = watchdog, grace_s, sync
        self.signal_at = {step: s for step, s in (signal_at or {}).items() if step}
        sync.flag("preempt", lambda: self.requested)
        self.requested = False  # this rank received a signal
        self.interrupted = False  # ... a Ctrl-C among them
        self.preempted_at: int | None = None  # the step all ranks stopped after
        self._old: dict[int, Any] = {}  # signal -> the handler it had before
        self._due: list[tuple[str, Callable[[int], bool]]] = []  # what a preempted step skips, and when it is due
        self.skipped: list[str] = []  # what this launch skipped at preempted_at
        self.pending: tuple[int, list[str]] | None = None  # the loaded checkpoint's (step, what was skipped there)

    def skippable(self, name: str, due: Callable[[int], bool]) -> None:
        """`name` (the log line's word for it) is due at the steps where `due(step)`; a preempted step skips it."""
        self._due.append((name, due))

    def skips(self, name: str, step: int) -> bool:
        """Whether `name`, due at `step`, is skipped there: the ranks stopped after `step` on a signal."""
        return self.preempted_at == step and name in self.skipped

    def catch_up(self, name: str, step: int) -> bool:
        """Whether the launch that wrote the checkpoint resumed at `step` skipped `name` there: this launch runs it
        before its first step."""
        return self.pending is not None and self.pending[0] == step and name in self.pending[1]

    def state_dict(self) -> dict[str, Any]:  # in every checkpoint (Composer saves a callback's state_dict)
        # plain values (a sharded checkpoint stores these beside the tensors)
        return {"step": -1 if self.preempted_at is None else self.preempted_at, "skipped": ",".join(self.skipped)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("skipped"):
            self.pending = (int(state["step"]), str(state["skipped"]).split(","))

    def _handler(self, signum, frame):
        self.requested = True
        self.interrupted = self.interrupted or signum == signal.SIGINT

    def fit_start(self, state: State, logger: Logger) -> None:
        for s in PREEMPTION_SIGNALS:
            self._old[s] = signal.signal(s, self._handler)
            self.watchdog.on_signal(
                s,
                self.grace_s,
                f"{signal.Signals(s).name} received, and the rank did not "
                f"checkpoint and exit within preemption_grace_s={self.grace_s:g} s",
            )
        # kept by the watchdog's thread, which sees a signal at once even while the main thread waits in a
        # collective or for data
        self.watchdog.exit_on_repeat(
            signal.SIGINT,
            exit_codes.INTERRUPTED,
            "a second Ctrl-C (SIGINT): stopped at once, without a checkpoint; a relaunch resumes from the last "
            "complete one",
        )
        step = int(state.timestamp.batch)
        if self.pending is not None and self.pending[0] == step:  # the callbacks that own the work run it next
            log.info(
                f"step {step}: running first what the preempted launch skipped there: {', '.join(self.pending[1])}"
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

    def batch_start(self, state: State, logger: Logger) -> None:
        step = int(state.timestamp.batch) + 1
        if step in self.signal_at and dist.get_global_rank() == dist.get_world_size() - 1:
            # fault injection (tests): the launch's process group, as a cluster's preemption or a terminal's
            # Ctrl-C; this rank's own handler has set the flag before the step's reduction, so every rank stops
            # after this step
            os.killpg(os.getpgid(0), self.signal_at[step])

    def batch_end(self, state: State, logger: Logger) -> None:
        if self.sync.totals.get("preempt", 0.0) > 0 and self.preempted_at is None:
            step = int(state.timestamp.batch)
            if state.max_duration is not None and state.timestamp >= state.max_duration:
                log.info(f"preemption signal in the last step ({step}): the run ends there as it would have")
                return
            self.preempted_at = step
            self.skipped = [name for name, due in self._due if due(step)]
            state.stop_training()
            log.info(
                f"preempted at step {step}: saving now"
                + (f", skipped {', '.join(self.skipped)} (the relaunch runs them first)" if self.skipped else "")
            )

    def _late(self, signum, frame):
        """A signal once the fit is over (the launch ends anyway: nothing is left to save): noted, so that a
        launcher's SIGTERM passed on late cannot turn the launch's code into 143 (the previous handlers, Composer's,
        would exit with it, even during the last save); a second Ctrl-C still stops the rank at once."""
        if signum == signal.SIGINT and self.interrupted:
            from gcc.training.ending import leave_now  # the end of a launch: loaded by now

            log.error("a second Ctrl-C (SIGINT): stopped at once", extra=ALL_RANKS)
            leave_now(exit_codes.INTERRUPTED)
        self.interrupted = self.interrupted or signum == signal.SIGINT
        self.requested = True

    def fit_end(self, state: State, logger: Logger) -> None:
        self.watchdog.close()  # deadlines already armed by a signal still hold until the process exits
        for s in self._old:
            signal.signal(s, self._late)


def grace_warning(
    grace_s: float, save_interval: int, save_s: float, upload_s: float | None = None, step_s: float | None = None
) -> str | None:
    """The warning when a preemption's save would not fit in the grace: a step (the signal may come as one starts),
    the save, and with `save_folder: s3://...` its upload and commit, against `preemption_grace_s`; None when it
    fits."""
    total = save_s + (upload_s or 0.0) + (step_s or 0.0)
    if total <= grace_s:
        return None
    return (
        f"the first checkpoint took {save_s:.1f} s to save"
        + (f" (+{upload_s:.1f} s upload and commit)" if upload_s is not None else "")
        + (f"; with a step of {step_s:.1f} s" if step_s is not None else "; with no step timed yet")
        + f" that is {total:.1f} s > preemption_grace_s={grace_s:g}: a preemption would exit 5 and lose up to "
        f"save_interval={save_interval} steps; raise preemption_grace_s to at least {math.ceil(total)} s, and the "
        f'scheduler\'s grace with it (docs/training.md, "Preemption grace")'
    )


class GraceCheck(Callback):
    """Once per launch, on rank 0, after its first checkpoint is complete (and committed, with `save_folder:
    s3://...`): `grace_warning` with the save's time (SaveClock's), the upload's and the median step time so far.
    Runs after the checkpoint upload (the after-saver group); a save written in the background is checked at a later
    BATCH_CHECKPOINT, once its time is known."""

    def __init__(
        self,
        grace_s: float,
        save_interval: int,
        save_seconds: dict[int, float],
        step_times: list[float],
        upload_seconds: dict[int, float] | None = None,
    ):
        """`save_seconds` (SaveClock.seconds), `upload_seconds` (CheckpointUpload.seconds; None: no store): step ->
        seconds, filled as saves complete; `step_times`: the step times measured so far (StepDeadline.times)."""
        self.grace_s, self.save_interval = grace_s, save_interval
        self.save_seconds, self.step_times, self.upload_seconds = save_seconds, step_times, upload_seconds
        self.checked = False

    def _check(self) -> None:
        if self.checked or dist.get_global_rank() != 0 or not self.save_seconds:
            return
        first = min(self.save_seconds)
        if self.upload_seconds is not None and first not in self.upload_seconds:
            return  # not committed yet
        self.checked = True
        line = grace_warning(
            self.grace_s,
            self.save_interval,
            self.save_seconds[first],
            None if self.upload_seconds is None else self.upload_seconds[first],
            statistics.median(self.step_times) if self.step_times else None,
        )
        if line is not None:
            log.warning(line)

    def batch_checkpoint(self, state: State, logger: Logger) -> None:
        self._check()

    def fit_end(self, state: State, logger: Logger) -> None:
        self._check()
