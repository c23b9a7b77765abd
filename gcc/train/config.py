"""The typed run configuration: yaml + dotted `key=value` overrides -> `TrainConfig`, validated before any work.

Defaults are the v10 run (docs/design.md §8). Unknown keys, wrong types and inconsistent batch settings raise
`ConfigError` naming the key; `gcc/train.py` turns that into a one-line message and exit code 2.
"""
from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gcc.data.workers import PREEMPTION_GRACE_S


class ConfigError(ValueError):
    pass


@dataclass
class ModelConfig:
    preset: str = "ti2v-5b"  # gcc.model.dit presets: ti2v-5b | wide (its width, 2 blocks) | tiny
    overrides: dict = field(default_factory=dict)  # preset fields to change (e.g. tiny's text_dim)
    model_dir: str = ""  # base Wan2.2-TI2V-5B weights (sharded safetensors); "" = random init (tiny/CPU only)
    init_ckpt: str = ""  # warm start: a gc25d export (same vocab) or a plain Wan export
    legacy_zero_ckpt: str = ""  # warm start from a DeepSpeed ZeRO checkpoint dir (needs the `legacy` extra)
    vocab: str = "parts"
    first_frame_cond: bool = True
    grad_ckpt: bool = True


@dataclass
class DataConfig:
    path: str = "data/gc25d_v10_mds"  # a convert_data output: local folder or s3://bucket/prefix
    cache_dir: str = ""  # per-node shard cache; "" = <run_dir>/cache/node<N>
    num_workers: int = 4
    text_dropout: float = 0.1
    cond_dropout: float = 0.05
    mask_p: float = 0.5
    mask_calibration: str = "frame0"  # frame0 | cap
    max_frame_coverage: float = 0.4
    num_canonical_nodes: int = 1  # fixed so the sample order is the same for any number of nodes/GPUs
    cache_limit: str = ""  # Streaming cache_limit (e.g. "200gb"); "" = unlimited


@dataclass
class OptimConfig:
    lr: float = 1e-5
    cond_lr: float = 1e-4
    weight_decay: float = 0.01
    warmup_steps: int = 500
    grad_clip: float = 1.0  # max global grad norm; 0 = off


@dataclass
class FsdpConfig:
    # False: ZeRO-2-like (a block's gathered parameters stay from its forward to its backward); True: ZeRO-3-like
    # (gathered again in the backward: less memory, one more all-gather per block). docs/performance.md has both.
    reshard_after_forward: bool = False


@dataclass
class TrainConfig:
    run_dir: str = "runs/sft_v10"
    seed: int = 0
    global_batch: int = 16
    micro_batch: int = 1
    grad_accum: int = 0  # 0 = derived: global_batch / (world_size × micro_batch); else must match
    max_steps: int = 20000
    precision: str = "amp_bf16"  # amp_bf16 (GPU) | fp32 (CPU)
    parallelism: str = "fsdp"  # fsdp (Composer's FSDP2, sharded checkpoints) | ddp
    checkpoint_every: int = 500
    keep_checkpoints: int = 2  # locally and, with checkpoint_dir, remotely; across restarts
    # "" = checkpoints only in <run_dir>/checkpoints; s3://bucket/prefix = also there, committed after each save,
    # and a start with an empty run folder resumes from it (docs/training.md, "Checkpoints on object storage")
    checkpoint_dir: str = ""
    export_every: int = 1000
    val_every: int = 500
    val_n: int = 16
    val_timesteps: list = field(default_factory=lambda: [200, 500, 800])
    val_batch: int = 1
    autoresume: bool = True
    progress_bar: bool = True
    # a progress line every this many steps (and val lines after each validation), unless the progress bar is on
    # and stdout is a terminal; 0 = never
    console_log_every: int = 10
    # logger name -> options of Composer's class: tensorboard, wandb, mlflow (gcc/train/loggers.py); CSV always
    loggers: dict = field(default_factory=lambda: {"tensorboard": {}})
    log_level: str = "INFO"  # what rank 0 prints: DEBUG | INFO | WARNING | ERROR
    dist_timeout: float = 600.0
    # after SIGTERM/SIGUSR1 a rank must checkpoint and exit within this; else it writes every thread's stack to
    # <run_dir>/stacks/ and exits 5. Keep it below the scheduler's kill timeout.
    preemption_grace_s: float = PREEMPTION_GRACE_S
    # a rank that completes no step within this (model build, warm-up, validation; 0 = off), or, once 10 steps
    # are timed, within max(stall_floor_s, 20 × the median step time), writes its stacks and exits 5
    stall_timeout_s: float = 1800.0
    stall_floor_s: float = 300.0
    inject_nonfinite_step: int = 0  # fault injection for tests: make the loss NaN at this step...
    inject_nonfinite_rank: int = 0  # ...on this rank (0 = off)
    inject_stall_step: int = 0  # fault injection for tests: the loader never delivers this step's batch...
    inject_stall_rank: int = 0  # ...on this rank (0 = off)
    fsdp: FsdpConfig = field(default_factory=FsdpConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)

    def per_rank_batch(self, world_size: int) -> int:
        return self.micro_batch * self.accumulation(world_size)

    def accumulation(self, world_size: int) -> int:
        per_rank, rem = divmod(self.global_batch, world_size * self.micro_batch)
        if rem or per_rank < 1:
            raise ConfigError(f"global_batch={self.global_batch} is not a multiple of world_size × micro_batch = "
                              f"{world_size} × {self.micro_batch}")
        if self.grad_accum and self.grad_accum != per_rank:
            raise ConfigError(f"grad_accum={self.grad_accum} disagrees with global_batch / (world_size × micro_batch)"
                              f" = {self.global_batch} / ({world_size} × {self.micro_batch}) = {per_rank}")
        return per_rank


CHOICES = {"model.vocab": ("parts", "ids"), "model.preset": ("ti2v-5b", "wide", "tiny"),
           "data.mask_calibration": ("frame0", "cap"), "precision": ("amp_bf16", "fp32"),
           "parallelism": ("fsdp", "ddp"), "log_level": ("DEBUG", "INFO", "WARNING", "ERROR")}


def _check_type(key: str, value: Any, typ: Any) -> Any:
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if typ is float and isinstance(value, str):  # yaml reads "1e-5" as a string
        try:
            return float(value)
        except ValueError:
            pass
    base = typing.get_origin(typ) or typ
    if base is dict and isinstance(value, dict) or base is list and isinstance(value, list):
        return value
    if isinstance(base, type) and isinstance(value, base) and not (base is int and isinstance(value, bool)):
        return value
    raise ConfigError(f"{key}: expected {getattr(typ, '__name__', typ)}, got {type(value).__name__} {value!r}")


def _build(cls, data: dict, prefix: str = ""):
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or '(root)'}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"unknown key(s): {', '.join(prefix + k for k in unknown)}")
    kwargs = {}
    for k, v in data.items():
        typ = hints[k]
        if dataclasses.is_dataclass(typ):
            kwargs[k] = _build(typ, v, f"{prefix}{k}.")
        else:
            kwargs[k] = _check_type(prefix + k, v, typ)
    return cls(**kwargs)


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{dotted}: {p} is not a section")
    node[parts[-1]] = value


def load_config(yaml_path: str | Path | None, overrides: list[str] = ()) -> TrainConfig:
    tree: dict = {}
    if yaml_path is not None:
        p = Path(yaml_path)
        if not p.exists():
            raise ConfigError(f"{p}: config file not found")
        tree = yaml.safe_load(p.read_text()) or {}
    for ov in overrides:
        if "=" not in ov:
            raise ConfigError(f"override {ov!r}: expected dotted.key=value")
        key, raw = ov.split("=", 1)
        _set_dotted(tree, key.strip(), yaml.safe_load(raw))
    cfg = _build(TrainConfig, tree)
    validate(cfg)
    return cfg


def _get(cfg, dotted: str):
    for p in dotted.split("."):
        cfg = getattr(cfg, p)
    return cfg


def validate(cfg: TrainConfig) -> None:
    for key, allowed in CHOICES.items():
        if _get(cfg, key) not in allowed:
            raise ConfigError(f"{key}: must be one of {allowed}, got {_get(cfg, key)!r}")
    for key in ("global_batch", "micro_batch", "max_steps", "checkpoint_every", "keep_checkpoints",
                "export_every", "val_every", "val_batch"):
        if _get(cfg, key) < (0 if key in ("export_every", "val_every") else 1):
            raise ConfigError(f"{key}: must be positive, got {_get(cfg, key)}")
    if cfg.val_n < 0:
        raise ConfigError(f"val_n: must be >= 0, got {cfg.val_n}")
    for key in ("data.text_dropout", "data.cond_dropout", "data.mask_p", "data.max_frame_coverage"):
        if not 0.0 <= _get(cfg, key) <= 1.0:
            raise ConfigError(f"{key}: must be in [0, 1], got {_get(cfg, key)}")
    for key in ("dist_timeout", "preemption_grace_s", "stall_floor_s"):
        if _get(cfg, key) <= 0:
            raise ConfigError(f"{key}: must be > 0 seconds, got {_get(cfg, key)}")
    if cfg.stall_timeout_s < 0:
        raise ConfigError(f"stall_timeout_s: must be >= 0 seconds (0 = off), got {cfg.stall_timeout_s}")
    from gcc.train.loggers import check_logger_options

    problems = check_logger_options(cfg.loggers)
    if problems:
        raise ConfigError("; ".join(problems))
    if cfg.console_log_every < 0:
        raise ConfigError(f"console_log_every: must be >= 0 (0 = no progress lines), got {cfg.console_log_every}")
    if cfg.data.num_workers < 0:
        raise ConfigError(f"data.num_workers: must be >= 0, got {cfg.data.num_workers}")
    if cfg.checkpoint_dir and not re.fullmatch(r"s3://[^/]+/.*[^/].*", cfg.checkpoint_dir):
        raise ConfigError(f"checkpoint_dir: must be empty (checkpoints in <run_dir>/checkpoints) or "
                          f"s3://bucket/prefix, got {cfg.checkpoint_dir!r}")
    if cfg.grad_accum < 0:
        raise ConfigError(f"grad_accum: must be >= 0 (0 = derived), got {cfg.grad_accum}")
    if cfg.global_batch % cfg.micro_batch:
        raise ConfigError(f"global_batch={cfg.global_batch} is not a multiple of micro_batch={cfg.micro_batch}")


def to_dict(cfg: TrainConfig) -> dict:
    return dataclasses.asdict(cfg)
