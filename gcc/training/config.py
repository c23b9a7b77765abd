"""The typed run configuration: yaml + dotted `key=value` overrides -> `TrainConfig`, validated before any work.

Defaults are the v10 run (docs/design.md §8). Unknown keys, wrong types, values outside their range (`BOUNDS`,
`MODEL_BOUNDS`), a path with credentials in it and inconsistent batch settings raise `ConfigError` naming the key;
`gcc/train.py` turns that into a one-line message and exit code 2. The yaml and the overrides are read by a bounded
loader (`_BoundedLoader`; docs/training.md, "Trust and safety").
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

from gcc import exit_codes, storage
from gcc.cli import folder_problem, input_file_problem
from gcc.errors import BadInput
from gcc.inputs import MAX_DEPTH, read_text, shown
from gcc.workers import PREEMPTION_GRACE_S


class ConfigError(ValueError):
    exit_code = exit_codes.CONFIG


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
    what = " ".join(what.split())  # one line (a reader error spans two)
    return f"line {mark.line + 1}, column {mark.column + 1}: {what}" if mark is not None else what


# a yaml's aliases (*name) and its values, aliases expanded: beyond these it is refused before it is built (a
# kilobyte of nested aliases expands to billions of values, which every later walk of the config would visit)
MAX_YAML_ALIASES = 100
MAX_YAML_VALUES = 100_000
_STR, _MERGE = "tag:yaml.org,2002:str", "tag:yaml.org,2002:merge"


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader (plain data, no Python objects) that refuses, naming the key path: more than
    MAX_YAML_ALIASES aliases, nesting deeper than gcc.inputs.MAX_DEPTH (aliases expanded; Python's recursion
    would end in a RecursionError), more than MAX_YAML_VALUES values once aliases are expanded, an alias inside
    the node it names, and a key that is not a string (`1:`, `true:`, `null:`: quote it)."""

    def __init__(self, text: str, where: str, root: tuple[str, ...] = ()):
        super().__init__(text)
        self.where, self.path, self.aliases = where, list(root), 0

    def _refuse(self, path: list[str], what: str) -> ConfigError:
        shown_path = path if len(path) <= 8 else [*path[:4], "…", *path[-3:]]
        return ConfigError(f"{self.where}: {'.'.join(shown_path) or '(top level)'}: {what}")

    def compose_node(self, parent, index):
        step = None
        if isinstance(parent, yaml.MappingNode):  # index: the key's node, None while the key itself is composed
            step = shown(index.value, 60) if isinstance(index, yaml.ScalarNode) else "?"
        elif isinstance(parent, yaml.SequenceNode):
            step = str(index)
        if step is not None and index is not None:
            self.path.append(step)
        try:
            if len(self.path) > MAX_DEPTH:
                raise self._refuse(self.path, f"nested deeper than {MAX_DEPTH} levels")
            if self.check_event(yaml.AliasEvent):
                self.aliases += 1
                if self.aliases > MAX_YAML_ALIASES:
                    raise self._refuse(self.path, f"more than {MAX_YAML_ALIASES} aliases (*name)")
            node = super().compose_node(parent, index)
            if isinstance(parent, yaml.MappingNode) and index is None and node.tag not in (_STR, _MERGE):
                key = shown(node.value, 60) if isinstance(node, yaml.ScalarNode) else f"a {node.id}"
                raise self._refuse(self.path, f"key {key!r} is not a string (quote it)")
            return node
        finally:
            if step is not None and index is not None:
                self.path.pop()

    def compose_document(self):
        node = super().compose_document()
        self._measure(node, list(self.path), {}, set())
        return node

    def _measure(self, node, path: list[str], seen: dict, open_: set) -> tuple[int, int]:
        """(values, levels) under `node` with aliases expanded, each node measured once (aliases share nodes)."""
        if id(node) in open_:
            raise self._refuse(path, "an alias refers to a node that holds it")
        if id(node) not in seen:
            open_.add(id(node))
            if isinstance(node, yaml.MappingNode):
                children = [
                    (f"{shown(k.value, 60)}" if isinstance(k, yaml.ScalarNode) else "?", v) for k, v in node.value
                ]
                children += [("?", k) for k, _ in node.value]
            elif isinstance(node, yaml.SequenceNode):
                children = [(str(i), v) for i, v in enumerate(node.value)]
            else:
                children = []
            values, levels = 1, 0
            for step, child in children:
                if len(path) >= MAX_DEPTH:
                    raise self._refuse(path, f"nested deeper than {MAX_DEPTH} levels (aliases expanded)")
                v, lv = self._measure(child, [*path, step], seen, open_)
                values, levels = values + v, max(levels, lv + 1)
                if values > MAX_YAML_VALUES:
                    raise self._refuse(path, f"more than {MAX_YAML_VALUES} values once its aliases are expanded")
            open_.discard(id(node))
            seen[id(node)] = (values, levels)
        values, levels = seen[id(node)]
        if len(path) + levels > MAX_DEPTH:
            raise self._refuse(path, f"nested deeper than {MAX_DEPTH} levels (aliases expanded)")
        return values, levels


def _load_yaml(text: str, where: str, invalid: str, root: tuple[str, ...] = ()) -> Any:
    """`text` read by `_BoundedLoader` (key paths start at `root`); a ConfigError starting with `where` (a refusal)
    or `invalid` (a yaml error)."""
    try:
        loader = _BoundedLoader(text, where, root)  # its reader refuses a control character at once
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        raise ConfigError(f"{invalid} ({_yaml_problem(e)})") from None


def read_yaml(path: str | Path) -> dict:
    """The yaml file's mapping of keys ({} for an empty file); a ConfigError naming the file when it cannot be.
    Read through gcc.inputs (a regular file of at most its cap) and `_BoundedLoader`."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"{p}: config file not found")
    if p.is_dir():
        raise ConfigError(f"{p}: is a folder, expected a yaml config file")
    try:
        text = read_text(p, "yaml")
    except BadInput as e:
        raise ConfigError(f"config file {e}") from None
    tree = _load_yaml(text, str(p), f"{p}: not valid yaml")
    if tree is None:
        return {}
    if not isinstance(tree, dict):
        raise ConfigError(f"{p}: expected a mapping of keys (key: value lines), got a yaml {type(tree).__name__}")
    return tree


def parse_override(ov: str) -> tuple[str, Any]:
    """`dotted.key=value` -> (key, the value read as yaml, as in the file)."""
    said = repr(shown(ov, 120))  # how a message quotes it: a long override is cut
    if "=" not in ov:
        raise ConfigError(f"override {said}: expected dotted.key=value")
    key, raw = ov.split("=", 1)
    key = key.strip()
    if not all(key.split(".")):
        raise ConfigError(f"override {said}: empty key name (expected dotted.key=value)")
    invalid = f"override {said}: the value {shown(raw, 120)!r} is not valid yaml"
    return key, _load_yaml(raw, f"override {said}", invalid, tuple(key.split(".")))


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


DAY_S = 86400.0
STEPS = 10**9
# The range of every field that sizes work (steps, clips, batches, processes, seconds), lowest first: a value
# outside is refused before anything is built, naming the field and the range. An exclusive lower bound (a
# duration that must not be 0) is written as the bound and `True`.
BOUNDS: dict[str, tuple[float, float, str] | tuple[float, float, str, bool]] = {
    "global_batch": (1, 1 << 16, ""),
    "micro_batch": (1, 4096, ""),
    "grad_accum": (0, 1 << 16, ""),  # 0 = derived
    "max_steps": (1, STEPS, ""),
    "checkpoint_every": (1, STEPS, ""),
    "keep_checkpoints": (1, 1000, ""),
    "export_every": (0, STEPS, ""),
    "val_every": (0, STEPS, ""),
    "val_n": (0, 100_000, ""),
    "val_batch": (1, 4096, ""),
    "sample_every": (0, 1_000_000, ""),
    "sample_n": (0, 1000, ""),
    "sample_steps": (1, 1000, ""),
    "keep_samples": (0, 1_000_000, ""),
    "console_log_every": (0, STEPS, ""),  # 0 = no progress lines
    "optim.warmup_steps": (0, STEPS, ""),
    "inject_nonfinite_step": (0, STEPS, ""),
    "inject_nonfinite_rank": (0, 1 << 16, ""),
    "inject_stall_step": (0, STEPS, ""),
    "inject_stall_rank": (0, 1 << 16, ""),
    "inject_stop_after_commit_step": (0, STEPS, ""),
    "data.num_workers": (0, 256, ""),
    "data.num_canonical_nodes": (1, 1 << 16, ""),
    "dist_timeout": (0, 7 * DAY_S, " seconds", True),
    "preemption_grace_s": (0, DAY_S, " seconds", True),
    "stall_timeout_s": (0, 7 * DAY_S, " seconds"),  # 0 = off
    "stall_floor_s": (0, 7 * DAY_S, " seconds", True),
}
MAX_VAL_TIMESTEPS = 1000
MAX_CACHE_LIMIT = 1 << 50  # data.cache_limit: a PiB
# the config's paths: local, or s3:// URLs (data.path, checkpoint_dir), never with credentials in them
PATH_KEYS = (
    "run_dir",
    "checkpoint_dir",
    "data.path",
    "data.cache_dir",
    "model.model_dir",
    "model.init_ckpt",
    "model.legacy_zero_ckpt",
    "model.vae_path",
)


def _num(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def _check_bounds(cfg: TrainConfig) -> None:
    for key, (low, high, unit, *exclusive) in BOUNDS.items():
        value = _get(cfg, key)
        if value <= low if exclusive else value < low:
            lowest = f"> {_num(low)}" if exclusive else f">= {_num(low)}"
            raise ConfigError(f"{key}: must be {lowest}{unit} and at most {_num(high)}{unit}, got {value}")
        if value > high:
            lowest = f"> {_num(low)}" if exclusive else f">= {_num(low)}"
            raise ConfigError(f"{key}: must be at most {_num(high)}{unit} (and {lowest}), got {value}")


def validate(cfg: TrainConfig) -> None:
    for key in PATH_KEYS:
        problem = storage.userinfo_problem(_get(cfg, key))
        if problem:
            raise ConfigError(f"{key}: {problem}")
    for key, allowed in CHOICES.items():
        if _get(cfg, key) not in allowed:
            raise ConfigError(f"{key}: must be one of {allowed}, got {_get(cfg, key)!r}")
    _check_bounds(cfg)
    for key in ("data.text_dropout", "data.cond_dropout", "data.mask_p", "data.max_frame_coverage"):
        if not 0.0 <= _get(cfg, key) <= 1.0:
            raise ConfigError(f"{key}: must be in [0, 1], got {_get(cfg, key)}")
    if cfg.checkpoint_dir and not re.fullmatch(r"s3://[^/]+/.*[^/].*", cfg.checkpoint_dir):
        raise ConfigError(
            f"checkpoint_dir: must be empty (checkpoints in <run_dir>/checkpoints) or "
            f"s3://bucket/prefix, got {cfg.checkpoint_dir!r}"
        )
    if cfg.global_batch % cfg.micro_batch:
        raise ConfigError(f"global_batch={cfg.global_batch} is not a multiple of micro_batch={cfg.micro_batch}")
    if not 0 <= cfg.seed < 2**32:  # Composer's and Streaming's range
        raise ConfigError(f"seed: must be in [0, 2**32), got {cfg.seed}")
    for key in ("optim.lr", "optim.cond_lr", "optim.weight_decay", "optim.grad_clip"):
        if _get(cfg, key) < 0:
            raise ConfigError(f"{key}: must be >= 0, got {_get(cfg, key)}")
    if cfg.data.limit is not None and not 1 <= cfg.data.limit <= STEPS:
        raise ConfigError(
            f"data.limit: must be a positive number of train clips, or null (the whole train split), at most "
            f"{STEPS}, got {cfg.data.limit}"
        )
    if cfg.data.cache_limit:
        from streaming.base.util import bytes_to_int  # heavy (streaming pulls torch, ~3 s): config stays light

        try:
            limit = bytes_to_int(cfg.data.cache_limit)
        except ValueError:
            limit = 0
        if not 0 < limit <= MAX_CACHE_LIMIT:
            raise ConfigError(
                f"data.cache_limit: must be empty (no limit) or a size such as 200gb, at most 1pb, "
                f"got {cfg.data.cache_limit!r}"
            )
    bad_t = [t for t in cfg.val_timesteps if _as_float(t) is None or not 0 <= _as_float(t) <= 1000]
    if bad_t or (not cfg.val_timesteps and cfg.val_every and cfg.val_n) or len(cfg.val_timesteps) > MAX_VAL_TIMESTEPS:
        raise ConfigError(
            f"val_timesteps: must be a non-empty list of at most {MAX_VAL_TIMESTEPS} numbers in [0, 1000] "
            f"(scheduler timesteps), got {shown(cfg.val_timesteps)}"
        )
    _check_model_overrides(cfg.model.overrides)
    if cfg.loggers:  # last: it imports Composer (seconds)
        from gcc.training.loggers import check_logger_options  # heavy: imports Composer; config stays light

        problems = check_logger_options(cfg.loggers)
        if problems:
            raise ConfigError("; ".join(problems))


# the largest value of each model.overrides field (each of a tuple's items): the model is built, on the meta device,
# before the run starts; the 5B model has 30 layers of width 3072
# the largest model the overrides may describe (the 5B teacher ten times over): each field within its bound can
# still multiply into a model no machine holds
MAX_PARAMS = 50e9
MODEL_BOUNDS = {
    "num_layers": 256,
    "dim": 1 << 16,
    "ffn_dim": 1 << 18,
    "num_heads": 1024,
    "in_dim": 4096,
    "out_dim": 4096,
    "patch_size": 64,
    "text_dim": 1 << 16,
    "freq_dim": 1 << 16,
    "cond_hidden": 1 << 16,
    "eps": 1.0,
}


def _check_model_overrides(overrides: dict) -> None:
    """model.overrides: fields of the preset's DiTConfig (docs/model.md), each of its type and within MODEL_BOUNDS;
    the vocab is model.vocab."""
    if not overrides:
        return
    from gcc.model.dit import DiTConfig  # heavy (torch, diffsynth): config stays light without overrides

    hints = typing.get_type_hints(DiTConfig)
    for k, v in overrides.items():
        if k not in hints or k == "vocab":
            hint = " (set model.vocab instead)" if k == "vocab" else ""
            raise ConfigError(
                f"model.overrides.{shown(k, 60)}: not a field of the model config{hint}; "
                f"known: {sorted(set(hints) - {'vocab'})}"
            )
        typ, high = hints[k], MODEL_BOUNDS.get(k, 1 << 16)
        if typing.get_origin(typ) is tuple:
            ok = (
                isinstance(v, list)
                and len(v) == len(typing.get_args(typ))
                and all(isinstance(x, int) and not isinstance(x, bool) and 0 < x <= high for x in v)
            )
            want = f"a list of {len(typing.get_args(typ))} integers in [1, {_num(high)}]"
        elif typ is float:
            ok = _as_float(v) is not None and math.isfinite(_as_float(v)) and 0 < _as_float(v) <= high
            want = f"a number in (0, {_num(high)}]"
        else:
            ok = isinstance(v, int) and not isinstance(v, bool) and 0 < v <= high
            want = f"a positive integer, at most {_num(high)}"
        if not ok:
            raise ConfigError(f"model.overrides.{k}: expected {want}, got {shown(repr(v))}")


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
    from gcc.model.dit import build_gc_dit, count_params, load_wan_base
    from gcc.model.export import load_gc_weights

    try:
        dit = build_gc_dit(cfg.model.preset, device="meta", vocab=cfg.model.vocab, **cfg.model.overrides)
        n = count_params(dit)  # on the meta device: counted, never allocated
        if n > MAX_PARAMS:
            raise ValueError(f"{n / 1e9:.0f} B parameters, more than gcc trains ({MAX_PARAMS / 1e9:.0f} B)")
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
