"""Keep N checkpoints across restarts (Composer's own rotation only knows this process's saves), and say what each
save cost: `checkpoint ep0-ba6: 3.1 s, 0.42 GB` (SaveClock's time, which the preemption grace check also reads:
gcc/training/callbacks/preemption.py `GraceCheck`)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from composer.core import Callback, State
from composer.loggers import Logger
from composer.utils import dist

from gcc.training.checkpoint.files import checkpoint_step, disk_gb, latest_checkpoint, rotate_checkpoints
from gcc.training.run_folder import record_first_checkpoint

log = logging.getLogger(__name__)  # not `logger`: Composer passes its Logger under that name


class SaveClock(Callback):
    """A duration per save: `seconds[step]`, the time to write the checkpoint of `step` whole (`saved`: given by the
    saver, or from its BATCH_CHECKPOINT to the checkpoint complete). Runs before Composer's CheckpointSaver at each
    BATCH_CHECKPOINT (early in gcc/training/callbacks/__init__.py's table)."""

    def __init__(self):
        self.t0 = 0.0
        self.seconds: dict[int, float] = {}  # step -> its save's time, once complete (rank 0)

    def batch_checkpoint(self, state: State, logger: Logger) -> None:
        self.t0 = time.perf_counter()  # Composer's end-of-training save too: the last step's BATCH_CHECKPOINT

    def saved(self, step: int, seconds: float | None = None) -> float:
        """The checkpoint of `step` is complete: its save's time, recorded once: `seconds` from the saver (a
        background write's counts from its staging to the end of its write: gcc/training/checkpoint/background.py), or
        else the time since this step's BATCH_CHECKPOINT."""
        if step not in self.seconds:
            self.seconds[step] = seconds if seconds is not None else time.perf_counter() - self.t0
        return self.seconds[step]


class CheckpointRotation(Callback):
    """Must run after Composer's CheckpointSaver (the table appends it after it); `clock` must run before it."""

    def __init__(self, run_dir: str | Path, keep: int, clock: SaveClock | None = None):
        self.run_dir, self.keep = Path(run_dir), keep
        self.clock = clock if clock is not None else SaveClock()
        self._last = latest_checkpoint(self.run_dir)
        self._noted = False  # whether run.json was checked to note a committed checkpoint (record_first_checkpoint)

    def _after_save(self) -> None:
        if dist.get_global_rank() != 0:
            return
        latest = latest_checkpoint(self.run_dir)
        if latest is not None and latest != self._last:
            seconds = self.clock.saved(checkpoint_step(latest))
            log.info(f"checkpoint {latest.name}: {seconds:.1f} s, {disk_gb(latest):.3g} GB")
            if not self._noted:  # this launch's first: run.json notes the run's first (once a run)
                self._noted = True
                record_first_checkpoint(self.run_dir, checkpoint_step(latest))
            self._last = latest
        rotate_checkpoints(self.run_dir, self.keep)

    def batch_checkpoint(self, state: State, logger: Logger) -> None:
        self._after_save()

    def fit_end(self, state: State, logger: Logger) -> None:
        self._after_save()
