"""`config.json` at the start and `done.json` at the end of each launch (docs/design.md §9.10)."""

from __future__ import annotations

import json
from pathlib import Path
from statistics import mean

from composer.core import Callback, State
from composer.loggers import Logger
from composer.utils import dist

from gcc.storage import atomic_write
from gcc.training.callbacks.train_stats import TrainStats


def _write_json(path: Path, obj) -> None:
    atomic_write(path, json.dumps(obj, indent=1, sort_keys=True, default=str))


class RunFiles(Callback):
    def __init__(self, run_dir: str | Path, config: dict, stats: TrainStats):
        self.run_dir, self.config, self.stats = Path(run_dir), config, stats

    def fit_start(self, state: State, logger: Logger) -> None:
        if dist.get_global_rank() == 0:
            _write_json(self.run_dir / "config.json", {**self.config, "start_step": int(state.timestamp.batch)})

    def fit_end(self, state: State, logger: Logger) -> None:
        ds = getattr(state.train_dataloader, "dataset", None)
        position = (
            ds.state_dict(num_samples=int(state.timestamp.sample_in_epoch), from_beginning=True)
            if ds is not None and hasattr(ds, "state_dict")
            else None
        )
        if dist.get_global_rank() == 0:
            st, dt = self.stats.step_times, self.stats.data_times
            _write_json(
                self.run_dir / "done.json",
                {
                    "step": int(state.timestamp.batch),
                    "steps_this_launch": len(st),
                    "s_per_step_mean": mean(st) if st else None,
                    "data_s_per_step_mean": mean(dt) if dt else None,
                    "data_position": position,
                },
            )
