"""Stop every rank on a NaN/inf loss before the optimizer applies it (docs/design.md §9.7).

The check runs at AFTER_TRAIN_BATCH, inside Composer's optimizer closure, so raising there leaves the weights,
the optimizer and every checkpoint as they were after the last good step. The count of non-finite micro-batch
losses travels in the step's one reduction (`StepSync`, which runs first), so every rank raises at the same step.
"""

from __future__ import annotations

import torch
from composer.core import Callback, State
from composer.loggers import Logger
from composer.utils import dist

from gcc import exit_codes
from gcc.training.callbacks.step_sync import StepSync


class NonFiniteLoss(RuntimeError):
    exit_code = exit_codes.NONFINITE


class NonFiniteGuard(Callback):
    """`inject_step`, `inject_rank`: fault injection for tests (`faults.nonfinite_step`, `faults.nonfinite_rank`)."""

    def __init__(self, sync: StepSync, inject_step: int = 0, inject_rank: int = 0):
        self.sync, self.inject_step, self.inject_rank = sync, inject_step, inject_rank
        self._losses: list[torch.Tensor] = []  # this rank's micro-batch losses of the step (no sync per micro-batch)
        self._clips: list[str] = []
        sync.source(["nonfinite"], lambda: self._nonfinite().sum().reshape(1))

    def _nonfinite(self) -> torch.Tensor:
        """One entry per micro-batch loss element: 1 where it is NaN or inf."""
        if not self._losses:
            return torch.zeros(1)
        return (~torch.isfinite(torch.cat(self._losses))).double()

    def batch_start(self, state: State, logger: Logger) -> None:
        self._losses, self._clips = [], []

    def after_loss(self, state: State, logger: Logger) -> None:
        if (
            self.inject_step
            and int(state.timestamp.batch) + 1 == self.inject_step
            and dist.get_global_rank() == self.inject_rank
        ):
            state.loss = state.loss * float("nan")  # fault injection (tests): poisons this rank's backward
        loss = state.loss["total"] if isinstance(state.loss, dict) else state.loss
        self._losses.append(loss.detach().reshape(-1))
        self._clips += state.batch["clip_id"]

    def after_train_batch(self, state: State, logger: Logger) -> None:
        if self.sync.totals.get("nonfinite", 0.0) > 0:  # rare: the per-rank detail costs collectives of its own
            finite = not bool(self._nonfinite().any())
            per_rank = dist.all_gather_object((dist.get_global_rank(), finite, self._clips))
            bad_ranks = [f"rank {r}: clips {';'.join(c)}" for r, ok, c in per_rank if not ok]
            step = int(state.timestamp.batch) + 1
            raise NonFiniteLoss(
                f"non-finite loss at step {step} ({'; '.join(bad_ranks)}); training stopped "
                f"before the update, the last checkpoint is the last good state"
            )
