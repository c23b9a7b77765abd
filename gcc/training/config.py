"""The typed run configuration: yaml + dotted `key=value` overrides -> `TrainConfig`, validated before any work.

Defaults are the v10 run (docs/design.md §8). Unknown keys, wrong types and inconsistent batch settings raise
`ConfigError` naming the key; `gcc/train.py` turns that into a one-line message and exit code 2.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from safetensors import SafetensorError

from gcc import storage
from gcc.cli import folder_problem, input_file_problem, os_error_message
from gcc.inputs import shown
from gcc.workers import PREEMPTION_GRACE_S


class ConfigError(ValueError):
    pass


@dataclass
class ModelConfig:
    preset: str = "ti2v-5b"  # gcc.model.dit presets: ti2v-5b | wide (its width, 2 blocks) | tiny
    overrides: dict = field(default_factory=dict)  # preset fields to change (e.g. tiny's text_dim)
    model_dir: str = ""  # base Wan2.2-TI2V-5B weights (sharded safetensors); "" = random init (tiny/CPU only)
    init_ckpt: str = ""  # warm start: a gc25d export (same vocab) or a plain Wan export
    legacy_zero_ckpt: str = ""  # warm start from a DeepSpeed ZeRO checkpoint dir (needs the `legacy` extra)
    # the Wan2.2 VAE file (Wan2.2_VAE.pth as published) that decodes the samples logged during training on real data;
    # "" = a latent preview (gcc-synth data has its own decoder)
    vae_path: str = ""
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
    # N: train on a seeded subset of N train clips (a smoke run on the real data; part of the run signature);
    # null = the whole train split
    limit: int | None = None


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
    checkpoint_every: int = 1000  # why 1000: docs/design.md §8
    keep_checkpoints: int = 2  # locally and, with checkpoint_dir, remotely; across restarts
    # "" = checkpoints only in <run_dir>/checkpoints; s3://bucket/prefix = also there, committed after each save,
    # and a start with an empty run folder resumes from it (docs/training.md, "Checkpoints on object storage")
    checkpoint_dir: str = ""
    export_every: int = 1000
    val_every: int = 500
    # validate the starting weights before the first step (a step-0 row, the run's baseline); a resume never repeats it
    val_at_start: bool = True
    val_n: int = 16
    val_timesteps: list = field(default_factory=lambda: [200, 500, 800])
    val_batch: int = 1
    # samples during training (docs/sample.md): at every sample_every-th validation (and the last step's), sample_n
    # fixed val clips sampled with their semantic condition and without it, from the same noise; logged as videos and
    # a contact sheet to every logger and <run_dir>/samples/step-N/. 0 = off
    sample_every: int = 2
    sample_n: int = 2
    sample_steps: int = 20  # denoising steps (FlowMatchScheduler, Wan's schedule, shift 5)
    sample_cfg: float = 1.0  # semantic guidance of the conditioned variant (gcc-sample's --sem_cfg; 1 = none)
    keep_samples: int = 0  # samples/step-N folders kept (0 = all)
    autoresume: bool = True
    # a launch with nothing to resume in a run folder that holds exports, log rows or checkpoints is refused (exit 3);
    # true starts over there on purpose, moving what the run wrote to <run_dir>/replaced/<time>/
    allow_existing: bool = False
    progress_bar: bool = True
    # a progress line every this many steps (and val lines after each validation), unless the progress bar is on
    # and stdout is a terminal; 0 = never
    console_log_every: int = 10
    # logger name -> options of Composer's class: tensorboard, wandb, mlflow (gcc/training/loggers.py); CSV always
    loggers: dict = field(default_factory=lambda: {"tensorboard": {}})
    log_level: str = "INFO"  # what rank 0 prints: DEBUG | INFO | WARNING | ERROR
    dist_timeout: float = 600.0
    # Composer's event engine without visits to callbacks that do nothing on an event (gcc/compat/composer.py
    # LeanEngine: ~5 ms a step less; docs/performance.md); false runs Composer's own
    lean_engine: bool = True
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
    # fault injection for tests: the last rank sends itself SIGTERM as the step-0 validation starts (a preemption
    # that only that rank sees, during the step-0 validation)
    inject_sigterm_at_val0: bool = False
    # fault injection for tests: right after committing this step's checkpoint to checkpoint_dir, rank 0 sends SIGSTOP
    # to the launch's process group, freezing it at a known point (the test kills it, or claims the prefix and sends
    # SIGCONT); 0 = off
    inject_stop_after_commit_step: int = 0
    fsdp: FsdpConfig = field(default_factory=FsdpConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)

    def per_rank_batch(self, world_size: int) -> int:
        return self.micro_batch * self.accumulation(world_size)

    def accumulation(self, world_size: int) -> int:
        per_rank, rem = divmod(self.global_batch, world_size * self.micro_batch)
        if rem or per_rank < 1:
            raise ConfigError(
                f"global_batch={self.global_batch} is not a multiple of world_size × micro_batch = "
                f"{world_size} × {self.micro_batch}"
            )
        if self.grad_accum and self.grad_accum != per_rank:
            raise ConfigError(
                f"grad_accum={self.grad_accum} disagrees with global_batch / (world_size × micro_batch)"
                f" = {self.global_batch} / ({world_size} × {self.micro_batch}) = {per_rank}"
            )
        return per_rank


CHOICES = {
    "model.vocab": ("parts", "ids"),
    "model.preset": ("ti2v-5b", "wide", "tiny"),
    "data.mask_calibration": ("frame0", "cap"),
    "precision": ("amp_bf16", "fp32"),
    "parallelism": ("fsdp", "ddp"),
    "log_level": ("DEBUG", "INFO", "WARNING", "ERROR"),
}


def _check_type(key: str, value: Any, typ: Any) -> Any:
    if typing.get_origin(typ) in (typing.Union, types.UnionType):  # `X | None`: null, or an X
        if value is None:
            return None
        (typ,) = [t for t in typing.get_args(typ) if t is not type(None)]
        try:
            return _check_type(key, value, typ)
        except ConfigError:
            raise ConfigError(f"{key}: expected {typ.__name__} or null, got {type(value).__name__} {value!r}") from None
    if typ is float:
        number = _as_float(value)
        if number is not None:
            if not math.isfinite(number):  # nan and inf pass every range check below: refused here
                raise ConfigError(f"{key}: expected a finite number, got {value!r}")
            return number
    base = typing.get_origin(typ) or typ
    if (base is dict and isinstance(value, dict)) or (base is list and isinstance(value, list)):
        return value
    if isinstance(base, type) and isinstance(value, base) and not (base is int and isinstance(value, bool)):
        return value
    raise ConfigError(f"{key}: expected {getattr(typ, '__name__', typ)}, got {type(value).__name__} {value!r}")


def _as_float(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:  # an int too large for a float
            return math.inf
    if isinstance(value, str):  # yaml reads "1e-5" as a string
        try:
            return float(value)
        except ValueError:
            return None
    return None


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


def _yaml_problem(e: yaml.YAMLError) -> str:
    """A yaml error's own words, with the line and column where the file has them."""
    mark = getattr(e, "problem_mark", None)
    what = " ".join(str(x) for x in (getattr(e, "context", None), getattr(e, "problem", None)) if x) or str(e)
    return f"line {mark.line + 1}, column {mark.column + 1}: {what}" if mark is not None else what


MAX_YAML_BYTES = 16 << 20


def read_yaml(path: str | Path) -> dict:
    """The yaml file's mapping of keys ({} for an empty file); a ConfigError naming the file when it cannot be."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"{p}: config file not found")
    if p.is_dir():
        raise ConfigError(f"{p}: is a folder, expected a yaml config file")
    try:
        with open(p, "rb") as f:  # bounded: a path such as /dev/zero must not fill the memory
            data = f.read(MAX_YAML_BYTES + 1)
        if len(data) > MAX_YAML_BYTES:
            raise ConfigError(f"{p}: larger than {MAX_YAML_BYTES >> 20} MB, not a yaml config file")
        text = data.decode("utf-8")
    except OSError as e:
        raise ConfigError(f"config file {os_error_message(e)}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"{p}: not a yaml config file (not UTF-8 text: byte {e.start} is {e.object[e.start]:#04x})"
        ) from None
    try:
        tree = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid yaml ({_yaml_problem(e)})") from None
    if tree is None:
        return {}
    if not isinstance(tree, dict):
        raise ConfigError(f"{p}: expected a mapping of keys (key: value lines), got a yaml {type(tree).__name__}")
    return tree


def parse_override(ov: str) -> tuple[str, Any]:
    """`dotted.key=value` -> (key, the value read as yaml, as in the file)."""
    if "=" not in ov:
        raise ConfigError(f"override {ov!r}: expected dotted.key=value")
    key, raw = ov.split("=", 1)
    key = key.strip()
    if not all(key.split(".")):
        raise ConfigError(f"override {ov!r}: empty key name (expected dotted.key=value)")
    try:
        return key, yaml.safe_load(raw)
    except yaml.YAMLError as e:
        raise ConfigError(f"override {ov!r}: the value {raw!r} is not valid yaml ({_yaml_problem(e)})") from None


def load_config(yaml_path: str | Path | None, overrides: list[str] = ()) -> TrainConfig:
    tree: dict = read_yaml(yaml_path) if yaml_path is not None else {}
    for ov in overrides:
        _set_dotted(tree, *parse_override(ov))
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
    for key in (
        "global_batch",
        "micro_batch",
        "max_steps",
        "checkpoint_every",
        "keep_checkpoints",
        "export_every",
        "val_every",
        "val_batch",
    ):
        if _get(cfg, key) < (0 if key in ("export_every", "val_every") else 1):
            raise ConfigError(f"{key}: must be positive, got {_get(cfg, key)}")
    if cfg.val_n < 0:
        raise ConfigError(f"val_n: must be >= 0, got {cfg.val_n}")
    for key in ("sample_every", "sample_n", "keep_samples"):
        if _get(cfg, key) < 0:
            raise ConfigError(f"{key}: must be >= 0, got {_get(cfg, key)}")
    if cfg.sample_steps < 1:
        raise ConfigError(f"sample_steps: must be >= 1, got {cfg.sample_steps}")
    for key in ("data.text_dropout", "data.cond_dropout", "data.mask_p", "data.max_frame_coverage"):
        if not 0.0 <= _get(cfg, key) <= 1.0:
            raise ConfigError(f"{key}: must be in [0, 1], got {_get(cfg, key)}")
    for key in ("dist_timeout", "preemption_grace_s", "stall_floor_s"):
        if _get(cfg, key) <= 0:
            raise ConfigError(f"{key}: must be > 0 seconds, got {_get(cfg, key)}")
    if cfg.stall_timeout_s < 0:
        raise ConfigError(f"stall_timeout_s: must be >= 0 seconds (0 = off), got {cfg.stall_timeout_s}")
    if cfg.console_log_every < 0:
        raise ConfigError(f"console_log_every: must be >= 0 (0 = no progress lines), got {cfg.console_log_every}")
    if cfg.data.num_workers < 0:
        raise ConfigError(f"data.num_workers: must be >= 0, got {cfg.data.num_workers}")
    if cfg.checkpoint_dir and not re.fullmatch(r"s3://[^/]+/.*[^/].*", cfg.checkpoint_dir):
        raise ConfigError(
            f"checkpoint_dir: must be empty (checkpoints in <run_dir>/checkpoints) or "
            f"s3://bucket/prefix, got {cfg.checkpoint_dir!r}"
        )
    if cfg.grad_accum < 0:
        raise ConfigError(f"grad_accum: must be >= 0 (0 = derived), got {cfg.grad_accum}")
    if cfg.global_batch % cfg.micro_batch:
        raise ConfigError(f"global_batch={cfg.global_batch} is not a multiple of micro_batch={cfg.micro_batch}")
    if not 0 <= cfg.seed < 2**32:  # Composer's and Streaming's range
        raise ConfigError(f"seed: must be in [0, 2**32), got {cfg.seed}")
    for key in (
        "optim.lr",
        "optim.cond_lr",
        "optim.weight_decay",
        "optim.grad_clip",
        "optim.warmup_steps",
        "inject_nonfinite_step",
        "inject_nonfinite_rank",
        "inject_stall_step",
        "inject_stall_rank",
    ):
        if _get(cfg, key) < 0:
            raise ConfigError(f"{key}: must be >= 0, got {_get(cfg, key)}")
    if cfg.dist_timeout > MAX_TIMEOUT_S:
        raise ConfigError(
            f"dist_timeout: must be at most {MAX_TIMEOUT_S:.3g} seconds (Python's timedelta), got {cfg.dist_timeout}"
        )
    if cfg.data.limit is not None and cfg.data.limit < 1:
        raise ConfigError(
            f"data.limit: must be a positive number of train clips, or null (the whole train split), "
            f"got {cfg.data.limit}"
        )
    if cfg.data.num_canonical_nodes < 1:
        raise ConfigError(f"data.num_canonical_nodes: must be >= 1, got {cfg.data.num_canonical_nodes}")
    if cfg.data.cache_limit:
        from streaming.base.util import bytes_to_int  # heavy (streaming pulls torch, ~3 s): config stays light

        try:
            limit = bytes_to_int(cfg.data.cache_limit)
        except ValueError:
            limit = 0
        if limit <= 0:
            raise ConfigError(
                f"data.cache_limit: must be empty (no limit) or a size such as 200gb, got {cfg.data.cache_limit!r}"
            )
    bad_t = [t for t in cfg.val_timesteps if _as_float(t) is None or not 0 <= _as_float(t) <= 1000]
    if bad_t or (not cfg.val_timesteps and cfg.val_every and cfg.val_n):
        raise ConfigError(
            f"val_timesteps: must be a non-empty list of numbers in [0, 1000] (scheduler timesteps), "
            f"got {cfg.val_timesteps!r}"
        )
    _check_model_overrides(cfg.model.overrides)
    if cfg.loggers:  # last: it imports Composer (seconds)
        from gcc.training.loggers import check_logger_options  # heavy: imports Composer; config stays light

        problems = check_logger_options(cfg.loggers)
        if problems:
            raise ConfigError("; ".join(problems))


# Python's timedelta holds at most 999,999,999 days
MAX_TIMEOUT_S = 999_999_999 * 86400.0


def _check_model_overrides(overrides: dict) -> None:
    """model.overrides: fields of the preset's DiTConfig (docs/model.md), each of its type; the vocab is model.vocab."""
    if not overrides:
        return
    from gcc.model.dit import DiTConfig  # heavy (torch, diffsynth): config stays light without overrides

    hints = typing.get_type_hints(DiTConfig)
    for k, v in overrides.items():
        if k not in hints or k == "vocab":
            hint = " (set model.vocab instead)" if k == "vocab" else ""
            raise ConfigError(
                f"model.overrides.{k}: not a field of the model config{hint}; known: {sorted(set(hints) - {'vocab'})}"
            )
        typ = hints[k]
        if typing.get_origin(typ) is tuple:
            ok = (
                isinstance(v, list)
                and len(v) == len(typing.get_args(typ))
                and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in v)
            )
            want = f"a list of {len(typing.get_args(typ))} positive integers"
        elif typ is float:
            ok = _as_float(v) is not None and math.isfinite(_as_float(v)) and _as_float(v) > 0
            want = "a positive number"
        else:
            ok = isinstance(v, int) and not isinstance(v, bool) and v > 0
            want = "a positive integer"
        if not ok:
            raise ConfigError(f"model.overrides.{k}: expected {want}, got {v!r}")


def samples_during_training(cfg: TrainConfig) -> bool:
    """Whether the run logs samples: it validates (val_every, val_n) and sample_every, sample_n are on."""
    return cfg.val_every > 0 and cfg.val_n > 0 and cfg.sample_every > 0 and cfg.sample_n > 0


def check_inputs(cfg: TrainConfig) -> None:
    """What the config names outside itself, checked before any work (every rank does it, before the process
    group): the folders it writes (run_dir, data.cache_dir) must be folders; an s3:// data.path or checkpoint_dir
    needs a bucket the store serves; the weights it names (model.model_dir, model.init_ckpt,
    model.legacy_zero_ckpt), where they exist, and model.vae_path (when the run samples), must be of the right kind and fit the model, read from their
    headers against the model built on the meta device (nothing allocated). Missing weights and a local
    data.path without a finished conversion are left to rank 0 (a resume loads no weights; data not ready is a
    refusal, exit 3: docs/training.md). Raises ConfigError naming the key; StorageUnavailable when the store
    does not answer."""
    for key in ("run_dir", "data.cache_dir"):  # run_dir "" would be the current folder; data.cache_dir "": the default
        value = _get(cfg, key)
        problem = (key == "run_dir" or value) and (storage.local_path_problem(value) or folder_problem(value))
        if problem:
            raise ConfigError(f"{key}: {shown(value)}: {problem}")
    for key in ("data.path", "checkpoint_dir"):
        url = _get(cfg, key)
        if url and storage.is_remote(url):
            problem = storage.bucket_problem(url)
            if problem:
                raise ConfigError(f"{key}: {url}: {problem}")
    if not storage.is_remote(cfg.data.path) and Path(cfg.data.path).is_file():
        raise ConfigError(f"data.path: {cfg.data.path} is a file, expected a convert_data output folder")
    model = cfg.model
    if model.init_ckpt and Path(model.init_ckpt).is_dir():
        raise ConfigError(f"model.init_ckpt: {model.init_ckpt}: is a folder, expected a .safetensors export")
    for key, wanted in (
        ("model_dir", "the Wan2.2-TI2V-5B folder as published"),
        ("legacy_zero_ckpt", "a DeepSpeed ZeRO checkpoint folder"),
    ):
        path = getattr(model, key)
        if path and Path(path).exists() and not Path(path).is_dir():
            raise ConfigError(f"model.{key}: {path}: is a file, expected {wanted}")
    problem = model.vae_path and samples_during_training(cfg) and input_file_problem(model.vae_path)
    if problem:  # unlike weights, a resume needs it too
        raise ConfigError(f"model.vae_path: {model.vae_path}: {problem} (expected Wan2.2_VAE.pth as published)")
    legacy = Path(model.legacy_zero_ckpt) if model.legacy_zero_ckpt else None
    if legacy is not None and legacy.is_dir() and not (legacy / "latest").is_file():
        raise ConfigError(
            f"model.legacy_zero_ckpt: {legacy}: no 'latest' file (expected a DeepSpeed ZeRO "
            f"checkpoint folder as accelerate's save_state writes it)"
        )
    _check_weights_fit(cfg)


def _check_weights_fit(cfg: TrainConfig) -> None:
    if not (cfg.model.overrides or cfg.model.model_dir or cfg.model.init_ckpt):
        return
    # heavy (torch, diffsynth): validating a config without model weights stays light
    from gcc.model.dit import build_gc_dit, load_wan_base
    from gcc.model.export import load_gc_weights

    try:
        dit = build_gc_dit(cfg.model.preset, device="meta", vocab=cfg.model.vocab, **cfg.model.overrides)
        head_dim, rem = divmod(dit.config.dim, dit.config.num_heads)
        if rem or head_dim % 2 or head_dim // 3 % 2:  # Wan's 3D RoPE splits a head in three even parts
            raise ValueError(
                f"dim={dit.config.dim} / num_heads={dit.config.num_heads} must give a head width d "
                f"with d and d // 3 even (Wan's 3D RoPE)"
            )
    except (ValueError, TypeError, AssertionError, RuntimeError) as e:
        raise ConfigError(
            f"model.overrides: the {cfg.model.preset!r} preset with {cfg.model.overrides} cannot be "
            f"built ({type(e).__name__}: {e})"
        ) from None
    for key, check in (("model_dir", load_wan_base), ("init_ckpt", load_gc_weights)):
        path = getattr(cfg.model, key)
        if not (path and os.path.exists(path)):  # missing: rank 0 decides (a resume does not load it)
            continue
        try:
            check(dit, path, check_only=True)
        except (ValueError, OSError, SafetensorError) as e:  # GcCkptError is a ValueError; each names the file
            raise ConfigError(
                f"model.{key}: {e} (the model: model.preset {cfg.model.preset!r}, model.vocab {cfg.model.vocab!r})"
            ) from None


def to_dict(cfg: TrainConfig) -> dict:
    return dataclasses.asdict(cfg)
