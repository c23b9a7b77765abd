"""A rank that completes no step in time stops instead of waiting forever (a stuck collective, a dead loader
worker, a stuck storage read): the StallWatchdog's thread writes every thread's stack to
`<run_dir>/stacks/rank<R>.txt` and exits 5, so a scheduler restarts the job. Composer's `dist_timeout` covers
only collectives; this covers the rest.

The deadline is `stall_timeout_s` (generous: model build, the first steps, compilation) until `WARMUP` steps
have been timed, then `max(stall_floor_s, FACTOR × median step time)`, capped by `stall_timeout_s`. Validation,
a step after which the run writes (a checkpoint, an export: `writes(step)`) and the end of a launch get
`stall_timeout_s` again: Composer saves at the step's BATCH_CHECKPOINT (the end-of-training save too, before
FIT_END), so a save runs under whatever BATCH_END armed. Once the save is done (`after_save`, which the builder
runs after Composer's CheckpointSaver and the upload), the step deadline is armed again and the next step is
timed from there: a write's time is no step's. 0 turns it off.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from composer.core import Callback, State
from composer.loggers import Logger

from gcc.training.watchdog import StallWatchdog

WARMUP, FACTOR, WINDOW = 10, 20.0, 50


def writes_at(max_steps: int, *every: int | Callable[[int], bool]) -> Callable[[int], bool]:
    """The steps after which the run writes: every `every[i]` steps (0: never) or where `every[i](step)` holds (a
    background checkpoint write committed, then uploaded), and the last step."""
    return lambda step: step == max_steps or any(e(step) if callable(e) else (e > 0 and step % e == 0) for e in every)


class StepDeadline(Callback):
    def __init__(
        self,
        watchdog: StallWatchdog,
        timeout_s: float,
        floor_s: float,
        writes: Callable[[int], bool] = lambda step: False,
    ):
        self.watchdog, self.timeout_s, self.floor_s, self.writes = watchdog, timeout_s, floor_s, writes
        self.times: list[float] = []
        self._last: float | None = None
        self.after_save = _AfterSave(self)  # must run after Composer's CheckpointSaver (the builder appends it)

    def _arm(self, seconds: float) -> None:
        if self.timeout_s > 0:
            self.watchdog.arm(
                "step",
                seconds,
                f"no step completed within {seconds:.0f} s (stall_timeout_s="
                f"{self.timeout_s:g}, stall_floor_s={self.floor_s:g})",
            )

    def deadline(self) -> float:
        if len(self.times) < WARMUP:
            return self.timeout_s
        return min(self.timeout_s, max(self.floor_s, FACTOR * statistics.median(self.times[-WINDOW:])))

    def fit_start(self, state: State, logger: Logger) -> None:
        self._arm(self.timeout_s)

    def _arm_after(self, state: State) -> None:
        """The deadline after this step: `stall_timeout_s` when a checkpoint or an export follows it (until
        `after_save`)."""
        self._arm(self.timeout_s if self.writes(int(state.timestamp.batch)) else self.deadline())

    def saved(self) -> None:
        """The step's writes are done: the next step is timed from now, under the step deadline."""
        self._last = time.monotonic()
        self._arm(self.deadline())

    def batch_end(self, state: State, logger: Logger) -> None:
        now = time.monotonic()
        if self._last is not None:
            self.times.append(now - self._last)
        self._last = now
        self._arm_after(state)

    def eval_start(self, state: State, logger: Logger) -> None:
        self._arm(self.timeout_s)

    def eval_end(self, state: State, logger: Logger) -> None:
        self._last = time.monotonic()  # the validation's time is not a step's
        self._arm_after(state)  # validation runs between BATCH_END and BATCH_CHECKPOINT

    def fit_end(self, state: State, logger: Logger) -> None:
        self._arm(self.timeout_s)  # the remote uploads' wait and closing the loggers

    def close(self, state: State, logger: Logger) -> None:
        self.watchdog.disarm("step")


class _AfterSave(Callback):
    """StepDeadline's hook after the step's saves (Composer's CheckpointSaver, then the upload)."""

    def __init__(self, deadline: StepDeadline):
        self.deadline = deadline

    def batch_checkpoint(self, state: State, logger: Logger) -> None:
        if self.deadline.writes(int(state.timestamp.batch)):
            self.deadline.saved()
