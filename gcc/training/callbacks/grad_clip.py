"""Global gradient-norm clipping that also reports the norm (Composer's GradientClipping discards it)."""

from __future__ import annotations

import math

from composer.core import Callback, State
from composer.loggers import Logger

from gcc.model.fsdp import clip_grad_norm


class GradClip(Callback):
    def __init__(self, max_norm: float):
        self.max_norm = float(max_norm) if max_norm and max_norm > 0 else math.inf
        self.last_norm = float("nan")

    def after_train_batch(self, state: State, logger: Logger) -> None:
        # runs inside Composer's optimizer closure: after all micro-batches' backward, before the update. DDP:
        # every rank holds the same full gradients; FSDP2: each its shard, and the norm is reduced over them
        self.last_norm = clip_grad_norm(state.model.parameters(), self.max_norm)
