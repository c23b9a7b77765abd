"""The yaml's key names (gcc/training/config.py; docs/training.md, "Config keys"): Composer's and llm-foundry's
(`max_duration`, `eval_interval`, `save_interval`, `optimizer:`, `scheduler:`, `algorithms:` ...), the old names read
as the new ones with one warning each (`RENAMED`), Composer time strings where a key counts batches or epochs, and
`train.py --print_config`."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest
import yaml as pyyaml

from gcc import exit_codes
from gcc.training import entry
from gcc.training.config import (
    RENAMED,
    ROLES,
    ConfigError,
    TrainConfig,
    load_config,
    resolve_duration,
)
from gcc.training.print_config import TEST_ONLY
from gcc.yaml_reader import read_yaml

ROOT = Path(__file__).resolve().parents[2]
YAMLS = sorted((ROOT / "yamls").glob("*.yaml"))


def _move(tree: dict, src: str, dst: str) -> None:
    """`src`'s value in `tree` moved to `dst` (dotted keys), where `tree` has it."""
    *path, leaf = src.split(".")
    node = tree
    for p in path:
        node = node.get(p, {})
    if leaf not in node:
        return
    value = node.pop(leaf)
    *path, leaf = dst.split(".")
    node = tree
    for p in path:
        node = node.setdefault(p, {})
    node[leaf] = value


def _warned(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "gcc.training.config" and r.levelno == logging.WARNING]


@pytest.mark.parametrize("path", YAMLS, ids=[p.name for p in YAMLS])
def test_a_yaml_with_the_old_names_is_the_same_config_with_one_warning_per_old_key(path, tmp_path, caplog):
    """Each shipped yaml written back with the old names (as every yaml was before) loads to the same config; each
    old key is named once, with its new name."""
    tree = read_yaml(path)
    flat = pyyaml.safe_dump(tree)
    for old, new in RENAMED.items():
        _move(tree, new, old)
    old_yaml = tmp_path / path.name
    old_yaml.write_text(pyyaml.safe_dump(tree))
    assert pyyaml.safe_dump(tree) != flat  # the shipped yaml uses the new names
    with caplog.at_level(logging.WARNING, logger="gcc"):
        old_cfg = load_config(old_yaml, ["loggers={}"])
    assert dataclasses.asdict(old_cfg) == dataclasses.asdict(load_config(path, ["loggers={}"]))
    warned = _warned(caplog)
    assert len(warned) == len(set(warned)) >= 5  # once each: sft_v10 has 14, tiny_cpu 10, mini 8
    for message in warned:
        old = message.split(":")[0]
        assert message == f'{old}: an old key name, read as {RENAMED[old]}; rename it (docs/training.md, "Config keys")'


def test_an_old_key_warns_once_per_launch_even_given_twice(tmp_path, caplog):
    old_yaml = tmp_path / "old.yaml"
    old_yaml.write_text("max_steps: 30\noptim:\n  lr: 0.002\n")
    with caplog.at_level(logging.WARNING, logger="gcc"):
        cfg = load_config(old_yaml, ["max_steps=40", "loggers={}"])
    assert cfg.max_steps == 40 and cfg.optimizer.lr == 0.002  # the override, by either name, wins over the yaml
    assert _warned(caplog) == [
        'max_steps: an old key name, read as max_duration; rename it (docs/training.md, "Config keys")',
        'optim.lr: an old key name, read as optimizer.lr; rename it (docs/training.md, "Config keys")',
    ]


def test_the_new_names_warn_nothing(caplog):
    with caplog.at_level(logging.WARNING, logger="gcc"):
        load_config(ROOT / "yamls" / "sft_v10.yaml", ["max_duration=5", "optimizer.lr=1e-4"])
    assert _warned(caplog) == []


def test_an_override_by_the_new_name_replaces_the_yamls_old_key(tmp_path):
    old_yaml = tmp_path / "old.yaml"
    old_yaml.write_text("val_every: 7\noptim:\n  warmup_steps: 3\n  grad_clip: 0.5\n")
    cfg = load_config(old_yaml, ["eval_interval=9ba", "scheduler.t_warmup=4", "loggers={}"])
    assert (cfg.eval_interval, cfg.scheduler.t_warmup) == (9, 4)
    assert cfg.scheduler.name == "constant_with_warmup"  # optim.warmup_steps: the schedule it always gave
    assert cfg.algorithms.gradient_clipping.clipping_threshold == 0.5


def test_the_old_optim_section_given_whole_on_the_command_line():
    cfg = load_config(None, ["optim={lr: 0.003, warmup_steps: 7}", "loggers={}"])
    assert (cfg.optimizer.lr, cfg.scheduler.t_warmup) == (0.003, 7)


@pytest.mark.parametrize(
    "text, overrides, message",
    [
        ("max_steps: 3\nmax_duration: 4\n", [], "max_steps and max_duration are both given"),
        ("optim:\n  lr: 0.1\noptimizer:\n  lr: 0.2\n", [], "optim.lr and optimizer.lr are both given"),
        ("", ["global_batch=4", "global_train_batch_size=4"], "global_batch and global_train_batch_size are both"),
        ("", ["eval_interval=4", "val_every=4"], "val_every and eval_interval are both given"),
        ("", ["optim.bogus=1"], r"unknown key\(s\): optim.bogus \(the keys of optim: are now optimizer.lr, "),
    ],
)
def test_an_old_key_and_its_new_one_together_are_refused_naming_both(tmp_path, text, overrides, message):
    path = tmp_path / "both.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as e:
        load_config(path, overrides)
    if "both given" in message:
        new = message.split(" and ")[1].split(" ")[0]
        assert str(e.value).endswith(f"keep {new}")


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["max_duration=20000ba", "eval_interval=500ba", "save_interval=1000ba"], (20000, 500, 1000)),
        (["max_duration=20000", "eval_interval=500", "save_interval=1000"], (20000, 500, 1000)),
        (["max_duration=3ep", "eval_interval=0", "save_interval= 7ba"], ("3ep", 0, 7)),
    ],
)
def test_composer_time_strings_count_batches_and_epochs_are_kept_until_the_launch(overrides, expected):
    cfg = load_config(None, [*overrides, "loggers={}"])
    assert (cfg.max_duration, cfg.eval_interval, cfg.save_interval) == expected


def test_an_epoch_duration_is_resolved_to_batches_at_launch():
    """`max_duration: 3ep` is 3 × the batches of an epoch (builders.steps_per_epoch at the launch's global batch);
    the code counts `max_steps`, which refuses to guess before that."""
    cfg = load_config(None, ["max_duration=3ep", "loggers={}"])
    with pytest.raises(RuntimeError, match="max_duration '3ep' is not resolved to batches"):
        _ = cfg.max_steps
    resolve_duration(cfg, steps_per_epoch=12)
    assert cfg.max_duration == 36 and cfg.max_steps == 36
    resolve_duration(cfg, steps_per_epoch=5)  # batches already: as it is
    assert cfg.max_steps == 36


def test_print_config_lists_every_key_with_its_type_default_and_meaning(capsys):
    assert entry.main(["--print-config"]) == exit_codes.OK
    out = capsys.readouterr().out.splitlines()
    heads = [line for line in out if line and not line.startswith(" ")]
    shown = [k for k in ROLES if not k.startswith("faults.")]  # the test-only keys: --all
    keys = [line.split(":")[0] for line in heads[: len(shown)]]
    assert keys == shown  # every key a run may set, dotted, in the declarations' order
    meanings = {line.split(":")[0]: out[out.index(line) + 1].strip() for line in heads[: len(shown)]}
    assert all(meanings.values()), [k for k, v in meanings.items() if not v]  # each has its meaning
    assert 'max_duration: 20000  [batches (N or "Nba") | epochs ("Nep")]' in out
    assert (
        'scheduler.name: "constant_with_warmup"  [constant_with_warmup | cosine_with_warmup | linear_decay_with_warmup]'
        in out
    )
    assert "data.limit: null  [int | null]" in out
    assert meanings["optimizer.cond_lr"].startswith("learning rate of the gc_sem_cond parameters")
    assert "  optim.warmup_steps -> scheduler.t_warmup" in out  # the old names, after the keys


def test_print_config_with_a_yaml_shows_its_resolved_values(capsys, tmp_path):
    old_yaml = tmp_path / "old.yaml"
    old_yaml.write_text("max_steps: 30\nloggers: {wandb: {init_kwargs: {api_key: sekrit}}}\n")
    assert entry.main(["--print-config", str(old_yaml), "scheduler.t_warmup=7ba"]) == exit_codes.OK
    out = capsys.readouterr().out.splitlines()
    assert 'max_duration: 30  (default 20000)  [batches (N or "Nba") | epochs ("Nep")]' in out
    assert any(line.startswith("scheduler.t_warmup: 7  (default 500)") for line in out)
    assert "sekrit" not in "\n".join(out)  # a credential is masked, as in every file gcc writes


def test_print_config_of_a_bad_config_is_a_config_error(capsys):
    assert entry.main(["--print-config", "--", str(ROOT / "yamls" / "tiny_cpu.yaml"), "max_duration=2tok"]) == 2


def test_the_config_dataclasses_default_to_sft_v10():
    assert TrainConfig().max_steps == 20000 and TrainConfig().scheduler.t_warmup == 500


def test_print_config_shows_the_test_only_keys_only_when_asked(capsys):
    assert entry.main(["--print_config"]) == exit_codes.OK
    out = capsys.readouterr().out
    assert f"\n{TEST_ONLY}" not in out and "--print_config --all shows them" in out
    assert entry.main(["--print_config", "--all"]) == exit_codes.OK
    out = capsys.readouterr().out
    assert all(f"\n{k}: " in out for k in ROLES if k.startswith("faults.")) and "--all shows them" not in out


@pytest.mark.parametrize(
    "override, said",
    [
        ("optimizer.learning_rate=1e-4", "optimizer.learning_rate (did you mean optimizer.lr?)"),
        ("max_duraton=20", "max_duraton (did you mean max_duration?)"),
        ("lr=1e-4", "lr (did you mean optimizer.lr?)"),  # the right word in another section
        ("max_step=20", "max_step (did you mean max_duration (max_steps is its old name)?)"),
        ("data.num_worker=2", "data.num_worker (did you mean data.num_workers?)"),
        ("batch_size=4", "batch_size (did you mean global_train_batch_size or device_train_microbatch_size?)"),
        ("nonsense=1", "nonsense"),
    ],
)
def test_an_unknown_key_is_answered_with_the_closest_known_ones(override, said):
    with pytest.raises(ConfigError) as e:
        load_config(ROOT / "yamls" / "tiny_cpu.yaml", [override])
    assert str(e.value).startswith(f"unknown key(s): {said}") and (said != "nonsense" or "did you" not in str(e.value))


@pytest.mark.parametrize("given, expected", [("true", "block"), ("false", "none")])
def test_grad_ckpt_is_read_as_activation_checkpointing_with_its_values(given, expected, tmp_path, caplog):
    """model.grad_ckpt (a bool) became model.activation_checkpointing (block | selective | none): true is block,
    false none, from the yaml and from the command line."""
    old_yaml = tmp_path / "old.yaml"
    old_yaml.write_text(f"model:\n  grad_ckpt: {given}\n")
    with caplog.at_level(logging.WARNING, logger="gcc"):
        assert load_config(old_yaml, ["loggers={}"]).model.activation_checkpointing == expected
        assert load_config(None, [f"model.grad_ckpt={given}", "loggers={}"]).model.activation_checkpointing == expected
    assert _warned(caplog)[0].startswith("model.grad_ckpt: an old key name, read as model.activation_checkpointing")
    with pytest.raises(ConfigError, match="model.activation_checkpointing: expected str, got int 3"):
        load_config(None, ["model.grad_ckpt=3", "loggers={}"])
