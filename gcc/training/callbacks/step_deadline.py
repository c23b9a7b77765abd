"""A rank that completes no step in time stops instead of waiting forever (a stuck collective, a dead loader
worker, a stuck storage read): the StallWatchdog's thread writes every thread's stack to
`<run_dir>/stacks/rank<R>.txt` and exits 5, so a scheduler restarts the job. Composer's `dist_timeout` covers
only collectives; this covers the rest.

The deadline is `stall_timeout_s` (generous: model build, the first steps, compilation) until `WARMUP` steps
have been timed, then `max(stall_floor_s, FACTOR × median step time)`, capped by `stall_timeout_s`. Validation
and the end of a launch get `stall_timeout_s` again. 0 turns it off.
"""

from __future__ import annotations

import statistics
import time

from composer.core import Callback, State
from composer.loggers import Logger

from gcc.training.watchdog import StallWatchdog

WARMUP, FACTOR, WINDOW = 10, 20.0, 50


class StepDeadline(Callback):
    def __init__(self, watchdog: StallWatchdog, timeout_s: float, floor_s: float):
        self.watchdog, self.timeout_s, self.floor_s = watchdog, timeout_s, floor_s
        self.times: list[float] = []
        self._last: float | None = None

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

    def batch_end(self, state: State, logger: Logger) -> None:
        now = time.monotonic()
        if self._last is not None:
            self.times.append(now - self._last)
        self._last = now
        self._arm(self.deadline())

    def eval_start(self, state: State, logger: Logger) -> None:
        self._arm(self.timeout_s)

    def eval_end(self, state: State, logger: Logger) -> None:
        self._last = time.monotonic()  # the validation's time is not a step's
        self._arm(self.deadline())

    def fit_end(self, state: State, logger: Logger) -> None:
        self._arm(self.timeout_s)  # the final checkpoint / export still have a (generous) deadline

    def close(self, state: State, logger: Logger) -> None:
        self.watchdog.disarm("step")
