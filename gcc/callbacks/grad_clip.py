"""Global gradient-norm clipping that also reports the norm (Composer's GradientClipping discards it)."""
from __future__ import annotations

import math

import torch
from composer.core import Callback, State
from composer.loggers import Logger
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


class GradClip(Callback):
    def __init__(self, max_norm: float):
        self.max_norm = float(max_norm) if max_norm and max_norm > 0 else math.inf
        self.last_norm = float("nan")

    def after_train_batch(self, state: State, logger: Logger) -> None:
        # runs inside Composer's optimizer closure: after all micro-batches' backward, before the update
        roots = [m for m in state.model.modules() if isinstance(m, FSDP) and m.check_is_root()]
        if roots:  # FSDP: the root unit reduces the norm over every rank's shard
            norm = roots[0].clip_grad_norm_(self.max_norm)
        else:  # DDP/single: gradients are already identical on every rank
            params = [p for p in state.model.parameters() if p.grad is not None]
            norm = torch.nn.utils.clip_grad_norm_(params, self.max_norm)
        self.last_norm = float(norm)
