"""Global gradient-norm clipping that also reports the norm (Composer's GradientClipping discards it)."""

from __future__ import annotations

import math

import torch
from composer.core import Callback, State
from composer.utils import dist

from gcc.model.fsdp import clip_grad_norm
from gcc.training.callbacks.step_sync import StepSync


class GradClip(Callback):
    """Clips at the step's reduce (StepSync: inside Composer's optimizer closure, after all micro-batches'
    backward, before the update), and the norm before clipping rides that reduce (`grad_norm`, rank 0's; every
    rank computes the same global norm): it stays on the device until then. DDP: every rank holds the same full
    gradients; FSDP2: each its shard, and the norm is reduced over them."""

    def __init__(self, max_norm: float, sync: StepSync):
        self.max_norm = float(max_norm) if max_norm and max_norm > 0 else math.inf
        self.norm: torch.Tensor | None = None
        sync.prepare(self.clip)
        sync.source(["grad_norm"], self._reported)

    def clip(self, state: State) -> None:
        self.norm = clip_grad_norm(state.model.parameters(), self.max_norm)

    def _reported(self) -> torch.Tensor:
        norm = self.norm if self.norm is not None else torch.tensor(float("nan"))
        return norm.reshape(1) if dist.get_global_rank() == 0 else torch.zeros_like(norm).reshape(1)
