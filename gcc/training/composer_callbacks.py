"""Composer's own callbacks the yaml may name (`callbacks:`), built from Composer's classes (docs/training.md,
"Callbacks"):

    callbacks:
      speed_monitor: {window_size: 10}   # SpeedMonitor: throughput/*, MFU on a GPU whose peak Composer knows, time/*
      memory_monitor: {}                 # MemoryMonitor: memory/* (CUDA's allocator statistics)
      lr_monitor: {}                     # LRMonitor: lr-AdamW/group0 (the DiT), group1 (the condition path)

Each entry's options are its class's keyword arguments, checked before any work (`check_callback_options`: an
unknown name, an argument the class does not take or a value of the wrong type or range is a config error naming
its key). They log through Composer's logger: TensorBoard, W&B and MLflow get their scalars; `train_log.csv` keeps
its pinned columns. Their table entries are in gcc/training/callbacks/__init__.py `CALLBACKS`.
"""

from __future__ import annotations

import inspect
import logging
import types
import typing
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from composer.callbacks import LRMonitor, MemoryMonitor, SpeedMonitor
from composer.core import Callback

from gcc.inputs import shown
from gcc.training.config import STEPS, Range

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


def _arguments(cls: type) -> dict[str, Any]:
    """A class's keyword arguments and their types."""
    hints = typing.get_type_hints(cls.__init__)  # type: ignore[misc]  # the class's own __init__
    return {p: hints.get(p, Any) for p in inspect.signature(cls).parameters}


def _fits(value: Any, hint: Any) -> Any:
    """`value` as an argument of type `hint` (a number written "1e15" read as a number), or TypeError."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        for option in typing.get_args(hint):
            try:
                return _fits(value, option)
            except TypeError:
                pass
    elif hint is type(None):
        if value is None:
            return None
    elif hint in (int, float):
        if isinstance(value, str) and hint is float:  # yaml reads 1e15 (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and (hint is float or isinstance(value, int))
        ):
            return value
    elif typing.get_origin(hint) is dict:
        key_type, value_type = typing.get_args(hint)
        if isinstance(value, dict):
            return {_fits(k, key_type): _fits(v, value_type) for k, v in value.items()}
    elif hint is Any or isinstance(value, hint):
        return value
    raise TypeError(f"expected {_named(hint)}, got {shown(repr(value))}")


def _named(hint: Any) -> str:
    """A type as a message says it: "float or int or None", "dict[str, str]"."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_named(option) for option in typing.get_args(hint))
    if typing.get_origin(hint) is dict:
        return f"dict[{', '.join(_named(t) for t in typing.get_args(hint))}]"
    return "None" if hint is type(None) else getattr(hint, "__name__", str(hint))


def callback_problems(name: str, options: Any) -> tuple[list[str], dict[str, Any]]:
    """The problems of one entry of `callbacks:` (each naming its key) and its arguments as the class takes them."""
    key = f"callbacks.{shown(name, 60)}"
    if name not in COMPOSER_CALLBACKS:
        return [f"{key}: unknown callback; choose from {', '.join(COMPOSER_CALLBACKS)}"], {}
    if options is not None and not isinstance(options, dict):
        return [f"{key}: expected a mapping of arguments (or {{}}), got {shown(repr(options))}"], {}
    entry = COMPOSER_CALLBACKS[name]
    arguments = _arguments(entry.composer_class)
    problems, kwargs = [], {}
    for arg, value in (options or {}).items():
        if arg not in arguments:
            takes = ", ".join(arguments) or "no arguments"
            problems.append(
                f"{key}.{shown(arg, 60)}: not an argument of Composer's {entry.composer_class.__name__} ({takes})"
            )
            continue
        try:
            kwargs[arg] = _fits(value, arguments[arg])
        except TypeError as e:
            problems.append(f"{key}.{arg}: {e}")
            continue
        bounds = entry.bounds.get(arg)
        problem = bounds.problem(kwargs[arg]) if bounds is not None and kwargs[arg] is not None else None
        if problem:
            problems.append(f"{key}.{arg}: {problem}")
    if not problems:
        try:  # the class's own checks (SpeedMonitor's time_unit)
            entry.composer_class(**kwargs)
        except (TypeError, ValueError) as e:
            problems.append(f"{key}: {e}")
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
    warnings.filterwarnings("ignore", f"{entry.composer_class.__qualname__} is not in the state_dict", UserWarning)
    return entry.composer_class(**callback_problems(name, callbacks[name])[1])
