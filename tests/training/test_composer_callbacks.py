"""`callbacks:` in yaml: Composer's SpeedMonitor, MemoryMonitor and LRMonitor by name, their arguments checked where
the config is read (a config error naming the key, exit 2: tests/tools/test_bad_input.py) and passed to Composer's
class (gcc/training/composer_callbacks.py; docs/training.md, "Callbacks"). The table's walk through every event is in
tests/training/callbacks/test_every_callback.py, a launch's scalars in tests/training/test_train_e2e.py."""

from __future__ import annotations

import logging
from logging.handlers import BufferingHandler
from pathlib import Path

import pytest
import torch
from composer.callbacks import LRMonitor, MemoryMonitor, SpeedMonitor

from gcc.training.composer_callbacks import build_composer_callback
from gcc.training.config import ConfigError, load_config

TINY = Path(__file__).resolve().parents[2] / "yamls" / "tiny_cpu.yaml"


def built(*overrides: str) -> dict:
    """Each of Composer's callbacks the config names, as the run's table builds it."""
    callbacks = load_config(TINY, list(overrides)).callbacks
    return {
        name: build_composer_callback(callbacks, name) for name in ("speed_monitor", "memory_monitor", "lr_monitor")
    }


def test_none_by_default():
    assert load_config(TINY, []).callbacks == {}
    assert built() == {"speed_monitor": None, "memory_monitor": None, "lr_monitor": None}


def test_each_is_composers_class_with_the_yamls_arguments():
    got = built(
        "callbacks={speed_monitor: {window_size: 7, gpu_flops_available: 989e12, time_unit: seconds}, lr_monitor: }"
    )
    speed = got["speed_monitor"]
    assert isinstance(speed, SpeedMonitor) and isinstance(got["lr_monitor"], LRMonitor)
    # the window (its history holds window_size + 1 timestamps), the peak (yaml reads 989e12 as a string) and the unit
    assert (speed.history_wct.maxlen, speed.gpu_flops_available, speed.divider) == (8, 989e12, 1)
    assert got["memory_monitor"] is None  # not named


def test_the_memory_monitor_is_off_with_one_line_on_a_run_without_a_gpu(monkeypatch):
    keys = (
        "callbacks.memory_monitor={memory_keys: {allocated_bytes.all.peak: peak_gb}, dist_aggregate_batch_interval: 5}"
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    memory = built(keys)["memory_monitor"]
    assert isinstance(memory, MemoryMonitor)
    assert (memory.memory_keys, memory.dist_aggregate_batch_interval) == ({"allocated_bytes.all.peak": "peak_gb"}, 5)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    log, lines = logging.getLogger("gcc.training.composer_callbacks"), BufferingHandler(10)
    level = log.level
    log.addHandler(lines)
    log.setLevel(logging.INFO)  # whatever the process's logging set-up
    try:
        assert built(keys)["memory_monitor"] is None
    finally:
        log.removeHandler(lines)
        log.setLevel(level)
    assert [r.getMessage() for r in lines.buffer] == [
        "callbacks.memory_monitor: off, this run has no GPU (MemoryMonitor reads CUDA's memory)"
    ]


@pytest.mark.parametrize(
    "override, match",
    [
        ("callbacks={speed_monitr: {}}", "^callbacks.speed_monitr: unknown callback; choose from speed_monitor, "),
        ("callbacks.speed_monitor.window=3", r"^callbacks.speed_monitor.window: not an argument of Composer's Speed"),
        ("callbacks.lr_monitor={window_size: 3}", r"^callbacks.lr_monitor.window_size: not an argument .*no arguments"),
        ("callbacks.memory_monitor=[]", r"^callbacks.memory_monitor: expected a mapping of arguments"),
        ("callbacks.speed_monitor.window_size=abc", r"^callbacks.speed_monitor.window_size: expected int, got 'abc'"),
        ("callbacks.speed_monitor.window_size=true", r"^callbacks.speed_monitor.window_size: expected int, got True"),
        ("callbacks.speed_monitor.window_size=0", r"^callbacks.speed_monitor.window_size: must be >= 1"),
        ("callbacks.speed_monitor.gpu_flops_available=0", r"^callbacks.speed_monitor.gpu_flops_available: must be > 0"),
        # inf passes every range check (MFU would then log 0): refused as the config's own floats are
        ("callbacks.speed_monitor.gpu_flops_available=.inf", r"gpu_flops_available: expected a finite number or None"),
        ("callbacks.speed_monitor.time_unit=weeks", r"^callbacks.speed_monitor: Invalid time_unit: weeks"),
        (
            "callbacks.memory_monitor.memory_keys=[a]",
            r"^callbacks.memory_monitor.memory_keys: expected dict\[str, str\]",
        ),
        ("callbacks.memory_monitor.dist_aggregate_batch_interval=0", r"dist_aggregate_batch_interval: must be >= 1"),
    ],
)
def test_a_bad_entry_is_a_config_error_naming_its_key(override, match):
    with pytest.raises(ConfigError, match=match):
        load_config(TINY, [override])


def test_one_checker_reads_each_option_as_its_type_hint_says():
    """gcc/training/composer_options.py serves `callbacks:` and `loggers:` alike: unions, None, numbers from yaml
    strings, finite floats only, bool never an int, lists and dicts item by item."""
    from typing import Any

    from gcc.training.composer_options import fits, named

    assert fits("1e15", float | None) == 1e15 and fits(None, float | None) is None and fits(3, float) == 3
    assert fits(["a"], list[str] | None) == ["a"] and fits({"k": 1}, dict[str, Any]) == {"k": 1}
    refused = [
        (True, int, "expected int, got True"),
        (float("inf"), float, "expected a finite number, got inf"),
        ("nan", float, "expected a finite number, got nan"),
        ([1], list[str], "expected str, got 1"),  # the item that does not fit
        ({1: "v"}, dict[str, str], "expected str, got 1"),
        ("x", list[str] | None, r"expected list\[str\] or None, got 'x'"),
    ]
    for value, hint, message in refused:
        with pytest.raises(TypeError, match=f"^{message}$"):
            fits(value, hint)
    assert named(float | int | None) == "a finite number or None"
