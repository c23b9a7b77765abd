"""Keep N full checkpoints across restarts (Composer's own rotation only knows this process's saves)."""
from __future__ import annotations

from pathlib import Path

from composer.core import Callback, State
from composer.loggers import Logger
from composer.utils import dist

from gcc.run_folder import rotate_checkpoints


class CheckpointRotation(Callback):
    """Must run after Composer's CheckpointSaver (the builder appends it last)."""

    def __init__(self, run_dir: str | Path, keep: int):
        self.run_dir, self.keep = Path(run_dir), keep

    def _rotate(self) -> None:
        if dist.get_global_rank() == 0:
            rotate_checkpoints(self.run_dir, self.keep)

    def batch_checkpoint(self, state: State, logger: Logger) -> None:
        self._rotate()

    def fit_end(self, state: State, logger: Logger) -> None:
        self._rotate()
