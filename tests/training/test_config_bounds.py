"""Every config field that sizes work has a range (gcc/training/config.py: declared with the field, collected in
BOUNDS; MODEL_BOUNDS): a value beyond it is refused naming the field and the range, before anything is built
(`model.overrides.num_layers=100000000` built 10^8 blocks on the meta device: the launch hung). The yaml and the overrides are read by a bounded loader
(`gcc.yaml_reader.BoundedLoader`); its cases through the trainer's entry are in tests/tools/test_bad_input.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from gcc.model.config import MODEL_BOUNDS
from gcc.training.config import (
    BOUNDS,
    MAX_VAL_TIMESTEPS,
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


# every field that sizes work and the most it may be (docs/training.md states the ranges), pinned here rather than
# read from the code's own BOUNDS: a bound dropped or moved fails a case of this table
HIGHS = {
    "algorithms.ema.ema_start": 10**9,
    "algorithms.ema.half_life": 10**9,
    "algorithms.ema.update_interval": 10**9,
    "console_log_interval": 10**9,
    "data.cond_dropout": 1.0,
    "data.limit": 10**9,
    "data.mask_p": 1.0,
    "data.max_frame_coverage": 1.0,
    "data.num_canonical_nodes": 1 << 16,
    "data.num_workers": 256,
    "data.text_dropout": 1.0,
    "device_train_microbatch_size": 4096,
    "dist_timeout": 604800.0,
    "eval_interval": 10**9,
    "export_every": 10**9,
    "faults.hold_async_write_step": 10**9,
    "faults.native_crash_rank": 1 << 16,
    "faults.native_crash_step": 10**9,
    "faults.nonfinite_rank": 1 << 16,
    "faults.nonfinite_step": 10**9,
    "faults.sigint_at_step": 10**9,
    "faults.sigterm_at_step": 10**9,
    "faults.stall_rank": 1 << 16,
    "faults.stall_step": 10**9,
    "faults.stop_after_commit_step": 10**9,
    "global_train_batch_size": 1 << 16,
    "grad_accum": 1 << 16,
    "keep_samples": 1000000,
    "max_duration": 10**9,
    "optimizer.eps": 1.0,
    "preemption_grace_s": 86400.0,
    "sample_every": 1000000,
    "sample_n": 1000,
    "sample_steps": 1000,
    "save_interval": 10**9,
    "save_num_checkpoints_to_keep": 1000,
    "scheduler.alpha_f": 1.0,
    "scheduler.t_warmup": 10**9,
    "seed": 2**32 - 1,
    "stall_floor_s": 604800.0,
    "stall_timeout_s": 604800.0,
    "val_batch": 4096,
    "val_n": 100000,
}


def test_the_bounded_fields_are_these():
    assert sorted(k for k, b in BOUNDS.items() if b.high is not None) == sorted(HIGHS)


def _refusal(key: str, value) -> str | None:
    """What load_config says of `key=value`: its message when it is refused for `key`'s range, else None."""
    try:
        load_config(YAML, [f"{key}={value}", "loggers={}"])
    except ConfigError as e:
        return str(e) if str(e).startswith(f"{key}: must be ") else None
    return None


@pytest.mark.parametrize("key", sorted(HIGHS))
def test_a_field_that_sizes_work_is_refused_beyond_its_range(key):
    """Just past the most it may be (the next integer, or a millionth above), the field is refused naming itself and
    the range; at the most, it is not refused for its range."""
    high = HIGHS[key]
    past = high + 1 if isinstance(high, int) else high * (1 + 1e-6)
    said = _refusal(key, past)
    assert said is not None, f"{key}={past} was not refused"
    assert f"at most {_said(high)}" in said or BOUNDS[key].said in said, said
    assert _refusal(key, high) is None, f"{key}={high} was refused"


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


def _leaves(tree: dict, prefix: str = ""):
    for k, v in tree.items():
        if isinstance(v, dict) and v:
            yield from _leaves(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def test_the_shipped_values_are_inside_the_ranges():
    """The defaults and every shipped yaml load (the ranges refuse only what no run asks for), and each value the
    yaml states, read here by plain yaml, is the loaded config's (a duration "500ba" as 500 batches)."""
    load_config(None)
    yamls = sorted((ROOT / "yamls").glob("*.yaml"))
    assert {"sft_v10.yaml", "mini.yaml", "tiny_cpu.yaml"} <= {y.name for y in yamls}
    for path in yamls:
        cfg = load_config(path, ["loggers={}"])
        for key, stated in _leaves(yaml.safe_load(path.read_text())):
            if key.startswith("loggers."):  # replaced by the override
                continue
            got = cfg
            for part in key.split("."):
                got = got[part] if isinstance(got, dict) else getattr(got, part)
            if isinstance(stated, str) and re.fullmatch(r"\d+ba", stated):
                stated = int(stated[:-2])
            assert got == stated, (path.name, key, stated, got)


def test_an_override_names_the_key_path_of_what_it_refuses():
    with pytest.raises(
        ConfigError, match=r"override 'loggers=\{mlflow: \{tags: \{true: 1\}\}\}': loggers.mlflow.tags: "
    ):
        parse_override("loggers={mlflow: {tags: {true: 1}}}")
    with pytest.raises(ConfigError, match=r"optimizer.lr.0.0.….0.0.0: nested deeper than 64 levels"):
        parse_override("optimizer.lr=" + "[" * 5000 + "]" * 5000)


def test_a_temp_folder_too_long_for_the_loaders_workers_is_refused_before_the_start(monkeypatch, tmp_path):
    """A loader with workers needs the forkserver's socket in the temp folder: one too long for a socket's path
    is the launch's verdict (exit 2, naming TMPDIR); a loader without workers does not mind it."""
    import tempfile

    from gcc.compat.python import longest_temp_folder
    from gcc.errors import BadInput

    monkeypatch.setattr(tempfile, "tempdir", "/tmp/" + "t" * longest_temp_folder())
    run_dir = f"run_dir={tmp_path / 'run'}"
    with pytest.raises(BadInput, match=r"\(TMPDIR\) is \d+ bytes long: .*\(data\.num_workers: 0") as e:
        check_inputs(load_config(YAML, ["data.num_workers=2", run_dir, "loggers={}"]))
    assert e.value.exit_code == 2
    check_inputs(load_config(YAML, ["data.num_workers=0", run_dir, "loggers={}"]))
