"""Composer's own callbacks the yaml may name (`callbacks:`), built from Composer's classes (docs/training.md,
"Callbacks"):

    callbacks:
      speed_monitor: {window_size: 10}   # SpeedMonitor: throughput/*, MFU on a GPU whose peak Composer knows, time/*
      memory_monitor: {}                 # MemoryMonitor: memory/* (CUDA's allocator statistics)
      lr_monitor: {}                     # LRMonitor: lr-AdamW/group0 (the DiT), group1 (the condition path)

Each entry's options are its class's keyword arguments, checked before any work (`check_callback_options`, by
gcc/training/composer_options.py as the loggers' are: an unknown name, an argument the class does not take or a value
of the wrong type or range is a config error naming its key). They log through Composer's logger: TensorBoard, W&B and MLflow get their scalars; `train_log.csv` keeps
its pinned columns. Their table entries are in gcc/training/callbacks/__init__.py `CALLBACKS`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch
from composer.callbacks import LRMonitor, MemoryMonitor, SpeedMonitor
from composer.core import Callback

from gcc.compat.composer import NOT_IN_STATE, ignore_warning
from gcc.settings import STEPS, Range
from gcc.training.composer_options import option_problems

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ComposerCallback:
    composer_class: type[Callback]
    # the range of each numeric argument where Composer's own takes values that fail later, in the run (a
    # window_size of 0 divides by zero at the first step)
    bounds: dict[str, Range] = field(default_factory=dict)
    cuda_only: bool = False  # it reads CUDA's statistics: off (one line says so) on a run without a GPU


# every Composer callback the yaml may name, in one place
COMPOSER_CALLBACKS: dict[str, ComposerCallback] = {
    "speed_monitor": ComposerCallback(
        SpeedMonitor,
        {"window_size": Range(1, STEPS), "gpu_flops_available": Range(0, exclusive=True, said="> 0 (FLOP/s)")},
    ),
    "memory_monitor": ComposerCallback(
        MemoryMonitor, {"dist_aggregate_batch_interval": Range(1, STEPS)}, cuda_only=True
    ),
    "lr_monitor": ComposerCallback(LRMonitor),
}


def callback_problems(name: str, options: Any) -> tuple[list[str], dict[str, Any]]:
    """The problems of one entry of `callbacks:` (each naming its key) and its arguments as the class takes them."""
    problems, kwargs = option_problems("callbacks", "callback", COMPOSER_CALLBACKS, name, options)
    if not problems and name in COMPOSER_CALLBACKS:
        try:  # the class's own checks (SpeedMonitor's time_unit)
            COMPOSER_CALLBACKS[name].composer_class(**kwargs)
        except (TypeError, ValueError) as e:
            problems.append(f"callbacks.{name}: {e}")
    return problems, kwargs


def check_callback_options(callbacks: dict[str, Any]) -> list[str]:
    """Problems with the yaml's `callbacks:` section, each naming the key (empty: fine)."""
    return [problem for name, options in callbacks.items() for problem in callback_problems(name, options)[0]]


def build_composer_callback(callbacks: dict[str, Any], name: str) -> Callback | None:
    """Composer's callback `name` with the yaml's arguments (checked: `check_callback_options`), or None: not named
    in `callbacks:`, or CUDA-only on a run without a GPU (one line says so)."""
    if name not in callbacks:
        return None
    entry = COMPOSER_CALLBACKS[name]
    if entry.cuda_only and not torch.cuda.is_available():
        logger.info(f"callbacks.{name}: off, this run has no GPU ({entry.composer_class.__name__} reads CUDA's memory)")
        return None
    # named on a resume of a run that did not name it: nothing of it in the checkpoint, and Composer warns on every
    # rank; its only state is SpeedMonitor's validation time, which then counts from this launch
    ignore_warning(NOT_IN_STATE.format(entry.composer_class.__qualname__))
    return entry.composer_class(**callback_problems(name, callbacks[name])[1])
