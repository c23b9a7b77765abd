"""Each config field declares its role next to it (gcc/training/config.py `setting`, `role`): part of the run's
identity or not, exported or not, its range, whether it is a path; its allowed values are its Literal type. The run
signature (run_start.run_signature), the export metadata (builders.export_metadata), CHOICES, BOUNDS and PATH_KEYS are
derived from these. The signature and the export metadata of a config are pinned here to what gcc wrote before the
roles were declared: a run.json recorded then must still match, or every resume would be refused (exit 3)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import typing
from dataclasses import dataclass
from pathlib import Path

import pytest

from gcc.errors import Refusal
from gcc.model import attention, block_wrap
from gcc.model.export import GC_META, META_DEFAULTS, META_KEYS, gc_metadata
from gcc.provenance import Provenance
from gcc.settings import ROLE, roles, section_of, setting
from gcc.training.builders import export_metadata
from gcc.training.config import (
    BOUNDS,
    CHOICES,
    PATH_KEYS,
    ROLES,
    ConfigError,
    TrainConfig,
    load_config,
)
from gcc.training.run_folder import check_identity
from gcc.training.run_start import RunStart, run_signature
from gcc.training.signature import diff_signatures

MANIFEST = b'{"x": 1}'


def _sections(cls: type) -> list[type]:
    """`cls` and every config dataclass under it (an optional section's too: `Section | None`)."""
    hints = typing.get_type_hints(cls)
    return [cls] + [
        s for f in dataclasses.fields(cls) if section_of(hints[f.name]) for s in _sections(section_of(hints[f.name]))
    ]


def test_every_field_of_every_config_dataclass_declares_its_role():
    sections = _sections(TrainConfig)
    assert [c.__name__ for c in sections] == [
        "TrainConfig",
        "FsdpConfig",
        "ModelConfig",
        "DataConfig",
        "OptimizerConfig",
        "SchedulerConfig",
        "AlgorithmsConfig",
        "GradientClippingConfig",
        "EmaConfig",
        "FaultsConfig",
    ]
    undeclared, values = [], 0
    for cls in sections:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if section_of(hints[f.name]):
                continue  # a section: its own fields declare
            values += 1
            role = f.metadata.get(ROLE)
            if role is None or not isinstance(role.identity, (bool, str)) or not isinstance(role.exported, (bool, str)):
                undeclared.append(f"{cls.__name__}.{f.name}")
    assert undeclared == []
    assert len(ROLES) == values


@dataclass
class _Section:
    declared: int = setting(0, identity=False, exported=False)
    forgotten: int = 0


@dataclass
class _Config:
    part: _Section = dataclasses.field(default_factory=_Section)


def test_a_field_without_a_role_is_refused_naming_it():
    with pytest.raises(TypeError, match=r"config field part.forgotten: declares no role"):
        roles(_Config)


# the pinned config's optimizer settings by their names before (old) and since the `optimizer:`, `scheduler:` and
# `algorithms:` sections (new), and their value
RENAMED_PINNED = [
    ("optim.lr", "optimizer.lr", "2e-5"),
    ("optim.cond_lr", "optimizer.cond_lr", "3e-4"),
    ("optim.weight_decay", "optimizer.weight_decay", "0.02"),
    ("optim.warmup_steps", "scheduler.t_warmup", "9"),
    ("optim.grad_clip", "algorithms.gradient_clipping.clipping_threshold", "0.5"),
]


def _pinned_config(tmp_path: Path, old_keys: bool = False, *more: str) -> tuple[TrainConfig, Path, Path]:
    """A config that sets every field of the run signature as runs recorded it to a value other than its default;
    its optimizer settings by their old names with `old_keys`; then the overrides `more`."""
    wan, init = tmp_path / "wan", tmp_path / "init.safetensors"
    wan.mkdir(exist_ok=True)
    (wan / "diffusion_pytorch_model.safetensors.index.json").write_bytes(b'{"weight_map": {}}')
    init.write_bytes(b"weights")
    cfg = load_config(
        None,
        [
            "loggers={}",
            "model.preset=tiny",
            "model.overrides={text_dim: 32, num_layers: 2}",
            "model.vocab=ids",
            "model.first_frame_cond=false",
            f"model.model_dir={wan}",
            f"model.init_ckpt={init}",
            "model.legacy_zero_ckpt=/nonexistent/zero",
            "data.path=s3://bucket/data/v10",
            "data.text_dropout=0.2",
            "data.cond_dropout=0.3",
            "data.mask_p=0.4",
            "data.mask_calibration=cap",
            "data.max_frame_coverage=0.6",
            "data.num_canonical_nodes=3",
            "data.limit=7",
            "seed=11",
            "precision=fp32",
            "parallelism=ddp",
            *(f"{old if old_keys else new}={value}" for old, new, value in RENAMED_PINNED),
            *more,
        ],
    )
    return cfg, wan, init


def test_the_run_signature_is_the_one_recorded_before_the_roles(tmp_path):
    """The keys and values run_start.run_signature gave this config before the fields declared their roles (computed
    once from that code): an existing run.json must still match."""
    cfg, wan, init = _pinned_config(tmp_path)
    index = (wan / "diffusion_pytorch_model.safetensors.index.json").read_bytes()
    before = {
        "model.preset": "tiny",
        "model.overrides": '{"num_layers": 2, "text_dim": 32}',
        "model.vocab": "ids",
        "model.first_frame_cond": False,
        "model.base_weights": hashlib.sha256(index).hexdigest(),
        "model.init_ckpt": {
            "path": os.path.realpath(init),
            "size": 7,
            "mtime_ns": init.stat().st_mtime_ns,
            "sha256": "9a129038d9a00aed0cf6a7ea059ca50a813449061ab87848cf1a13eafdf33b2c",
        },
        "model.legacy_zero_ckpt": "/nonexistent/zero",
        "data.manifest_sha256": "613fe5aa65343dbb1b9abe6abac6773f5c91bd60d3f2ffb7e2eae69e1db8b227",
        "data.text_dropout": 0.2,
        "data.cond_dropout": 0.3,
        "data.mask_p": 0.4,
        "data.mask_calibration": "cap",
        "data.max_frame_coverage": 0.6,
        "data.num_canonical_nodes": 3,
        "data.limit": 7,
        "seed": 11,
        "precision": "fp32",
        "parallelism": "ddp",
        "optim.lr": 2e-05,
        "optim.cond_lr": 0.0003,
        "optim.weight_decay": 0.02,
        "optim.warmup_steps": 9,
        "optim.grad_clip": 0.5,
        "optim.betas": [0.9, 0.999],
    }
    signature = run_signature(cfg, MANIFEST)
    assert signature == before
    assert diff_signatures(before, signature) == []


# the run's identity (docs/training.md, "Resuming"): each signed config field and its key in run.json's signature,
# pinned here rather than derived from the roles: a field that stops being signed, or starts, fails below
SIGNED = {
    "model.preset": "model.preset",
    "model.overrides": "model.overrides",
    "model.vocab": "model.vocab",
    "model.first_frame_cond": "model.first_frame_cond",
    "model.model_dir": "model.base_weights",
    "model.init_ckpt": "model.init_ckpt",
    "model.legacy_zero_ckpt": "model.legacy_zero_ckpt",
    "data.path": "data.manifest_sha256",
    "data.text_dropout": "data.text_dropout",
    "data.cond_dropout": "data.cond_dropout",
    "data.mask_p": "data.mask_p",
    "data.mask_calibration": "data.mask_calibration",
    "data.max_frame_coverage": "data.max_frame_coverage",
    "data.num_canonical_nodes": "data.num_canonical_nodes",
    "data.limit": "data.limit",
    "seed": "seed",
    "precision": "precision",
    "parallelism": "parallelism",
    "optimizer.lr": "optim.lr",
    "optimizer.cond_lr": "optim.cond_lr",
    "optimizer.weight_decay": "optim.weight_decay",
    "optimizer.betas": "optim.betas",
    "scheduler.t_warmup": "optim.warmup_steps",
    "algorithms.gradient_clipping.clipping_threshold": "optim.grad_clip",
}
# signed only at a value other than their default (every run before they were settings had the default)
SIGNED_OFF_DEFAULT = {
    "optimizer.name",
    "optimizer.eps",
    "scheduler.name",
    "scheduler.alpha_f",
    "algorithms.gradient_clipping.clipping_type",
}


def test_each_identity_field_is_in_the_signature_and_nothing_else_is(tmp_path):
    """The signature holds the signed fields under their keys and nothing else; the roles declare exactly these (a
    field declared identity=True under its own key, one that names its signature key under that key), and those
    signed only off their default are not signed at it."""
    cfg, _, _ = _pinned_config(tmp_path)
    assert set(run_signature(cfg, MANIFEST)) == set(SIGNED.values())
    declared = {k: k if r.identity is True else r.identity for k, r in ROLES.items() if r.identity and r.sign_default}
    assert declared == SIGNED
    assert {k for k, r in ROLES.items() if r.identity and not r.sign_default} == SIGNED_OFF_DEFAULT


def test_the_old_keys_give_the_signature_of_the_new_ones(tmp_path):
    """A run started with the old key names (optim.lr, optim.warmup_steps, ...) and relaunched with the new ones
    is the same run: the same signature, and its run.json is accepted as it is."""
    old_cfg, _, _ = _pinned_config(tmp_path, old_keys=True)
    new_cfg, _, _ = _pinned_config(tmp_path)
    assert dataclasses.asdict(old_cfg) == dataclasses.asdict(new_cfg)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    check_identity(run_dir, run_signature(old_cfg, MANIFEST), {"init_ckpt": ""})
    written = (run_dir / "run.json").read_bytes()
    check_identity(run_dir, run_signature(new_cfg, MANIFEST), {"init_ckpt": ""})  # no Refusal
    assert (run_dir / "run.json").read_bytes() == written


@pytest.mark.parametrize(
    "override, entry",
    [
        ("scheduler.name=cosine_with_warmup", "scheduler.name: '<absent>' -> 'cosine_with_warmup'"),
        ("scheduler.alpha_f=0.1", "scheduler.alpha_f: '<absent>' -> 0.1"),
        ("optimizer.eps=1e-6", "optimizer.eps: '<absent>' -> 1e-06"),
        ("optimizer.betas=[0.9, 0.95]", "optimizer.betas: [0.9, 0.999] -> [0.9, 0.95]"),
        ("scheduler.t_warmup=10ba", "scheduler.t_warmup: 9 -> 10"),
    ],
)
def test_a_new_schedule_or_optimizer_setting_on_resume_is_another_run(tmp_path, override, entry):
    """The scheduler and AdamW's betas and eps are part of the run's identity: at the values every run had before
    they were settings they leave the signature as it was (the test above), any other value is signed, and a
    relaunch that changes one is refused naming it."""
    cfg, _, _ = _pinned_config(tmp_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    check_identity(run_dir, run_signature(cfg, MANIFEST), {"init_ckpt": ""})
    changed, _, _ = _pinned_config(tmp_path, False, override)
    with pytest.raises(Refusal, match="holds a run with a different signature") as e:
        check_identity(run_dir, run_signature(changed, MANIFEST), {"init_ckpt": ""})
    assert f"\n  {entry}\n" in str(e.value)


def test_what_may_change_on_resume_leaves_the_signature_as_it_was(tmp_path):
    cfg, _, _ = _pinned_config(tmp_path)
    before = run_signature(cfg, MANIFEST)
    changed = dataclasses.replace(
        cfg,
        max_duration=cfg.max_steps + 1,
        global_train_batch_size=cfg.global_train_batch_size * 2,
        eval_interval=cfg.eval_interval + 1,
        faults=dataclasses.replace(cfg.faults, nonfinite_step=3, sigterm_at_val0=True),
    )
    assert run_signature(changed, MANIFEST) == before
    changed.data.mask_p = 0.45  # an identity field: the signature differs
    assert diff_signatures(before, run_signature(changed, MANIFEST)) == ["data.mask_p: 0.4 -> 0.45"]


def test_the_export_metadata_is_the_one_written_before_the_roles(tmp_path):
    """The keys (docs/design.md §9.9, in order) and values builders.export_metadata gave this config before the
    fields declared their roles (computed once from that code)."""
    assert META_KEYS == (
        *("arm", "format", "sem_cond", "mask_channel", "vocab", "data", "data_root", "step", "stage", "cond_type"),
        *("cond_key", "text_dropout", "cond_dropout", "mask_p", "lr", "cond_lr", "weight_decay", "warmup_steps"),
        *("first_frame_cond", "seed", "init_ckpt", "model_dir", "trainer", "resumed_from", "resumed_step"),
        "weights",  # added since (algorithms.ema); an export without it reads as raw
        *("data_limit", "git_revision", "git_dirty"),  # added since (issue 39); an export without them reads ""
        "preset",  # added since (issue 50): model.preset; "" with model.overrides (this config's), and in older ones
    )
    cfg, wan, _ = _pinned_config(tmp_path)
    start = RunStart(
        manifest={"name": "v10"},
        lineage={"init_ckpt": "w.safetensors"},
        launch="",
        committed_files=None,
        resumed_from="ck/ep0-ba4",
        resumed_step=4,
        provenance=Provenance("0.1.0", "c0ffee", False),
    )
    meta = export_metadata(cfg, start, 12)
    assert list(meta.items()) == [
        ("arm", "gc25d"),
        ("format", "gc25d"),
        ("sem_cond", "gc_sem_cond"),
        ("mask_channel", "False"),
        ("vocab", "ids"),
        ("data", "v10"),
        ("data_root", "s3://bucket/data/v10"),
        ("step", "12"),
        ("stage", "sft_bidirectional"),
        ("cond_type", "ids"),
        ("cond_key", "ids"),
        ("text_dropout", "0.2"),
        ("cond_dropout", "0.3"),
        ("mask_p", "0.4"),
        ("lr", "2e-05"),
        ("cond_lr", "0.0003"),
        ("weight_decay", "0.02"),
        ("warmup_steps", "9"),
        ("first_frame_cond", "False"),
        ("seed", "11"),
        ("init_ckpt", "w.safetensors"),
        ("model_dir", str(wan)),
        ("trainer", "gcc 0.1.0"),
        ("resumed_from", "ck/ep0-ba4"),
        ("resumed_step", "4"),
        ("weights", "raw"),
        ("data_limit", "7"),
        ("git_revision", "c0ffee"),
        ("git_dirty", "False"),
        ("preset", ""),
    ]


def test_an_export_metadata_key_outside_the_format_is_refused_naming_it():
    """gc_metadata takes the trainer's values by key: one the format (META_KEYS) does not have, a constant of it, or
    one missing is the caller's mistake, named before any file is written."""
    values = {k: "x" for k in META_KEYS if k not in GC_META and k not in META_DEFAULTS}
    assert set(gc_metadata(**values)) == set(META_KEYS)
    with pytest.raises(ValueError, match=r"unexpected \['betas'\], missing \[\]"):
        gc_metadata(**values, betas="0.9")
    with pytest.raises(ValueError, match=r"unexpected \['arm'\]"):
        gc_metadata(**values, arm="other")
    with pytest.raises(ValueError, match=r"missing \['seed'\]"):
        gc_metadata(**{k: v for k, v in values.items() if k != "seed"})


def test_choices_bounds_and_paths_come_from_the_declarations():
    assert CHOICES == {
        "precision": ("amp_bf16", "fp32"),
        "parallelism": ("fsdp", "ddp"),
        "log_level": ("DEBUG", "INFO", "WARNING", "ERROR"),
        "model.preset": ("ti2v-5b", "wide", "tiny", "tiny-p1"),
        "model.vocab": ("parts", "ids"),
        # the values the modules that act on them take, in their order
        "model.activation_checkpointing": block_wrap.CHECKPOINTING,
        "model.attention": attention.CHOICES,
        "data.mask_calibration": ("frame0", "cap"),
        "optimizer.name": ("adamw",),
        "scheduler.name": ("constant_with_warmup", "cosine_with_warmup", "linear_decay_with_warmup"),
        "algorithms.gradient_clipping.clipping_type": ("norm",),
    }
    assert set(PATH_KEYS) == {
        "run_dir",
        "save_folder",
        "data.path",
        "data.cache_dir",
        "model.model_dir",
        "model.init_ckpt",
        "model.legacy_zero_ckpt",
        "model.vae_path",
    }
    assert {"data.mask_p", "optimizer.lr", "seed", "data.limit", "faults.stall_step"} <= set(BOUNDS)


@pytest.mark.parametrize(
    "override, message",
    [
        ("seed=-1", "seed: must be in [0, 2**32), got -1"),
        (f"seed={2**32}", f"seed: must be in [0, 2**32), got {2**32}"),
        ("optimizer.lr=-1", "optimizer.lr: must be >= 0, got -1.0"),
        (
            "algorithms.gradient_clipping.clipping_threshold=-0.5",
            "algorithms.gradient_clipping.clipping_threshold: must be >= 0, got -0.5",
        ),
        ("data.max_frame_coverage=1.5", "data.max_frame_coverage: must be in [0, 1], got 1.5"),
        (
            "data.limit=0",
            f"data.limit: must be a positive number of train clips, or null (the whole train split), "
            f"at most {10**9}, got 0",
        ),
        ("dist_timeout=0", "dist_timeout: must be > 0 seconds and at most 604800 seconds, got 0.0"),
        ("stall_timeout_s=700000", "stall_timeout_s: must be at most 604800 seconds (and >= 0), got 700000.0"),
        ("faults.stall_rank=-1", "faults.stall_rank: must be >= 0 and at most 65536, got -1"),
    ],
)
def test_a_value_outside_its_declared_range_is_refused_as_before(override, message):
    """The messages of the range checks that were separate code before the declarations (seed, >= 0, [0, 1],
    data.limit) and of BOUNDS, word for word."""
    with pytest.raises(ConfigError) as e:
        load_config(None, [override, "loggers={}"])
    assert str(e.value) == message


def test_the_fault_hooks_are_a_test_only_section():
    cfg = load_config(None, ["faults.nonfinite_step=3", "faults.nonfinite_rank=1", "faults.sigterm_at_val0=true"])
    assert (cfg.faults.nonfinite_step, cfg.faults.nonfinite_rank, cfg.faults.sigterm_at_val0) == (3, 1, True)
    assert all(
        role.identity is False and role.exported is False for key, role in ROLES.items() if key.startswith("faults.")
    )
    with pytest.raises(ConfigError, match=r"unknown key\(s\): inject_nonfinite_step"):
        load_config(None, ["inject_nonfinite_step=3"])


@pytest.mark.parametrize(
    "signed, named",
    [
        ("optim.lr", "optimizer.lr"),  # renamed since runs recorded it
        ("optim.betas", "optimizer.betas"),
        ("optim.warmup_steps", "scheduler.t_warmup"),
        ("optim.grad_clip", "algorithms.gradient_clipping.clipping_threshold"),
        ("data.manifest_sha256", "data.path (manifest sha256)"),  # what is signed of a path
        ("model.base_weights", "model.model_dir (base weights)"),
        ("scheduler.horizon", "max_duration (in batches: the decaying schedule's horizon)"),
        ("seed", "seed"),  # signed under its own key
        ("model.init_ckpt", "model.init_ckpt"),
        ("no.such_key", "no.such_key"),
    ],
)
def test_a_signature_key_is_named_as_the_config_names_it_now(signed, named):
    from gcc.training.config import signature_key_name

    assert signature_key_name(signed) == named
