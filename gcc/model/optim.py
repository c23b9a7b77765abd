"""Optimizer and LR schedule (docs/design.md §7): AdamW with [DiT at lr, gc_sem_cond at cond_lr], linear warmup on both.

The warmup is a torch `LambdaLR` driven by its own step counter, not a Composer scheduler: Composer compiles
its schedulers to a LambdaLR evaluated on `state.timestamp` *before* the batch counter advances, so the value for
step s would come from the timestamp of step s-2 (and s=1 and s=2 share one). LambdaLR's `last_epoch` is exactly
the number of optimizer steps taken (it is stepped once per batch and saved/restored in Composer checkpoints), so
step s uses lr · min(1, s / warmup). Pass it to the Trainer with `step_schedulers_every_batch=True`.
"""

from __future__ import annotations

import torch
from torch.optim.lr_scheduler import LambdaLR

from gcc.model.dit import COND_PREFIX

BETAS = (0.9, 0.999)


def param_groups(model: torch.nn.Module, lr: float, cond_lr: float, weight_decay: float = 0.01) -> list[dict]:
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


def build_optimizer(model: torch.nn.Module, lr: float, cond_lr: float, weight_decay: float = 0.01) -> torch.optim.AdamW:
    return torch.optim.AdamW(
        param_groups(model, lr, cond_lr, weight_decay), lr=lr, betas=BETAS, weight_decay=weight_decay
    )


def warmup_factor(step: int, warmup: int) -> float:
    """The multiplier at optimizer step `step` (1-based)."""
    return 1.0 if warmup <= 0 else min(1.0, step / warmup)


def warmup_scheduler(optimizer: torch.optim.Optimizer, warmup: int) -> LambdaLR:
    # LambdaLR calls the lambda with the number of steps already taken (0 before the first step)
    return LambdaLR(optimizer, lambda done: warmup_factor(done + 1, warmup))


def trainer_schedule_kwargs(optimizer: torch.optim.Optimizer, warmup: int) -> dict:
    """Trainer kwargs for the warmup. Composer steps a torch scheduler once per *epoch* unless told otherwise,
    which would silently freeze the warmup; keep the scheduler and the flag together."""
    return {"schedulers": warmup_scheduler(optimizer, warmup), "step_schedulers_every_batch": True}
