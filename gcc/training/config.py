"""The typed run configuration: yaml + dotted `key=value` overrides -> `TrainConfig`, validated before any work.

Defaults are the v10 run (docs/design.md §8). Each field declares its role once, next to it (`setting`): whether it
is part of the run's identity (`launch.run_signature`), whether it goes into every export's metadata
(`builders.export_metadata`), its range (`Range`) and whether it is a path; its allowed values are its `Literal`
type. The signature, the export metadata, `CHOICES`, `BOUNDS` and `PATH_KEYS` are derived from these (`ROLES`).
Unknown keys, wrong types, values outside their range (`BOUNDS`, `MODEL_BOUNDS`), a path with credentials in it
and inconsistent batch settings raise `ConfigError` naming the key; `gcc/train.py` turns that into a one-line
message and exit code 2. The yaml and the overrides are read by a bounded loader (`_BoundedLoader`;
docs/training.md, "Trust and safety").
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import types
import typing
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from safetensors import SafetensorError

from gcc import exit_codes, storage
from gcc.cli import folder_problem, input_file_problem
from gcc.errors import BadInput
from gcc.inputs import MAX_DEPTH, read_text, shown
from gcc.redact import redact_text
from gcc.workers import PREEMPTION_GRACE_S


class ConfigError(ValueError):
    exit_code = exit_codes.CONFIG


DAY_S = 86400.0
STEPS = 10**9


def _num(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


@dataclass(frozen=True)
class Range:
    """The values a number may take: `low` to `high` (None: no upper bound), `exclusive`: above `low`, never at it
    (a duration that must not be 0). `unit` as a message says it; `said`: how a message states the range where
    "must be >= low and at most high" would not (a fraction: "in [0, 1]")."""

    low: float
    high: float | None = None
    unit: str = ""
    exclusive: bool = False
    said: str = ""

    def problem(self, value: float) -> str | None:
        """Why `value` is outside the range (None when inside)."""
        low_ok = self.low < value if self.exclusive else self.low <= value
        if low_ok and (self.high is None or value <= self.high):
            return None
        if self.said:
            return f"must be {self.said}, got {value}"
        lowest = f"> {_num(self.low)}" if self.exclusive else f">= {_num(self.low)}"
        if self.high is None:
            return f"must be {lowest}{self.unit}, got {value}"
        if not low_ok:
            return f"must be {lowest}{self.unit} and at most {_num(self.high)}{self.unit}, got {value}"
        return f"must be at most {_num(self.high)}{self.unit} (and {lowest}), got {value}"


FRACTION = Range(0.0, 1.0, said="in [0, 1]")  # a probability or a share
NON_NEGATIVE = Range(0.0)
WORKERS = Range(0, 1 << 16)  # a rank or a count of ranks


@dataclass(frozen=True)
class Role:
    """What a config field is for, declared next to it with `setting` (`role` for a field with a default factory)
    and read by validate, launch.run_signature and builders.export_metadata.

    identity: True when its value is part of the run signature (docs/design.md §9.3: a relaunch that changes it is
    refused, exit 3); a signature key (str) when launch.run_signature records, under that key, what identifies
    the thing it names (a digest, a resolved path) rather than its value; False when it may change on resume.
    exported: True when its value goes into every export's metadata (docs/design.md §9.9) under its own name; a
    metadata key (str): under that key; False: not exported. A path goes in with credentials masked.
    bounds: the range of a number (None: any value of its type). path: a local path or s3:// URL, refused with
    credentials in it (gcc.storage.userinfo_problem)."""

    identity: bool | str
    exported: bool | str
    bounds: Range | None = None
    path: bool = False


ROLE = "gcc.role"  # the key of a field's Role in its dataclass field metadata


def role(*, identity: bool | str, exported: bool | str, bounds: Range | None = None, path: bool = False) -> dict:
    """A config field's metadata holding its Role, for a field with a default factory:
    `x: list = field(default_factory=list, metadata=role(identity=..., exported=...))`."""
    return {ROLE: Role(identity, exported, bounds, path)}


def setting(
    default: Any, *, identity: bool | str, exported: bool | str, bounds: Range | None = None, path: bool = False
) -> Any:
    """A config field with its default and its role (`Role`): `x: int = setting(0, identity=..., exported=...)`."""
    return field(default=default, metadata=role(identity=identity, exported=exported, bounds=bounds, path=path))


@dataclass
class ModelConfig:
    # gcc.model.dit presets: ti2v-5b | wide (its width, 2 blocks) | tiny | tiny-p1 (tiny, one token per latent cell)
    preset: Literal["ti2v-5b", "wide", "tiny", "tiny-p1"] = setting("ti2v-5b", identity=True, exported=False)
    # preset fields to change (e.g. tiny's text_dim); signed as sorted JSON
    overrides: dict = field(default_factory=dict, metadata=role(identity=True, exported=False))
    # base Wan2.2-TI2V-5B weights (sharded safetensors); "" = random init (tiny/CPU only); signed by the sha256 of
    # its index file (so a copy elsewhere is the same run)
    model_dir: str = setting("", identity="model.base_weights", exported=True, path=True)
    # warm start: a gc25d export (same vocab) or a plain Wan export; signed by its digest. Its export metadata
    # entry is the lineage's (builders.export_metadata)
    init_ckpt: str = setting("", identity="model.init_ckpt", exported=False, path=True)
    # warm start from a DeepSpeed ZeRO checkpoint dir (needs the `legacy` extra); signed by its real path
    legacy_zero_ckpt: str = setting("", identity="model.legacy_zero_ckpt", exported=False, path=True)
    # the Wan2.2 VAE file (Wan2.2_VAE.pth as published) that decodes the samples logged during training on real data;
    # "" = a latent preview (gcc-synth data has its own decoder)
    vae_path: str = setting("", identity=False, exported=False, path=True)
    vocab: Literal["parts", "ids"] = setting("parts", identity=True, exported=True)
    first_frame_cond: bool = setting(True, identity=True, exported=True)
    grad_ckpt: bool = setting(True, identity=False, exported=False)


@dataclass
class DataConfig:
    # a convert_data output: local folder or s3://bucket/prefix; the run is signed by its manifest's sha256 (the
    # data's content: a copy elsewhere is the same run); exported as data_root
    path: str = setting("data/gc25d_v10_mds", identity="data.manifest_sha256", exported="data_root", path=True)
    # per-node shard cache; "" = <run_dir>/cache/node<N>
    cache_dir: str = setting("", identity=False, exported=False, path=True)
    num_workers: int = setting(4, identity=False, exported=False, bounds=Range(0, 256))
    text_dropout: float = setting(0.1, identity=True, exported=True, bounds=FRACTION)
    cond_dropout: float = setting(0.05, identity=True, exported=True, bounds=FRACTION)
    mask_p: float = setting(0.5, identity=True, exported=True, bounds=FRACTION)
    mask_calibration: Literal["frame0", "cap"] = setting("frame0", identity=True, exported=False)
    max_frame_coverage: float = setting(0.4, identity=True, exported=False, bounds=FRACTION)
    # fixed so the sample order is the same for any number of nodes/GPUs
    num_canonical_nodes: int = setting(1, identity=True, exported=False, bounds=Range(1, 1 << 16))
    # Streaming cache_limit (e.g. "200gb"); "" = unlimited
    cache_limit: str = setting("", identity=False, exported=False)
    # N: train on a seeded subset of N train clips (a smoke run on the real data); null = the whole train split
    limit: int | None = setting(
        None,
        identity=True,
        exported=False,
        bounds=Range(
            1, STEPS, said=f"a positive number of train clips, or null (the whole train split), at most {STEPS}"
        ),
    )


@dataclass
class OptimConfig:
    lr: float = setting(1e-5, identity=True, exported=True, bounds=NON_NEGATIVE)
    cond_lr: float = setting(1e-4, identity=True, exported=True, bounds=NON_NEGATIVE)
    weight_decay: float = setting(0.01, identity=True, exported=True, bounds=NON_NEGATIVE)
    warmup_steps: int = setting(500, identity=True, exported=True, bounds=Range(0, STEPS))
    # max global grad norm; 0 = off
    grad_clip: float = setting(1.0, identity=True, exported=False, bounds=NON_NEGATIVE)


@dataclass
class FsdpConfig:
    # False: ZeRO-2-like (a block's gathered parameters stay from its forward to its backward); True: ZeRO-3-like
    # (gathered again in the backward: less memory, one more all-gather per block). docs/performance.md has both.
    reshard_after_forward: bool = setting(False, identity=False, exported=False)


@dataclass
class FaultsConfig:
    """Fault injection for gcc's own tests (docs/training.md, "Fault injection"), never for a real run; each off by
    default, none part of the run's identity."""

    # make the loss NaN at this step (0 = off)...
    nonfinite_step: int = setting(0, identity=False, exported=False, bounds=Range(0, STEPS))
    nonfinite_rank: int = setting(0, identity=False, exported=False, bounds=WORKERS)  # ...on this rank
    # the loader never delivers this step's batch (0 = off)...
    stall_step: int = setting(0, identity=False, exported=False, bounds=Range(0, STEPS))
    stall_rank: int = setting(0, identity=False, exported=False, bounds=WORKERS)  # ...on this rank
    # the last rank sends itself SIGTERM as the step-0 validation starts (a preemption that only that rank sees,
    # during the step-0 validation)
    sigterm_at_val0: bool = setting(False, identity=False, exported=False)
    # right after committing this step's checkpoint to checkpoint_dir, rank 0 sends SIGSTOP to the launch's process
    # group, freezing it at a known point (the test kills it, or claims the prefix and sends SIGCONT); 0 = off
    stop_after_commit_step: int = setting(0, identity=False, exported=False, bounds=Range(0, STEPS))


@dataclass
class TrainConfig:
    run_dir: str = setting("runs/sft_v10", identity=False, exported=False, path=True)
    # Composer's and Streaming's range
    seed: int = setting(0, identity=True, exported=True, bounds=Range(0, 2**32 - 1, said="in [0, 2**32)"))
    # free to change on resume: the run continues at the next epoch (gcc/training/batch_change.py)
    global_batch: int = setting(16, identity=False, exported=False, bounds=Range(1, 1 << 16))
    micro_batch: int = setting(1, identity=False, exported=False, bounds=Range(1, 4096))
    # 0 = derived: global_batch / (world_size × micro_batch); else must match
    grad_accum: int = setting(0, identity=False, exported=False, bounds=Range(0, 1 << 16))
    max_steps: int = setting(20000, identity=False, exported=False, bounds=Range(1, STEPS))
    precision: Literal["amp_bf16", "fp32"] = setting("amp_bf16", identity=True, exported=False)  # GPU | CPU
    # fsdp (Composer's FSDP2, sharded checkpoints) | ddp; DDP and FSDP checkpoints differ in format
    parallelism: Literal["fsdp", "ddp"] = setting("fsdp", identity=True, exported=False)
    # why 1000: docs/design.md §8
    checkpoint_every: int = setting(1000, identity=False, exported=False, bounds=Range(1, STEPS))
    # locally and, with checkpoint_dir, remotely; across restarts
    keep_checkpoints: int = setting(2, identity=False, exported=False, bounds=Range(1, 1000))
    # "" = checkpoints only in <run_dir>/checkpoints; s3://bucket/prefix = also there, committed after each save,
    # and a start with an empty run folder resumes from it (docs/training.md, "Checkpoints on object storage")
    checkpoint_dir: str = setting("", identity=False, exported=False, path=True)
    export_every: int = setting(1000, identity=False, exported=False, bounds=Range(0, STEPS))
    val_every: int = setting(500, identity=False, exported=False, bounds=Range(0, STEPS))
    # validate the starting weights before the first step (a step-0 row, the run's baseline); a resume never repeats it
    val_at_start: bool = setting(True, identity=False, exported=False)
    val_n: int = setting(16, identity=False, exported=False, bounds=Range(0, 100_000))
    val_timesteps: list = field(default_factory=lambda: [200, 500, 800], metadata=role(identity=False, exported=False))
    val_batch: int = setting(1, identity=False, exported=False, bounds=Range(1, 4096))
    # samples during training (docs/sample.md): at every sample_every-th validation (and the last step's), sample_n
    # fixed val clips sampled with their semantic condition and without it, from the same noise; logged as videos and
    # a contact sheet to every logger and <run_dir>/samples/step-N/. 0 = off
    sample_every: int = setting(2, identity=False, exported=False, bounds=Range(0, 1_000_000))
    sample_n: int = setting(2, identity=False, exported=False, bounds=Range(0, 1000))
    # denoising steps (FlowMatchScheduler, Wan's schedule, shift 5)
    sample_steps: int = setting(20, identity=False, exported=False, bounds=Range(1, 1000))
    # semantic guidance of the conditioned variant (gcc-sample's --sem_cfg; 1 = none)
    sample_cfg: float = setting(1.0, identity=False, exported=False)
    # samples/step-N folders kept (0 = all)
    keep_samples: int = setting(0, identity=False, exported=False, bounds=Range(0, 1_000_000))
    autoresume: bool = setting(True, identity=False, exported=False)
    # a launch with nothing to resume in a run folder that holds exports, log rows or checkpoints is refused (exit 3);
    # true starts over there on purpose, moving what the run wrote to <run_dir>/replaced/<time>/
    allow_existing: bool = setting(False, identity=False, exported=False)
    progress_bar: bool = setting(True, identity=False, exported=False)
    # a progress line every this many steps (and val lines after each validation), unless the progress bar is on
    # and stdout is a terminal; 0 = never
    console_log_every: int = setting(10, identity=False, exported=False, bounds=Range(0, STEPS))
    # logger name -> options of Composer's class: tensorboard, wandb, mlflow (gcc/training/loggers.py); CSV always
    loggers: dict = field(default_factory=lambda: {"tensorboard": {}}, metadata=role(identity=False, exported=False))
    # what rank 0 prints
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = setting("INFO", identity=False, exported=False)
    dist_timeout: float = setting(600.0, identity=False, exported=False, bounds=Range(0, 7 * DAY_S, " seconds", True))
    # Composer's event engine without visits to callbacks that do nothing on an event (gcc/compat/composer.py
    # LeanEngine: ~5 ms a step less; docs/performance.md); false runs Composer's own
    lean_engine: bool = setting(True, identity=False, exported=False)
    # after SIGTERM/SIGUSR1 a rank must checkpoint and exit within this; else it writes every thread's stack to
    # <run_dir>/stacks/ and exits 5. Keep it below the scheduler's kill timeout.
    preemption_grace_s: float = setting(
        PREEMPTION_GRACE_S, identity=False, exported=False, bounds=Range(0, DAY_S, " seconds", True)
    )
    # a rank that completes no step within this (model build, warm-up, validation; 0 = off), or, once 10 steps
    # are timed, within max(stall_floor_s, 20 × the median step time), writes its stacks and exits 5
    stall_timeout_s: float = setting(1800.0, identity=False, exported=False, bounds=Range(0, 7 * DAY_S, " seconds"))
    stall_floor_s: float = setting(300.0, identity=False, exported=False, bounds=Range(0, 7 * DAY_S, " seconds", True))
    fsdp: FsdpConfig = field(default_factory=FsdpConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    faults: FaultsConfig = field(default_factory=FaultsConfig)  # for gcc's own tests only

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


def _fields(cls: type, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field, Any]]:
    """(dotted key, field, type) of every field of `cls` that holds a value, sections walked, in declaration order."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            yield from _fields(hints[f.name], f"{prefix}{f.name}.")
        else:
            yield prefix + f.name, f, hints[f.name]


def roles(cls: type) -> dict[str, Role]:
    """The Role of every field of `cls` by dotted key (`data.mask_p`); a TypeError naming a field that declares
    none (each field says what it is for: `setting`)."""
    found = {}
    for key, f, _ in _fields(cls):
        if ROLE not in f.metadata:
            raise TypeError(f"config field {key}: declares no role (declare it with setting(...) or role(...))")
        found[key] = f.metadata[ROLE]
    return found


ROLES = roles(TrainConfig)
# a field's allowed values: its Literal type's
CHOICES = {key: typing.get_args(t) for key, _, t in _fields(TrainConfig) if typing.get_origin(t) is Literal}
# the range of every field that sizes work (steps, clips, batches, processes, seconds) and of every rate and
# fraction: a value outside is refused before anything is built, naming the field and the range
BOUNDS = {key: role.bounds for key, role in ROLES.items() if role.bounds is not None}
# the config's paths: local, or s3:// URLs (data.path, checkpoint_dir), never with credentials in them
PATH_KEYS = tuple(key for key, role in ROLES.items() if role.path)


def signed_values(cfg: TrainConfig) -> dict[str, Any]:
    """The run signature's entries that are a field's value (identity=True) by dotted key, a mapping as sorted JSON;
    launch.run_signature adds the entries it computes."""
    signed = {}
    for key, role in ROLES.items():
        if role.identity is True:
            value = _get(cfg, key)
            signed[key] = json.dumps(value, sort_keys=True) if isinstance(value, dict) else value
    return signed


def exported_values(cfg: TrainConfig) -> dict[str, Any]:
    """The export metadata's entries that are a field's value (exported) by metadata key, a path with its
    credentials masked; builders.export_metadata adds the run's own (step, data name, lineage)."""
    exported = {}
    for key, role in ROLES.items():
        if role.exported:
            name = key.rsplit(".", 1)[-1] if role.exported is True else role.exported
            value = _get(cfg, key)
            exported[name] = redact_text(value) if role.path else value
    return exported


def _check_type(key: str, value: Any, typ: Any) -> Any:
    if typing.get_origin(typ) in (typing.Union, types.UnionType):  # `X | None`: null, or an X
        if value is None:
            return None
        (typ,) = [t for t in typing.get_args(typ) if t is not type(None)]
        try:
            return _check_type(key, value, typ)
        except ConfigError:
            raise ConfigError(f"{key}: expected {typ.__name__} or null, got {type(value).__name__} {value!r}") from None
    if typing.get_origin(typ) is Literal:  # of its values' type here; which values, validate (CHOICES)
        typ = type(typing.get_args(typ)[0])
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


def load_config(yaml_path: str | Path | None, overrides: Sequence[str] = ()) -> TrainConfig:
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


MAX_VAL_TIMESTEPS = 1000
MAX_CACHE_LIMIT = 1 << 50  # data.cache_limit: a PiB


def validate(cfg: TrainConfig) -> None:
    """What each field declares (its paths, choices and range: ROLES), then what relates fields to each other."""
    for key in PATH_KEYS:
        problem = storage.userinfo_problem(_get(cfg, key))
        if problem:
            raise ConfigError(f"{key}: {problem}")
    for key, allowed in CHOICES.items():
        if _get(cfg, key) not in allowed:
            raise ConfigError(f"{key}: must be one of {allowed}, got {_get(cfg, key)!r}")
    for key, bounds in BOUNDS.items():
        value = _get(cfg, key)
        problem = bounds.problem(value) if value is not None else None  # None: a field that may be null (data.limit)
        if problem:
            raise ConfigError(f"{key}: {problem}")
    if cfg.checkpoint_dir and not re.fullmatch(r"s3://[^/]+/.*[^/].*", cfg.checkpoint_dir):
        raise ConfigError(
            f"checkpoint_dir: must be empty (checkpoints in <run_dir>/checkpoints) or "
            f"s3://bucket/prefix, got {cfg.checkpoint_dir!r}"
        )
    if cfg.global_batch % cfg.micro_batch:
        raise ConfigError(f"global_batch={cfg.global_batch} is not a multiple of micro_batch={cfg.micro_batch}")
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
    bad_t = [t for t in cfg.val_timesteps if (x := _as_float(t)) is None or not 0 <= x <= 1000]
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
            ok = (x := _as_float(v)) is not None and math.isfinite(x) and 0 < x <= high
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
