"""The typed run configuration: yaml + dotted `key=value` overrides -> `TrainConfig`, validated before any work.

Each component declares its section beside its code (gcc/model/config.py, gcc/data/config.py,
gcc/training/sections.py; the top-level run keys here, `RunSettings`), each field with its role (`setting`,
gcc/settings.py): whether it is part of the run's identity (`run_start.run_signature`), whether it goes into every
export's metadata (`builders.export_metadata`), its range and whether it is a path; its allowed values are its
`Literal` type. This module loads them and keeps what spans sections: the derived tables (`ROLES`, `CHOICES`,
`BOUNDS`, `PATH_KEYS`), the old key names (`RENAMED`) and the checks across fields (`validate`). Unknown keys, wrong
types, values outside their range, a path with credentials in it and inconsistent batch settings raise
`ConfigError` naming the key; `gcc/train.py` turns that into a one-line message and exit code 2. The yaml and the
overrides are read by a bounded loader (gcc/yaml_reader.py; docs/training.md, "Trust and safety"). The key names
are Composer's and llm-foundry's; `train.py --print_config` lists every key (gcc/training/print_config.py).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import logging
import re
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gcc import storage
from gcc.data.config import DataConfig
from gcc.inputs import shown
from gcc.model.config import FsdpConfig, ModelConfig, OptimizerConfig, check_model_overrides
from gcc.redact import redact_text
from gcc.settings import (
    ROLE,
    STEPS,
    ConfigError,
    Range,
    as_float,
    build_section,
    config_fields,
    roles,
    setting,
    time_count,
)
from gcc.training.sections import (  # noqa: F401  (DECAYING: read through this module)
    DECAYING,
    AlgorithmsConfig,
    CheckpointSettings,
    ConsoleSettings,
    EmaConfig,
    EvalSettings,
    FaultsConfig,
    GradientClippingConfig,
    HealthSettings,
    SchedulerConfig,
)
from gcc.yaml_reader import load_yaml, read_yaml

logger = logging.getLogger(__name__)


@dataclass
class RunSettings:
    """The run itself (top-level keys): its folder, its seed, the batch and its split, its length, precision and
    parallelism."""

    run_dir: str = setting(
        "runs/sft_v10", identity=False, exported=False, path=True, doc="the run folder (docs/training.md)"
    )
    seed: int = setting(
        0,
        identity=True,
        exported=True,
        bounds=Range(0, 2**32 - 1, said="in [0, 2**32)"),  # Composer's and Streaming's range
        doc="seeds everything random (weights, data order, noise)",
    )
    global_train_batch_size: int = setting(
        16,
        identity=False,
        exported=False,
        bounds=Range(1, 1 << 16),
        doc="clips per optimizer step over all ranks; a change on resume continues at the next epoch",
    )
    device_train_microbatch_size: int = setting(
        1, identity=False, exported=False, bounds=Range(1, 4096), doc="clips per forward/backward on a rank"
    )
    grad_accum: int = setting(
        0,
        identity=False,
        exported=False,
        bounds=Range(0, 1 << 16),
        doc="0 = derived: global_train_batch_size / (world_size × device_train_microbatch_size); else must match",
    )
    # kept as given ("3ep") until the launch resolves it (`resolve_duration`); the code counts `max_steps`
    max_duration: int | str = setting(
        20000,
        identity=False,
        exported=False,
        bounds=Range(1, STEPS),
        units=("ba", "ep"),
        doc='the run\'s length: batches (20000 or "20000ba") or epochs of the train split ("3ep"); may be raised '
        "on resume",
    )
    precision: Literal["amp_bf16", "fp32"] = setting(
        "amp_bf16", identity=True, exported=False, doc="amp_bf16 (GPU) | fp32 (CPU)"
    )
    parallelism: Literal["fsdp", "ddp"] = setting(
        "fsdp",
        identity=True,
        exported=False,
        doc="fsdp (Composer's FSDP2, sharded checkpoints) | ddp; their checkpoints differ in format",
    )


@dataclass
class TrainConfig(HealthSettings, ConsoleSettings, EvalSettings, CheckpointSettings, RunSettings):
    """The whole config: the top-level keys (the bases, in `describe`'s order: the run, its checkpoints,
    validation, console and health) and one section per component."""

    fsdp: FsdpConfig = field(default_factory=FsdpConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    algorithms: AlgorithmsConfig = field(default_factory=AlgorithmsConfig)
    faults: FaultsConfig = field(default_factory=FaultsConfig)  # for gcc's own tests only

    @property
    def max_steps(self) -> int:
        """The run's length in optimizer steps (batches), the one count the code uses: `max_duration`, whose
        epochs ("3ep") the launch resolves to batches first (`resolve_duration`)."""
        if isinstance(self.max_duration, str):
            raise RuntimeError(f"max_duration {self.max_duration!r} is not resolved to batches (resolve_duration)")
        return self.max_duration

    def per_rank_batch(self, world_size: int) -> int:
        return self.device_train_microbatch_size * self.accumulation(world_size)

    def accumulation(self, world_size: int) -> int:
        micro = self.device_train_microbatch_size
        per_rank, rem = divmod(self.global_train_batch_size, world_size * micro)
        if rem or per_rank < 1:
            raise ConfigError(
                f"global_train_batch_size={self.global_train_batch_size} is not a multiple of world_size × "
                f"device_train_microbatch_size = {world_size} × {micro}"
            )
        if self.grad_accum and self.grad_accum != per_rank:
            raise ConfigError(
                f"grad_accum={self.grad_accum} disagrees with global_train_batch_size / (world_size × "
                f"device_train_microbatch_size) = {self.global_train_batch_size} / ({world_size} × {micro}) = "
                f"{per_rank}"
            )
        return per_rank


def resolve_duration(cfg: TrainConfig, steps_per_epoch: int) -> None:
    """An epoch `max_duration` ("3ep") becomes batches at launch: epochs × the batches of an epoch of the train
    split at this launch's global batch (launch.steps_per_epoch); a batch count stays as it is."""
    cfg.max_duration = duration_in_batches(cfg.max_duration, steps_per_epoch)


def duration_in_batches(max_duration: int | str, steps_per_epoch: int) -> int:
    """`max_duration` in batches: a batch count as it is, epochs ("3ep") × `steps_per_epoch`."""
    return max_duration if isinstance(max_duration, int) else time_count(max_duration) * steps_per_epoch


ROLES = roles(TrainConfig)
# a field's allowed values: its Literal type's
CHOICES = {key: typing.get_args(t) for key, _, t in config_fields(TrainConfig) if typing.get_origin(t) is Literal}
# the range of every field that sizes work (steps, clips, batches, processes, seconds) and of every rate and
# fraction: a value outside is refused before anything is built, naming the field and the range
BOUNDS = {key: role.bounds for key, role in ROLES.items() if role.bounds is not None}
# the config's paths: local, or s3:// URLs (data.path, save_folder), never with credentials in them
PATH_KEYS = tuple(key for key, role in ROLES.items() if role.path)


# signature keys that no field declares (run_start.run_signature computes them), by what the config calls them
SIGNED_ELSEWHERE = {"scheduler.horizon": "max_duration (in batches: the decaying schedule's horizon)"}


def signature_key_name(signed: str) -> str:
    """A run signature's key as the config names it now: its field's dotted key (`optim.lr` -> `optimizer.lr`,
    signed under the name it had when runs were first recorded), with what is signed when that is not the value
    (`data.manifest_sha256` -> `data.path (its manifest's sha256)`); a key no field declares, as it is."""
    if signed in SIGNED_ELSEWHERE:
        return SIGNED_ELSEWHERE[signed]
    for key, declared in ROLES.items():
        if declared.identity == signed and key != signed:
            computed = signed.rsplit(".", 1)[-1]
            said = computed.replace("_", " ")
            return key if computed == key.rsplit(".", 1)[-1] or signed in RENAMED else f"{key} ({said})"
    return signed


def signed_values(cfg: TrainConfig) -> dict[str, Any]:
    """The run signature's entries that are a field's value by signature key (its dotted key, or the key its
    declaration names), a mapping as sorted JSON, a field that is not signed at its default (`sign_default`) only
    when it differs from it; run_start.run_signature adds the entries it computes for the paths."""
    signed = {}
    for key, f, _ in config_fields(TrainConfig):
        role = f.metadata[ROLE]
        if role.identity is False or role.path:
            continue
        value = value_at(cfg, key)
        if not role.sign_default and value == default_of(f):
            continue
        signed[key if role.identity is True else role.identity] = (
            json.dumps(value, sort_keys=True) if isinstance(value, dict) else value
        )
    return signed


def default_of(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def exported_values(cfg: TrainConfig) -> dict[str, Any]:
    """The export metadata's entries that are a field's value (exported) by metadata key, a path with its
    credentials masked; builders.export_metadata adds the run's own (step, data name, lineage)."""
    exported = {}
    for key, declared in ROLES.items():
        if declared.exported:
            name = key.rsplit(".", 1)[-1] if declared.exported is True else declared.exported
            value = value_at(cfg, key)
            exported[name] = redact_text(value) if declared.path else value
    return exported


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{dotted}: {p} is not a section")
    node[parts[-1]] = value


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
    return key, load_yaml(raw, f"override {said}", invalid, tuple(key.split(".")))


# the keys gcc read before it took Composer's and llm-foundry's names: old -> new (docs/training.md, "Config keys").
# An old key is read as its new one, with one warning; a yaml (or a command line) that gives both is refused.
RENAMED = {
    "max_steps": "max_duration",
    "val_every": "eval_interval",
    "val_at_start": "eval_first",
    "checkpoint_every": "save_interval",
    "checkpoint_dir": "save_folder",
    "keep_checkpoints": "save_num_checkpoints_to_keep",
    "global_batch": "global_train_batch_size",
    "micro_batch": "device_train_microbatch_size",
    "console_log_every": "console_log_interval",
    "optim.lr": "optimizer.lr",
    "optim.cond_lr": "optimizer.cond_lr",
    "optim.weight_decay": "optimizer.weight_decay",
    "optim.warmup_steps": "scheduler.t_warmup",  # a number of batches, as before; the scheduler's default name
    "optim.grad_clip": "algorithms.gradient_clipping.clipping_threshold",
    "model.grad_ckpt": "model.activation_checkpointing",  # true -> block, false -> none (RENAMED_VALUES)
}
# an old key whose values were other values: old value -> new value (any other is kept, and checked as the new key's)
RENAMED_VALUES = {"model.grad_ckpt": {True: "block", False: "none"}}
# the sections gone (optim:): every key of theirs moved to another section
_OLD_SECTIONS = {
    old.split(".")[0] for old, new in RENAMED.items() if "." in old and old.split(".")[0] != new.split(".")[0]
}


def did_you_mean(key: str) -> str:
    """` (did you mean X?)` for an unknown dotted key: the known keys closest to it (at most 3, closest first), by
    the spelling of its last part (`max_duraton`), also in another section (`lr` -> `optimizer.lr`), by its words'
    initials (`optimizer.learning_rate` -> `optimizer.lr`) or as part of a longer name (`batch_size`), the old names
    (RENAMED) among them, each given as the key to use; "" when none is close."""
    section, _, leaf = key.rpartition(".")
    best: dict[str, tuple[float, str]] = {}  # the key to use -> (score, what to say)
    for name, new in [(k, k) for k, _, _ in config_fields(TrainConfig)] + list(RENAMED.items()):
        there, _, last = name.rpartition(".")
        score = max(
            difflib.SequenceMatcher(None, leaf, last).ratio(),
            0.85 if len(leaf) > 2 and last in (_initials(leaf), leaf.replace("_", "")) else 0.0,
            0.85 if len(last) > 2 and leaf in (_initials(last), last.replace("_", "")) else 0.0,
            0.8 if min(len(leaf), len(last)) > 3 and (leaf in last or last in leaf) else 0.0,
        ) + (0.05 if there == section else -0.05)
        said = new if name == new else f"{new} ({name} is its old name)"
        if score >= 0.75 and score > best.get(new, (0.0, ""))[0]:
            best[new] = (score, said)
    picked = [said for _, said in sorted(best.values(), key=lambda x: -x[0])][:3]
    return f" (did you mean {' or '.join(picked)}?)" if picked else ""


def _initials(name: str) -> str:
    return "".join(w[0] for w in name.split("_") if w)


def _pop_dotted(tree: dict, dotted: str) -> tuple[bool, Any]:
    """(found, value) of `dotted` in `tree`, removed from it; a section it empties goes too."""
    *path, leaf = dotted.split(".")
    nodes = [tree]
    for p in path:
        node = nodes[-1].get(p)
        if not isinstance(node, dict):
            return False, None
        nodes.append(node)
    if leaf not in nodes[-1]:
        return False, None
    value = nodes[-1].pop(leaf)
    for parent, p, node in zip(reversed(nodes[:-1]), reversed(path), reversed(nodes[1:]), strict=True):
        if not node:
            del parent[p]
    return True, value


def _has_dotted(tree: dict, dotted: str) -> bool:
    node: Any = tree
    for p in dotted.split("."):
        if not isinstance(node, dict) or p not in node:
            return False
        node = node[p]
    return True


def _renamed(tree: dict, where: str) -> list[str]:
    """`tree` with every old key (RENAMED) moved to its new one, in place; the old keys it held. A ConfigError
    naming both when `tree` gives an old key and its new one."""
    found = []
    for old, new in RENAMED.items():
        there, value = _pop_dotted(tree, old)
        if not there:
            continue
        if _has_dotted(tree, new):
            raise ConfigError(f"{where}: {old} and {new} are both given; {old} is the old name of {new}: keep {new}")
        _set_dotted(tree, new, _renamed_value(old, value))
        found.append(old)
    return found


def _renamed_value(old: str, value: Any) -> Any:
    table = RENAMED_VALUES.get(old, {})
    return table[value] if isinstance(value, bool) and value in table else value


def _override_leaves(key: str, value: Any) -> list[tuple[str, Any]]:
    """An override as (dotted key, value) pairs: one, or each key of an old section given whole (`optim={lr: 1}`)."""
    if key in _OLD_SECTIONS and isinstance(value, dict):
        return [(f"{key}.{k}", v) for k, v in value.items()]
    return [(key, value)]


def load_config(yaml_path: str | Path | None, overrides: Sequence[str] = ()) -> TrainConfig:
    """The yaml, then each `dotted.key=value` override over it, old keys read as their new ones (RENAMED, one
    warning per old key), built and validated."""
    tree: dict = read_yaml(yaml_path) if yaml_path is not None else {}
    old_keys = _renamed(tree, str(yaml_path))
    given: dict[str, str] = {}  # new key -> the name the command line gave it by
    for ov in overrides:
        for key, value in _override_leaves(*parse_override(ov)):
            new = RENAMED.get(key, key)
            if given.get(new, key) != key:  # one old name per key: the other is `new`
                old = key if key != new else given[new]
                raise ConfigError(
                    f"overrides: {old} and {new} are both given; {old} is the old name of {new}: keep {new}"
                )
            given[new] = key
            if new != key:
                old_keys.append(key)
            _set_dotted(tree, new, _renamed_value(key, value))
    for section in _OLD_SECTIONS & set(tree):  # what is left of an old section: keys it never had
        left = tree[section]
        unknown = ", ".join(f"{section}.{k}" for k in left) if isinstance(left, dict) else section
        moved = ", ".join(new for old, new in RENAMED.items() if old.startswith(f"{section}."))
        raise ConfigError(f"unknown key(s): {unknown} (the keys of {section}: are now {moved})")
    for old in dict.fromkeys(old_keys):  # once per key, in the order met
        logger.warning(f'{old}: an old key name, read as {RENAMED[old]}; rename it (docs/training.md, "Config keys")')
    cfg = build_section(TrainConfig, tree, hint=did_you_mean)
    validate(cfg)
    return cfg


def value_at(cfg, dotted: str):
    """The value at `dotted`; None inside an optional section that is off (null)."""
    for p in dotted.split("."):
        if cfg is None:
            return None
        cfg = getattr(cfg, p)
    return cfg


MAX_VAL_TIMESTEPS = 1000
MAX_CACHE_LIMIT = 1 << 50  # data.cache_limit: a PiB


def validate(cfg: TrainConfig) -> None:
    """What each field declares (its paths, choices and range: ROLES), then what relates fields to each other."""
    for key in PATH_KEYS:
        problem = storage.userinfo_problem(value_at(cfg, key))
        if problem:
            raise ConfigError(f"{key}: {problem}")
    for key, allowed in CHOICES.items():
        value = value_at(cfg, key)  # None: in an optional section that is off
        if value is not None and value not in allowed:
            raise ConfigError(f"{key}: must be one of {allowed}, got {value!r}")
    for key, bounds in BOUNDS.items():
        value = value_at(cfg, key)  # None: a field that may be null (data.limit), or in an optional section that is off
        if ROLES[key].units and value is not None:
            value = time_count(value)
        problem = bounds.problem(value) if value is not None else None
        if problem:
            raise ConfigError(f"{key}: {problem}")
    if cfg.save_folder and not re.fullmatch(r"s3://[^/]+/.*[^/].*", cfg.save_folder):
        raise ConfigError(
            f"save_folder: must be empty (checkpoints in <run_dir>/checkpoints) or "
            f"s3://bucket/prefix, got {cfg.save_folder!r}"
        )
    if cfg.global_train_batch_size % cfg.device_train_microbatch_size:
        raise ConfigError(
            f"global_train_batch_size={cfg.global_train_batch_size} is not a multiple of "
            f"device_train_microbatch_size={cfg.device_train_microbatch_size}"
        )
    betas = cfg.optimizer.betas
    if len(betas) != 2 or not all((b := as_float(x)) is not None and 0 <= b < 1 for x in betas):
        raise ConfigError(f"optimizer.betas: expected two numbers in [0, 1), got {shown(betas)}")
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
    bad_t = [t for t in cfg.val_timesteps if (x := as_float(t)) is None or not 0 <= x <= 1000]
    if (
        bad_t
        or (not cfg.val_timesteps and cfg.eval_interval and cfg.val_n)
        or len(cfg.val_timesteps) > MAX_VAL_TIMESTEPS
    ):
        raise ConfigError(
            f"val_timesteps: must be a non-empty list of at most {MAX_VAL_TIMESTEPS} numbers in [0, 1000] "
            f"(scheduler timesteps), got {shown(cfg.val_timesteps)}"
        )
    check_model_overrides(cfg.model.overrides)
    if cfg.callbacks:  # last, with the loggers: it imports Composer (seconds)
        from gcc.training.composer_callbacks import check_callback_options

        problems = check_callback_options(cfg.callbacks)
        if problems:
            raise ConfigError("; ".join(problems))
    if cfg.loggers:  # last: it imports Composer (seconds)
        from gcc.training.loggers import check_logger_options  # heavy: imports Composer; config stays light

        problems = check_logger_options(cfg.loggers)
        if problems:
            raise ConfigError("; ".join(problems))


# the largest value of each model.overrides field (each of a tuple's items): the model is built, on the meta device,
# before the run starts; the 5B model has 30 layers of width 3072
# the largest model the overrides may describe (the 5B teacher ten times over): each field within its bound can
# still multiply into a model no machine holds
def samples_during_training(cfg: TrainConfig) -> bool:
    """Whether the run logs samples: it validates (eval_interval, val_n) and sample_every, sample_n are on."""
    return cfg.eval_interval > 0 and cfg.val_n > 0 and cfg.sample_every > 0 and cfg.sample_n > 0


def to_dict(cfg: TrainConfig) -> dict:
    return dataclasses.asdict(cfg)
