"""Progress as plain log lines, for runs whose stdout is a file (a scheduler's job log) (docs/training.md).

Every `console_log_interval` steps, and at a launch's last step, rank 0 logs one line: step/max, loss (mean of
the steps since the last line), lr, grad_norm, s/step (the wall period since the last line: data wait,
validation and checkpoints included, so the estimate counts them too), data wait per step, the statistics
declared with a console format (gcc/stats.py), this launch's elapsed time and the estimated time to max_duration at
the pace since the launch's first line (`eta ?` on that line: its period holds the loader workers' start, which
no later step pays). After each validation, one line per timestep with mse, gap_uncond and gap_nulltext. Composer's
progress bar is for a terminal; with it on and stdout a terminal, these lines stay off the console and go to
`<run_dir>/train.log` alone (gcc/training/console.py).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable

from composer.core import Callback, State
from composer.loggers import Logger
from composer.utils import dist

from gcc.training.callbacks.preemption import Preemption
from gcc.training.callbacks.train_stats import TrainStats
from gcc.training.callbacks.validation import ValidationLog
from gcc.training.columns import STEP_STATS
from gcc.training.console import RUN_LOG_ONLY, progress_bar_draws

log = logging.getLogger("gcc.train")


def duration(seconds: float) -> str:
    """`1h02m`, `4m05s`, `12s`."""
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def console_lines_wanted(every: int, progress_bar: bool) -> bool:
    """The progress lines on the console: on (every > 0) unless Composer's bar draws there."""
    return every > 0 and not progress_bar_draws(progress_bar)


class ConsoleLog(Callback):
    def __init__(
        self,
        every: int,
        max_steps: int,
        stats: TrainStats,
        val: ValidationLog,
        preemption: Preemption,
        console: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.every, self.max_steps, self.stats, self.val = every, max_steps, stats, val
        self.preemption = preemption
        self.extra = None if console else RUN_LOG_ONLY  # console False: the lines go to train.log alone
        self.clock = clock
        self._window: list[dict] = []
        self._t_start = self._t_line = 0.0
        self._first_line: tuple[float, int] | None = None  # (time, step) of this launch's first line: the eta's start

    def fit_start(self, state: State, logger: Logger) -> None:
        self._t_start = self._t_line = self.clock()
        self._first_line = None

    def eta(self, now: float, step: int) -> str:
        """The time to max_steps at the pace since this launch's first line; `?` until a line follows it."""
        if self._first_line is None:
            self._first_line = (now, step)
        t0, step0 = self._first_line
        if step >= self.max_steps:
            return "0s"
        if step <= step0:
            return "?"
        return duration(max(self.max_steps - step, 0) * (now - t0) / (step - step0))

    def batch_end(self, state: State, logger: Logger) -> None:
        row = self.stats.last_row
        if dist.get_global_rank() != 0 or row is None:
            return
        self._window.append(row)
        step = row["step"]
        if step % self.every and step < self.max_steps and self.preemption.preempted_at is None:
            return
        now = self.clock()
        per_step = (now - self._t_line) / len(self._window)
        w, self._window, self._t_line = self._window, [], now
        shown = "".join(f"{s.name} {row[s.name]:{s.console}}  " for s in STEP_STATS if s.console)
        log.info(
            f"step {step}/{self.max_steps}  loss {statistics.fmean(r['loss'] for r in w):.4f}  "
            f"lr {row['lr']:.2e}  grad_norm {row['grad_norm']:.3f}  {per_step:.2f} s/step  "
            f"data {statistics.fmean(r['data_time'] for r in w):.3f} s/step  {shown}"
            f"elapsed {duration(now - self._t_start)}  "
            f"eta {self.eta(now, step)}",
            extra=self.extra,
        )

    def eval_end(self, state: State, logger: Logger) -> None:
        if dist.get_global_rank() != 0:
            return
        for r in self.val.last:
            log.info(
                f"val step {r['step']}  t={r['timestep']:.1f}  mse {r['mse']:.4f}  "
                f"gap_uncond {r['gap_uncond']:+.4f}  gap_nulltext {r['gap_nulltext']:+.4f}  (n {r['n']})",
                extra=self.extra,
            )
