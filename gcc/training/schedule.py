"""The learning-rate schedule (docs/design.md §7; the yaml's `scheduler:`): one of Composer's schedulers by name,
the same multiplier on both of the optimizer's groups (gcc/model/optim.py).

The schedule is a torch `LambdaLR` driven by its own step counter, whose multiplier is Composer's scheduler asked
at the step being taken. Composer itself compiles a scheduler to a LambdaLR evaluated on `state.timestamp` *before*
the batch counter advances, so the value for step s would come from the timestamp of step s-2 (s=1 and s=2 share
one, and the first step of a warmup would run at rate 0). LambdaLR's `last_epoch` is exactly the number of
optimizer steps taken (it is stepped once per batch and saved/restored in Composer checkpoints), so step s
(1-based) runs at lr · Composer's multiplier at batch s: with `constant_with_warmup`, lr · min(1, s / t_warmup),
the schedule gcc has always had. Pass it to the Trainer with `step_schedulers_every_batch=True`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from composer.core import Time
from composer.optim import (
    ComposerScheduler,
    ConstantWithWarmupScheduler,
    CosineAnnealingWithWarmupScheduler,
    LinearWithWarmupScheduler,
)
from torch.optim.lr_scheduler import LambdaLR

from gcc.compat.composer import ZERO_WARMUP, ignore_warning, scheduler_at
from gcc.training.sections import SchedulerConfig

# Composer's scheduler of each `scheduler.name` (gcc/training/sections.py `SchedulerName`: its choices, which a
# test holds equal to these), from the warmup (a Composer time) and alpha_f
SCHEDULERS: dict[str, Callable[[str, float], ComposerScheduler]] = {
    "constant_with_warmup": lambda warmup, alpha_f: ConstantWithWarmupScheduler(t_warmup=warmup),
    "cosine_with_warmup": lambda warmup, alpha_f: CosineAnnealingWithWarmupScheduler(t_warmup=warmup, alpha_f=alpha_f),
    "linear_decay_with_warmup": lambda warmup, alpha_f: LinearWithWarmupScheduler(t_warmup=warmup, alpha_f=alpha_f),
}


def composer_scheduler(config: SchedulerConfig) -> ComposerScheduler:
    """Composer's scheduler as the `scheduler:` section says: the one of its name, warming up over `t_warmup`
    batches and running to max_duration (its `t_max`, "1dur")."""
    if config.name not in SCHEDULERS:
        raise ValueError(f"scheduler.name: unknown scheduler {config.name!r}")
    return SCHEDULERS[config.name](f"{config.t_warmup}ba", config.alpha_f)


def step_scheduler(optimizer: torch.optim.Optimizer, scheduler: ComposerScheduler, max_steps: int) -> LambdaLR:
    """A LambdaLR giving optimizer step s (1-based) Composer's `scheduler` at batch s of a `max_steps`-batch run
    (the module's docstring says why not Composer's own stepping)."""
    max_duration = Time.from_timestring(f"{max_steps}ba")
    ignore_warning(ZERO_WARMUP)  # Composer's warning that a warmup of 0 may be a fraction of the duration

    def multiplier(done: int) -> float:  # LambdaLR passes the number of steps already taken
        return lr_factor(scheduler, done + 1, max_duration)

    return LambdaLR(optimizer, multiplier)


def lr_factor(scheduler: ComposerScheduler, step: int, max_duration: Time | int) -> float:
    """The rate's multiplier at optimizer step `step` (1-based) of a run of `max_duration` batches: Composer's
    `scheduler` at batch `step` (also what a changed horizon would do to a resumed run: gcc/training/run_start.py)."""
    if isinstance(max_duration, int):
        max_duration = Time.from_timestring(f"{max_duration}ba")
    return scheduler_at(scheduler, step, max_duration)


def trainer_schedule_kwargs(optimizer: torch.optim.Optimizer, scheduler: ComposerScheduler, max_steps: int) -> dict:
    """Trainer kwargs for the schedule. Composer steps a torch scheduler once per *epoch* unless told otherwise,
    which would silently freeze it; keep the scheduler and the flag together."""
    return {"schedulers": step_scheduler(optimizer, scheduler, max_steps), "step_schedulers_every_batch": True}
