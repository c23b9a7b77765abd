"""Every config field that sizes work has a range (gcc/training/config.py: declared with the field, collected in
BOUNDS; MODEL_BOUNDS): a value beyond it is refused naming the field and the range, before anything is built
(`model.overrides.num_layers=100000000` built 10^8 blocks on the meta device: the launch hung). The yaml and the overrides are read by a bounded loader
(`gcc.yaml_reader.BoundedLoader`); its cases through the trainer's entry are in tests/tools/test_bad_input.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gcc.training.config import (
    BOUNDS,
    MAX_VAL_TIMESTEPS,
    MODEL_BOUNDS,
    ConfigError,
    load_config,
    parse_override,
)
from gcc.training.input_checks import check_inputs

ROOT = Path(__file__).resolve().parents[2]
YAML = ROOT / "yamls" / "tiny_cpu.yaml"


def _said(x) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def _beyond(high):
    return high * 10 if isinstance(high, float) else high + 1


@pytest.mark.parametrize("key", sorted(k for k, bounds in BOUNDS.items() if bounds.high is not None))
def test_a_field_that_sizes_work_is_refused_beyond_its_range(key):
    high, said = BOUNDS[key].high, BOUNDS[key].said
    with pytest.raises(
        ConfigError, match=rf"^{key}: must be " + (re.escape(said) if said else f"at most {_said(high)}")
    ):
        load_config(YAML, [f"{key}={_beyond(high)}", "loggers={}"])


@pytest.mark.parametrize("key", sorted(set(MODEL_BOUNDS) - {"patch_size"}))
def test_a_model_override_is_refused_beyond_its_range(key):
    high = MODEL_BOUNDS[key]
    with pytest.raises(
        ConfigError, match=rf"^model.overrides.{key}: expected .*(at most {_said(high)}|, {_said(high)}\])"
    ):
        load_config(YAML, [f"model.overrides={{{key}: {_beyond(high)}}}", "loggers={}"])


def test_num_layers_of_a_hundred_million_is_refused_naming_the_range():
    with pytest.raises(ConfigError, match=r"model.overrides.num_layers: expected a positive integer, at most 256"):
        load_config(YAML, ["model.overrides={num_layers: 100000000}", "loggers={}"])


def test_overrides_each_in_range_that_multiply_into_an_unbounded_model_are_refused():
    """num_layers 256 and dim 16384 are each within their bounds; together they describe a ~6 T parameter model
    (counted on the meta device, never allocated)."""
    with pytest.raises(ConfigError, match=r"model.overrides: .* B parameters, more than gcc trains \(50 B\)"):
        check_inputs(load_config(YAML, ["model.overrides={num_layers: 256, dim: 16384, num_heads: 128}", "loggers={}"]))


def test_patch_size_items_are_bounded():
    with pytest.raises(ConfigError, match=r"model.overrides.patch_size: expected a list of 3 integers in \[1, 64\]"):
        load_config(YAML, ["model.overrides={patch_size: [1, 2, 100000]}", "loggers={}"])


def test_val_timesteps_is_a_bounded_list():
    with pytest.raises(ConfigError, match=rf"val_timesteps: must be a non-empty list of at most {MAX_VAL_TIMESTEPS}"):
        load_config(YAML, [f"val_timesteps=[{', '.join(['500'] * (MAX_VAL_TIMESTEPS + 1))}]", "loggers={}"])


def test_the_shipped_values_are_inside_the_ranges():
    """The defaults and every shipped yaml pass (the ranges refuse only what no run asks for)."""
    load_config(None)
    for yaml in sorted((ROOT / "yamls").glob("*.yaml")):
        load_config(yaml, ["loggers={}"])


def test_an_override_names_the_key_path_of_what_it_refuses():
    with pytest.raises(
        ConfigError, match=r"override 'loggers=\{mlflow: \{tags: \{true: 1\}\}\}': loggers.mlflow.tags: "
    ):
        parse_override("loggers={mlflow: {tags: {true: 1}}}")
    with pytest.raises(ConfigError, match=r"optimizer.lr.0.0.….0.0.0: nested deeper than 64 levels"):
        parse_override("optimizer.lr=" + "[" * 5000 + "]" * 5000)
