"""Optimizer and LR schedule (docs/design.md §7; the yaml's `optimizer:` and `scheduler:`): AdamW with [DiT at lr,
gc_sem_cond at cond_lr], and one of Composer's schedulers by name, the same multiplier on both groups.

The schedule is a torch `LambdaLR` driven by its own step counter, whose multiplier is Composer's scheduler asked
at the step being taken. Composer itself compiles a scheduler to a LambdaLR evaluated on `state.timestamp` *before*
the batch counter advances, so the value for step s would come from the timestamp of step s-2 (s=1 and s=2 share
one, and the first step of a warmup would run at rate 0). LambdaLR's `last_epoch` is exactly the number of
optimizer steps taken (it is stepped once per batch and saved/restored in Composer checkpoints), so step s
(1-based) runs at lr · Composer's multiplier at batch s: with `constant_with_warmup`, lr · min(1, s / t_warmup),
the schedule gcc has always had. Pass it to the Trainer with `step_schedulers_every_batch=True`.
"""

from __future__ import annotations

import types
import warnings

import torch
from composer.core import Time, Timestamp
from composer.optim import (
    ComposerScheduler,
    ConstantWithWarmupScheduler,
    CosineAnnealingWithWarmupScheduler,
    LinearWithWarmupScheduler,
)
from torch.optim.lr_scheduler import LambdaLR

from gcc.model.dit import COND_PREFIX

BETAS = (0.9, 0.999)
EPS = 1e-8  # torch's AdamW default


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


def build_optimizer(
    model: torch.nn.Module,
    lr: float,
    cond_lr: float,
    weight_decay: float = 0.01,
    betas: tuple[float, float] = BETAS,
    eps: float = EPS,
) -> torch.optim.AdamW:
    return torch.optim.AdamW(
        param_groups(model, lr, cond_lr, weight_decay), lr=lr, betas=betas, eps=eps, weight_decay=weight_decay
    )


def composer_scheduler(name: str, t_warmup: int, alpha_f: float = 0.0) -> ComposerScheduler:
    """Composer's scheduler of that name (the yaml's `scheduler.name`), warming up over `t_warmup` batches and
    running to max_duration (its `t_max`, "1dur")."""
    warmup = f"{t_warmup}ba"
    if name == "constant_with_warmup":
        return ConstantWithWarmupScheduler(t_warmup=warmup)
    if name == "cosine_with_warmup":
        return CosineAnnealingWithWarmupScheduler(t_warmup=warmup, alpha_f=alpha_f)
    if name == "linear_decay_with_warmup":
        return LinearWithWarmupScheduler(t_warmup=warmup, alpha_f=alpha_f)
    raise ValueError(f"scheduler.name: unknown scheduler {name!r}")


def step_scheduler(optimizer: torch.optim.Optimizer, scheduler: ComposerScheduler, max_steps: int) -> LambdaLR:
    """A LambdaLR giving optimizer step s (1-based) Composer's `scheduler` at batch s of a `max_steps`-batch run
    (the module's docstring says why not Composer's own stepping)."""
    max_duration = Time.from_timestring(f"{max_steps}ba")
    # Composer warns at every call that a warmup of 0 may be a fraction of the duration; gcc's is a batch count
    warnings.filterwarnings("ignore", message="The warmup duration is 0", category=UserWarning)

    def multiplier(done: int) -> float:  # LambdaLR passes the number of steps already taken
        return lr_factor(scheduler, done + 1, max_duration)

    return LambdaLR(optimizer, multiplier)


def lr_factor(scheduler: ComposerScheduler, step: int, max_duration: Time | int) -> float:
    """The rate's multiplier at optimizer step `step` (1-based) of a run of `max_duration` batches: Composer's
    `scheduler` at batch `step`."""
    if isinstance(max_duration, int):
        max_duration = Time.from_timestring(f"{max_duration}ba")
    at = types.SimpleNamespace(timestamp=Timestamp(batch=step), max_duration=max_duration, dataloader_len=None)
    return float(scheduler(at))  # the parts of State a scheduler counting batches reads


def trainer_schedule_kwargs(optimizer: torch.optim.Optimizer, scheduler: ComposerScheduler, max_steps: int) -> dict:
    """Trainer kwargs for the schedule. Composer steps a torch scheduler once per *epoch* unless told otherwise,
    which would silently freeze it; keep the scheduler and the flag together."""
    return {"schedulers": step_scheduler(optimizer, scheduler, max_steps), "step_schedulers_every_batch": True}
