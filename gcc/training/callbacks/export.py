"""`step-N.safetensors` every `export_every` steps and at the end of training (docs/design.md §9.9), with
`algorithms.ema` also `step-N.ema.safetensors` (the EMA's averages, metadata `weights=ema`), also uploaded beside the
checkpoints when they are on object storage, as long as this launch owns that prefix (a launch that lost it to
another stops on every rank: `TakenOver`, exit code 3). A preempted step skips its export; the relaunch writes it
before its first step (gcc/training/callbacks/preemption.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import torch
from composer.core import Callback, State
from composer.loggers import Logger
from composer.utils import dist

from gcc.errors import Refusal
from gcc.model.export import EXPORT_DTYPE, save_gc
from gcc.model.fsdp import full_state_dict
from gcc.training.callbacks.ema import Ema
from gcc.training.callbacks.preemption import Preemption
from gcc.training.checkpoint.store import CheckpointStore, TakenOver

log = logging.getLogger(__name__)  # not `logger`: Composer passes its Logger under that name


class Export(Callback):
    def __init__(
        self,
        run_dir: str | Path,
        dit: torch.nn.Module,
        every: int,
        max_steps: int,
        metadata: Callable[[int], dict],
        preemption: Preemption | None = None,
        store: CheckpointStore | None = None,
        launch: str = "",
        ema: Ema | None = None,
    ):
        self.run_dir, self.dit, self.every, self.max_steps = Path(run_dir), dit, every, max_steps
        self.metadata, self.preemption, self.store, self.launch = metadata, preemption, store, launch
        self.ema = ema
        self.last_step = -1

    def due(self, step: int) -> bool:
        """Every `export_every` steps (the end of training's export comes at FIT_END); registered with the
        preemption, which skips it at a preempted step (gcc/training/callbacks/__init__.py)."""
        return bool(self.every) and step % self.every == 0

    def export(self, state: State) -> None:
        step = int(state.timestamp.batch)
        taken_over = [""]
        exports = [("", "raw", None)] + ([(".ema", "ema", self.ema.averages)] if self.ema is not None else [])
        for suffix, weights, instead in exports:
            # under FSDP a collective per tensor; the full bf16 state lands on rank 0's CPU
            sd = full_state_dict(self.dit, EXPORT_DTYPE, keep=dist.get_global_rank() == 0, instead=instead)
            if dist.get_global_rank() == 0 and not taken_over[0]:
                meta = {**self.metadata(step), "weights": weights}
                path = save_gc(sd, self.run_dir / f"step-{step}{suffix}.safetensors", meta)
                log.info(f"export: {path}")
                if self.store is not None:
                    try:
                        self.store.upload_export(path, self.launch)
                        log.info(f"export: uploaded to {self.store.url}/{path.name}")
                    except (TakenOver, Refusal) as e:
                        taken_over[0] = str(e)
            del sd
        self.last_step = step
        dist.broadcast_object_list(taken_over, src=0)  # also the barrier: every rank stops here on a TakenOver
        if taken_over[0]:
            raise TakenOver(taken_over[0])

    def fit_start(self, state: State, logger: Logger) -> None:
        if self.preemption is not None and self.preemption.catch_up("export", int(state.timestamp.batch)):
            self.export(state)  # the preempted launch skipped it; the checkpoint brought back that step's weights

    def batch_end(self, state: State, logger: Logger) -> None:
        step = int(state.timestamp.batch)
        if self.due(step) and not (self.preemption is not None and self.preemption.skips("export", step)):
            self.export(state)

    def fit_end(self, state: State, logger: Logger) -> None:
        # the end of training, not a preemption (a preempted run's relaunch exports when it really ends)
        preempted = self.preemption is not None and self.preemption.preempted_at is not None
        if (
            int(state.timestamp.batch) != self.last_step
            and int(state.timestamp.batch) >= self.max_steps
            and not preempted
        ):
            self.export(state)
