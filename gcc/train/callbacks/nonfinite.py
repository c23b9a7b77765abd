"""Stop every rank on a NaN/inf loss before the optimizer applies it (docs/design.md §9.7).

The check runs at AFTER_TRAIN_BATCH, inside Composer's optimizer closure, so raising there leaves the weights,
the optimizer and every checkpoint as they were after the last good step.
"""
from __future__ import annotations

import torch
from composer.core import Callback, State
from composer.loggers import Logger
from composer.utils import dist


class NonFiniteLoss(RuntimeError):
    pass


class NonFiniteGuard(Callback):
    def __init__(self, inject_step: int = 0, inject_rank: int = 0):
        self.inject_step, self.inject_rank = inject_step, inject_rank
        self._finite = True
        self._clips: list[str] = []

    def batch_start(self, state: State, logger: Logger) -> None:
        self._finite, self._clips = True, []

    def after_loss(self, state: State, logger: Logger) -> None:
        step = int(state.timestamp.batch) + 1
        if self.inject_step and step == self.inject_step and dist.get_global_rank() == self.inject_rank:
            state.loss = state.loss * float("nan")  # fault injection (tests): poisons this rank's backward
        loss = state.loss["total"] if isinstance(state.loss, dict) else state.loss
        if not bool(torch.isfinite(loss.detach()).all()):
            self._finite = False
        self._clips += list(state.batch["clip_id"])

    def after_train_batch(self, state: State, logger: Logger) -> None:
        bad = state.device.tensor_to_device(torch.tensor([0.0 if self._finite else 1.0]))
        dist.all_reduce(bad, reduce_operation="MAX")
        if float(bad.item()) > 0:
            per_rank = dist.all_gather_object((dist.get_global_rank(), self._finite, self._clips))
            bad_ranks = [f"rank {r}: clips {';'.join(c)}" for r, ok, c in per_rank if not ok]
            step = int(state.timestamp.batch) + 1
            raise NonFiniteLoss(f"non-finite loss at step {step} ({'; '.join(bad_ranks)}); training stopped "
                                f"before the update, the last checkpoint is the last good state")
