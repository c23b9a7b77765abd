"""The optimizer (docs/design.md §7; the yaml's `optimizer:`): AdamW with [DiT at lr, gc_sem_cond at cond_lr].
Its learning-rate schedule is Composer's (gcc/training/schedule.py); this module loads no Composer, so a bare PyTorch
environment builds the step (bench/gpu_step.py)."""

from __future__ import annotations

import torch

from gcc.model.config import OptimizerConfig
from gcc.model.dit import COND_PREFIX


def param_groups(model: torch.nn.Module, lr: float, cond_lr: float, weight_decay: float) -> list[dict]:
    """[all DiT parameters at lr, every `gc_sem_cond.*` parameter at cond_lr]; names work with or without the
    ComposerModel's `dit.` prefix (Composer re-maps groups by name under FSDP with use_orig_params)."""
    dit: list[torch.nn.Parameter] = []
    cond: list[torch.nn.Parameter] = []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (cond if (name.startswith(COND_PREFIX) or f".{COND_PREFIX}" in name) else dit).append(p)
    if not cond:
        raise ValueError("model has no gc_sem_cond parameters")
    return [
        {"params": dit, "lr": lr, "weight_decay": weight_decay, "name": "dit"},
        {"params": cond, "lr": cond_lr, "weight_decay": weight_decay, "name": "gc_sem_cond"},
    ]


def build_optimizer(model: torch.nn.Module, config: OptimizerConfig) -> torch.optim.AdamW:
    """AdamW as the `optimizer:` section says."""
    o = config
    return torch.optim.AdamW(
        param_groups(model, o.lr, o.cond_lr, o.weight_decay),
        lr=o.lr,
        betas=(float(o.betas[0]), float(o.betas[1])),
        eps=o.eps,
        weight_decay=o.weight_decay,
    )
