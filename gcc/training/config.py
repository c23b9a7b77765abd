"""The typed run configuration: yaml + dotted `key=value` overrides -> `TrainConfig`, validated before any work.

Defaults are the v10 run (docs/design.md §8). Each field declares its role once, next to it (`setting`): whether it
is part of the run's identity (`launch.run_signature`), whether it goes into every export's metadata
(`builders.export_metadata`), its range (`Range`) and whether it is a path; its allowed values are its `Literal`
type. The signature, the export metadata, `CHOICES`, `BOUNDS` and `PATH_KEYS` are derived from these (`ROLES`).
Unknown keys, wrong types, values outside their range (`BOUNDS`, `MODEL_BOUNDS`), a path with credentials in it
and inconsistent batch settings raise `ConfigError` naming the key; `gcc/train.py` turns that into a one-line
message and exit code 2. The yaml and the overrides are read by a bounded loader (`_BoundedLoader`;
docs/training.md, "Trust and safety"). The key names are Composer's and llm-foundry's (`max_duration` as a Composer
time, `optimizer:`, `scheduler:`, `algorithms:`); the names gcc used before are read as them (`RENAMED`), and
`describe` lists every key (`train.py --print_config`; docs/training.md, "Config keys").
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import logging
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
from gcc.inputs import MAX_DEPTH, MAX_INT_DIGITS, read_text, shown
from gcc.redact import redact, redact_text
from gcc.workers import PREEMPTION_GRACE_S

logger = logging.getLogger(__name__)


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
    and read by validate, launch.run_signature, builders.export_metadata and `describe` (`train.py --print_config`).

    identity: True when its value is part of the run signature under its own dotted key (docs/design.md §9.3: a
    relaunch that changes it is refused, exit 3); a signature key (str): signed under that key, which is the key
    runs recorded before the field was renamed (`optimizer.lr` is signed as `optim.lr`), or, for a path, the key
    under which launch.run_signature records what identifies the thing it names (a digest, a resolved path)
    rather than its value; False when it may change on resume. sign_default: False for an identity field added
    after runs were recorded: its default (the behaviour those runs had) stays out of the signature, so their
    run.json still matches, and any other value is signed.
    exported: True when its value goes into every export's metadata (docs/design.md §9.9) under its own name; a
    metadata key (str): under that key; False: not exported. A path goes in with credentials masked.
    bounds: the range of a number (None: any value of its type). path: a local path or s3:// URL, refused with
    credentials in it (gcc.storage.userinfo_problem). units: a Composer time (an int counts batches, "500ba" is
    the same; "3ep" is allowed where "ep" is among the units and kept as given until the launch resolves it).
    doc: its meaning in one line (`describe`)."""

    identity: bool | str
    exported: bool | str
    bounds: Range | None = None
    path: bool = False
    sign_default: bool = True
    units: tuple[str, ...] = ()
    doc: str = ""


ROLE = "gcc.role"  # the key of a field's Role in its dataclass field metadata


def role(
    *,
    identity: bool | str,
    exported: bool | str,
    bounds: Range | None = None,
    path: bool = False,
    sign_default: bool = True,
    units: tuple[str, ...] = (),
    doc: str = "",
) -> dict:
    """A config field's metadata holding its Role, for a field with a default factory:
    `x: list = field(default_factory=list, metadata=role(identity=..., exported=...))`."""
    return {ROLE: Role(identity, exported, bounds, path, sign_default, units, doc)}


def setting(default: Any, **declared: Any) -> Any:
    """A config field with its default and its role (`Role`): `x: int = setting(0, identity=..., exported=...)`."""
    return field(default=default, metadata=role(**declared))


BATCHES = ("ba",)  # a Composer time counted in batches: 500 or "500ba"


@dataclass
class ModelConfig:
    preset: Literal["ti2v-5b", "wide", "tiny", "tiny-p1"] = setting(
        "ti2v-5b",
        identity=True,
        exported=False,
        doc="gcc.model.dit preset: ti2v-5b | wide (its width, 2 blocks) | tiny | tiny-p1 (tiny, one token per latent cell)",
    )
    overrides: dict = field(
        default_factory=dict,
        metadata=role(
            identity=True,
            exported=False,
            doc="preset fields to change (e.g. tiny's text_dim; docs/model.md); signed as sorted JSON",
        ),
    )
    # signed by the sha256 of its index file (so a copy elsewhere is the same run)
    model_dir: str = setting(
        "",
        identity="model.base_weights",
        exported=True,
        path=True,
        doc='base Wan2.2-TI2V-5B weights (sharded safetensors as published); "" = random init (tiny/CPU only)',
    )
    # signed by its digest; its export metadata entry is the lineage's (builders.export_metadata)
    init_ckpt: str = setting(
        "",
        identity="model.init_ckpt",
        exported=False,
        path=True,
        doc="warm start: a gc25d export (same vocab) or a plain Wan export",
    )
    # signed by its real path
    legacy_zero_ckpt: str = setting(
        "",
        identity="model.legacy_zero_ckpt",
        exported=False,
        path=True,
        doc="warm start from a DeepSpeed ZeRO checkpoint folder (needs the `legacy` extra)",
    )
    vae_path: str = setting(
        "",
        identity=False,
        exported=False,
        path=True,
        doc='the Wan2.2 VAE (Wan2.2_VAE.pth) that decodes the samples during training on real data; "" = a latent '
        "preview (gcc-synth data has its own decoder)",
    )
    vocab: Literal["parts", "ids"] = setting(
        "parts", identity=True, exported=True, doc="the semantic condition's vocabulary: parts | ids"
    )
    first_frame_cond: bool = setting(
        True, identity=True, exported=True, doc="condition on the clean first frame (image-to-video)"
    )
    activation_checkpointing: Literal["block", "selective", "none"] = setting(
        "block",
        identity=False,
        exported=False,
        doc="per DiT block: block (recompute it whole in backward) | selective (keep its attention outputs, "
        "recompute the rest) | none (docs/performance.md, Memory)",
    )
    compile: bool = setting(
        False,
        identity=False,
        exported=False,
        doc="torch.compile each DiT block (after activation checkpointing, before FSDP2; docs/performance.md, "
        "Compiled blocks)",
    )
    attention: Literal["auto", "flash3", "sdpa_cudnn", "sdpa_flash", "sdpa_efficient", "sdpa_math"] = setting(
        "auto",
        identity=False,
        exported=False,
        doc="the attention kernel: auto (FlashAttention 3 if installed on a Hopper GPU, else PyTorch SDPA's backends "
        "in order flash, cudnn, efficient, math) | flash3 | sdpa_<backend> first (docs/performance.md, Attention)",
    )


@dataclass
class DataConfig:
    # signed by its manifest's sha256 (the data's content: a copy elsewhere is the same run)
    path: str = setting(
        "data/gc25d_v10_mds",
        identity="data.manifest_sha256",
        exported="data_root",
        path=True,
        doc="a convert_data output: a local folder or s3://bucket/prefix",
    )
    cache_dir: str = setting(
        "", identity=False, exported=False, path=True, doc='per-node shard cache; "" = <run_dir>/cache/node<N>'
    )
    num_workers: int = setting(
        4, identity=False, exported=False, bounds=Range(0, 256), doc="loader worker processes per rank"
    )
    text_dropout: float = setting(
        0.1, identity=True, exported=True, bounds=FRACTION, doc="probability of training a clip without its text"
    )
    cond_dropout: float = setting(
        0.05,
        identity=True,
        exported=True,
        bounds=FRACTION,
        doc="probability of training a clip without its semantic condition",
    )
    mask_p: float = setting(
        0.5, identity=True, exported=True, bounds=FRACTION, doc="probability of masking the condition's regions"
    )
    mask_calibration: Literal["frame0", "cap"] = setting(
        "frame0",
        identity=True,
        exported=False,
        doc="frame0 | cap (bounds the per-frame coverage by max_frame_coverage)",
    )
    max_frame_coverage: float = setting(
        0.4, identity=True, exported=False, bounds=FRACTION, doc="the largest share of a frame a mask covers (cap)"
    )
    num_canonical_nodes: int = setting(
        1,
        identity=True,
        exported=False,
        bounds=Range(1, 1 << 16),
        doc="Streaming's; fixed so the sample order is the same for any number of nodes/GPUs",
    )
    cache_limit: str = setting(
        "", identity=False, exported=False, doc='Streaming cache_limit (e.g. "200gb"); "" = unlimited'
    )
    limit: int | None = setting(
        None,
        identity=True,
        exported="data_limit",
        bounds=Range(
            1, STEPS, said=f"a positive number of train clips, or null (the whole train split), at most {STEPS}"
        ),
        doc="N: train on a seeded subset of N train clips (a smoke run on the real data); null = the whole train split",
    )


@dataclass
class OptimizerConfig:
    """Composer's `optimizer:` section: AdamW with two parameter groups, the DiT at `lr` and gc_sem_cond at
    `cond_lr` (gcc/model/optim.py). Signed under the keys runs recorded before the section had this name."""

    name: Literal["adamw"] = setting(
        "adamw", identity=True, sign_default=False, exported=False, doc="adamw (the only one gcc trains with)"
    )
    lr: float = setting(
        1e-5, identity="optim.lr", exported=True, bounds=NON_NEGATIVE, doc="learning rate of the DiT's parameters"
    )
    cond_lr: float = setting(
        1e-4,
        identity="optim.cond_lr",
        exported=True,
        bounds=NON_NEGATIVE,
        doc="learning rate of the gc_sem_cond parameters (the condition path, zero-initialised)",
    )
    weight_decay: float = setting(
        0.01, identity="optim.weight_decay", exported=True, bounds=NON_NEGATIVE, doc="AdamW's weight decay"
    )
    betas: list = field(
        default_factory=lambda: [0.9, 0.999],
        metadata=role(identity="optim.betas", exported=False, doc="AdamW's betas: two numbers in [0, 1)"),
    )
    eps: float = setting(
        1e-8,
        identity=True,
        sign_default=False,
        exported=False,
        bounds=Range(0.0, 1.0, exclusive=True),
        doc="AdamW's eps",
    )


# the schedulers whose rate depends on max_duration (they decay to lr * alpha_f at its end): their horizon is part
# of the run's identity (launch.run_signature `SCHEDULE_HORIZON`); constant_with_warmup's run may be extended freely
DECAYING = ("cosine_with_warmup", "linear_decay_with_warmup")


@dataclass
class SchedulerConfig:
    """Composer's `scheduler:` section: one of Composer's schedulers by name, over max_duration (gcc/model/optim.py;
    docs/training.md, "Config keys")."""

    name: Literal["constant_with_warmup", "cosine_with_warmup", "linear_decay_with_warmup"] = setting(
        "constant_with_warmup",
        identity=True,
        sign_default=False,
        exported=False,
        doc="constant_with_warmup | cosine_with_warmup | linear_decay_with_warmup (Composer's schedulers)",
    )
    t_warmup: int = setting(
        500,
        identity="optim.warmup_steps",
        exported="warmup_steps",
        bounds=Range(0, STEPS),
        units=BATCHES,
        doc='linear warmup from 0 to the rate, in batches (500 or "500ba"); step s runs at min(1, s / t_warmup)',
    )
    alpha_f: float = setting(
        0.0,
        identity=True,
        sign_default=False,
        exported=False,
        bounds=FRACTION,
        doc="the rate's multiplier at max_duration (cosine and linear decay; constant ignores it)",
    )


@dataclass
class GradientClippingConfig:
    clipping_type: Literal["norm"] = setting(
        "norm", identity=True, sign_default=False, exported=False, doc="norm: the global gradient norm"
    )
    clipping_threshold: float = setting(
        1.0, identity="optim.grad_clip", exported=False, bounds=NON_NEGATIVE, doc="max global gradient norm; 0 = off"
    )


@dataclass
class EmaConfig:
    """`algorithms: {ema: {...}}`: an exponential moving average of the trainable weights, Composer's EMA keys
    (docs/training.md, "EMA"). Not part of the run's identity: it never changes the raw training, so it may be turned
    on, off or retuned at a resume."""

    # the steps over which an old weight's share halves; smoothing = 2 ** (-update_interval / half_life)
    half_life: int = setting(
        1000, identity=False, exported=False, bounds=Range(1, STEPS), units=BATCHES, doc='"1000ba" or 1000'
    )
    update_interval: int = setting(
        1, identity=False, exported=False, bounds=Range(1, STEPS), units=BATCHES, doc="average every this many steps"
    )
    ema_start: int = setting(
        0,
        identity=False,
        exported=False,
        bounds=Range(0, STEPS),
        units=BATCHES,
        doc="until this step the EMA is the weights themselves; it averages from the next step on",
    )


@dataclass
class AlgorithmsConfig:
    """Composer's `algorithms:` section."""

    gradient_clipping: GradientClippingConfig = field(default_factory=GradientClippingConfig)
    # null (the default) = off; `ema: {}` = on with Composer's defaults
    ema: EmaConfig | None = None


@dataclass
class FsdpConfig:
    # docs/performance.md has both
    reshard_after_forward: bool = setting(
        True,
        identity=False,
        exported=False,
        doc="true: ZeRO-3-like (a block's parameters are gathered again for its backward: ~8 GB less per GPU at 5B, "
        "one more all-gather per block); false: ZeRO-2-like (they stay gathered from forward to backward)",
    )


@dataclass
class FaultsConfig:
    """Fault injection for gcc's own tests (docs/training.md, "Fault injection"), never for a real run; each off by
    default, none part of the run's identity."""

    nonfinite_step: int = setting(
        0, identity=False, exported=False, bounds=Range(0, STEPS), doc="make the loss NaN at this step (0 = off)"
    )
    nonfinite_rank: int = setting(
        0, identity=False, exported=False, bounds=WORKERS, doc="the rank whose loss nonfinite_step makes NaN"
    )
    stall_step: int = setting(
        0,
        identity=False,
        exported=False,
        bounds=Range(0, STEPS),
        doc="the loader never delivers this step's batch (0 = off)",
    )
    stall_rank: int = setting(
        0, identity=False, exported=False, bounds=WORKERS, doc="the rank whose loader stall_step stalls"
    )
    sigterm_at_val0: bool = setting(
        False,
        identity=False,
        exported=False,
        doc="the last rank sends itself SIGTERM as the step-0 validation starts",
    )
    # the test kills it, or claims the prefix and sends SIGCONT
    stop_after_commit_step: int = setting(
        0,
        identity=False,
        exported=False,
        bounds=Range(0, STEPS),
        doc="right after committing this step's checkpoint to save_folder, rank 0 sends SIGSTOP to the launch's "
        "process group (0 = off)",
    )
    sigterm_at_step: int = setting(
        0,
        identity=False,
        exported=False,
        bounds=Range(0, STEPS),
        doc="the last rank sends SIGTERM to the launch's process group as this step starts (0 = off)",
    )
    sigint_at_step: int = setting(
        0,
        identity=False,
        exported=False,
        bounds=Range(0, STEPS),
        doc="the last rank sends SIGINT (a Ctrl-C) to the launch's process group as this step starts (0 = off)",
    )
    native_crash_step: int = setting(
        0,
        identity=False,
        exported=False,
        bounds=Range(0, STEPS),
        doc="the loader segfaults making this step's batch (in the rank with data.num_workers=0; 0 = off)",
    )
    native_crash_rank: int = setting(
        0, identity=False, exported=False, bounds=WORKERS, doc="the rank whose loader native_crash_step crashes"
    )
    # the test kills the launch while that write is in flight
    hold_async_write_step: int = setting(
        0,
        identity=False,
        exported=False,
        bounds=Range(0, STEPS),
        doc="the background write of this step's checkpoint never completes: it waits, before its rename (after "
        "DCP's .metadata), until the launch is killed (0 = off)",
    )


@dataclass
class TrainConfig:
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
    save_interval: int = setting(
        1000,
        identity=False,
        exported=False,
        bounds=Range(1, STEPS),
        units=BATCHES,
        doc='a checkpoint every this many batches (1000 or "1000ba"; why 1000: docs/design.md §8)',
    )
    save_num_checkpoints_to_keep: int = setting(
        2,
        identity=False,
        exported=False,
        bounds=Range(1, 1000),
        doc="checkpoints kept, locally and in save_folder, across restarts",
    )
    save_async: bool = setting(
        True,
        identity=False,
        exported=False,
        doc="periodic checkpoints written in the background from a copy in host memory (one copy of the rank's "
        'checkpoint); false: training waits for each write (docs/training.md, "Checkpoints in the background")',
    )
    save_folder: str = setting(
        "",
        identity=False,
        exported=False,
        path=True,
        doc='"" = checkpoints only in <run_dir>/checkpoints; s3://bucket/prefix = also there, committed after each '
        'save; a start with an empty run folder resumes from it (docs/training.md, "Checkpoints on object storage")',
    )
    export_every: int = setting(
        1000,
        identity=False,
        exported=False,
        bounds=Range(0, STEPS),
        doc="a step-N.safetensors export every this many steps (and the last); 0 = the last only",
    )
    eval_interval: int = setting(
        500,
        identity=False,
        exported=False,
        bounds=Range(0, STEPS),
        units=BATCHES,
        doc='validate every this many batches (500 or "500ba") and at the last step; 0 = never',
    )
    eval_first: bool = setting(
        True,
        identity=False,
        exported=False,
        doc="validate the starting weights before the first step (a step-0 row, the run's baseline); a resume "
        "never repeats it",
    )
    val_n: int = setting(
        16, identity=False, exported=False, bounds=Range(0, 100_000), doc="fixed val clips, round-robin over val runs"
    )
    val_timesteps: list = field(
        default_factory=lambda: [200, 500, 800],
        metadata=role(identity=False, exported=False, doc="the validation's timesteps, in [0, 1000]"),
    )
    val_batch: int = setting(1, identity=False, exported=False, bounds=Range(1, 4096), doc="clips per val batch")
    # logged as videos and a contact sheet to every logger and <run_dir>/samples/step-N/
    sample_every: int = setting(
        2,
        identity=False,
        exported=False,
        bounds=Range(0, 1_000_000),
        doc="samples during training (docs/sample.md) at every this-many-th validation and the last step's; 0 = off",
    )
    sample_n: int = setting(
        2,
        identity=False,
        exported=False,
        bounds=Range(0, 1000),
        doc="fixed val clips sampled with their semantic condition and without it, from the same noise",
    )
    sample_steps: int = setting(
        20,
        identity=False,
        exported=False,
        bounds=Range(1, 1000),
        doc="denoising steps of those samples (FlowMatchScheduler, Wan's schedule, shift 5)",
    )
    sample_cfg: float = setting(
        1.0,
        identity=False,
        exported=False,
        doc="semantic guidance of the conditioned sample (gcc-sample's --sem_cfg; 1 = none)",
    )
    keep_samples: int = setting(
        0, identity=False, exported=False, bounds=Range(0, 1_000_000), doc="samples/step-N folders kept (0 = all)"
    )
    autoresume: bool = setting(
        True, identity=False, exported=False, doc="a relaunch resumes from the run's last checkpoint"
    )
    allow_existing: bool = setting(
        False,
        identity=False,
        exported=False,
        doc="a launch with nothing to resume in a run folder that holds exports, log rows or checkpoints is refused "
        "(exit 3); true starts over there, moving what the run wrote to <run_dir>/replaced/<time>/",
    )
    progress_bar: bool = setting(
        True,
        identity=False,
        exported=False,
        doc="allows Composer's progress bar: it draws only when stdout is a terminal, never into train.log",
    )
    console_log_interval: int = setting(
        10,
        identity=False,
        exported=False,
        bounds=Range(0, STEPS),
        doc="a progress line every this many steps (and val lines after each validation), unless the progress bar "
        "is on and stdout is a terminal; 0 = never",
    )
    loggers: dict = field(
        default_factory=lambda: {"tensorboard": {}},
        metadata=role(
            identity=False,
            exported=False,
            doc="logger name -> options of Composer's class: tensorboard, wandb, mlflow (CSV always; docs/training.md, "
            '"Loggers")',
        ),
    )
    callbacks: dict = field(
        default_factory=dict,
        metadata=role(
            identity=False,
            exported=False,
            doc="Composer callback name -> its class's arguments: speed_monitor, memory_monitor, lr_monitor "
            '(docs/training.md, "Callbacks"); none by default',
        ),
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = setting(
        "INFO", identity=False, exported=False, doc="what rank 0 prints: DEBUG | INFO | WARNING | ERROR"
    )
    dist_timeout: float = setting(
        600.0,
        identity=False,
        exported=False,
        bounds=Range(0, 7 * DAY_S, " seconds", True),
        doc="the process group's timeout, in seconds",
    )
    lean_engine: bool = setting(
        True,
        identity=False,
        exported=False,
        doc="Composer's event engine without visits to callbacks that do nothing on an event (~5 ms a step less; "
        "docs/performance.md); false runs Composer's own",
    )
    # keep it below the scheduler's kill timeout
    preemption_grace_s: float = setting(
        PREEMPTION_GRACE_S,
        identity=False,
        exported=False,
        bounds=Range(0, DAY_S, " seconds", True),
        doc="after SIGTERM/SIGUSR1/Ctrl-C a rank must checkpoint and exit within this, else it writes every thread's "
        "stack to <run_dir>/stacks/ and exits 5",
    )
    stall_timeout_s: float = setting(
        1800.0,
        identity=False,
        exported=False,
        bounds=Range(0, 7 * DAY_S, " seconds"),
        doc="a rank that completes no step within this (0 = off), or, once 10 steps are timed, within "
        "max(stall_floor_s, 20 × the median step time), writes its stacks and exits 5",
    )
    stall_floor_s: float = setting(
        300.0,
        identity=False,
        exported=False,
        bounds=Range(0, 7 * DAY_S, " seconds", True),
        doc="the stall deadline's floor once steps are timed",
    )
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
    return max_duration if isinstance(max_duration, int) else _count(max_duration) * steps_per_epoch


def _section(typ: Any) -> type | None:
    """The section (dataclass) a field of type `typ` holds: `Section`, or `Section | None` (an optional section,
    off while null: algorithms.ema); None for a value."""
    if typing.get_origin(typ) in (typing.Union, types.UnionType):
        typ = next((t for t in typing.get_args(typ) if t is not type(None)), None)
    return typ if isinstance(typ, type) and dataclasses.is_dataclass(typ) else None


def _fields(cls: type, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field, Any]]:
    """(dotted key, field, type) of every field of `cls` that holds a value, sections walked, in declaration order."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        section = _section(hints[f.name])
        if section is not None:
            yield from _fields(section, f"{prefix}{f.name}.")
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
# the config's paths: local, or s3:// URLs (data.path, save_folder), never with credentials in them
PATH_KEYS = tuple(key for key, role in ROLES.items() if role.path)


# signature keys that no field declares (launch.run_signature computes them), by what the config calls them
SIGNED_ELSEWHERE = {"scheduler.horizon": "max_duration (in batches: the decaying schedule's horizon)"}


def signature_key_name(signed: str) -> str:
    """A run signature's key as the config names it now: its field's dotted key (`optim.lr` -> `optimizer.lr`,
    signed under the name it had when runs were first recorded), with what is signed when that is not the value
    (`data.manifest_sha256` -> `data.path (its manifest's sha256)`); a key no field declares, as it is."""
    if signed in SIGNED_ELSEWHERE:
        return SIGNED_ELSEWHERE[signed]
    for key, role in ROLES.items():
        if role.identity == signed and key != signed:
            computed = signed.rsplit(".", 1)[-1]
            said = computed.replace("_", " ")
            return key if computed == key.rsplit(".", 1)[-1] or signed in RENAMED else f"{key} ({said})"
    return signed


def signed_values(cfg: TrainConfig) -> dict[str, Any]:
    """The run signature's entries that are a field's value by signature key (its dotted key, or the key its
    declaration names), a mapping as sorted JSON, a field that is not signed at its default (`sign_default`) only
    when it differs from it; launch.run_signature adds the entries it computes for the paths."""
    signed = {}
    for key, f, _ in _fields(TrainConfig):
        role = f.metadata[ROLE]
        if role.identity is False or role.path:
            continue
        value = _get(cfg, key)
        if not role.sign_default and value == _default(f):
            continue
        signed[key if role.identity is True else role.identity] = (
            json.dumps(value, sort_keys=True) if isinstance(value, dict) else value
        )
    return signed


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


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
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"unknown key(s): {', '.join(prefix + k + did_you_mean(prefix + k) for k in unknown)}")
    kwargs = {}
    for k, v in data.items():
        typ, section = hints[k], _section(hints[k])
        if section is not None:
            optional = section is not typ
            kwargs[k] = None if optional and v is None else _build(section, v, f"{prefix}{k}.")
        elif fields[k].metadata[ROLE].units:
            kwargs[k] = _time(prefix + k, v, fields[k].metadata[ROLE].units)
        else:
            kwargs[k] = _check_type(prefix + k, v, typ)
    return cls(**kwargs)


_TIME = re.compile(r"([0-9]{1,18})\s*([a-z]+)")  # 18 digits: beyond any bound, short of Python's int limit
COMPOSER_UNITS = ("ba", "ep", "sp", "tok", "dur", "sec", "iter")  # what a Composer time string may end with


def _time(key: str, value: Any, units: tuple[str, ...]) -> int | str:
    """A Composer time as gcc keeps it: batches as an int (500 and "500ba" alike), epochs as "Nep" (resolved at
    launch: `resolve_duration`). A ConfigError naming the key for anything else, or a unit that cannot hold here."""
    wanted = 'a whole number of batches (500 or "500ba")' + (' or of epochs ("3ep")' if "ep" in units else "")
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    match = _TIME.fullmatch(value.strip().lower()) if isinstance(value, str) else None
    if match is None:
        raise ConfigError(f"{key}: expected {wanted}, got {shown(repr(value))}")
    count, unit = int(match[1]), match[2]
    if unit not in units:
        why = "a Composer unit gcc does not count in here" if unit in COMPOSER_UNITS else "not a Composer unit"
        raise ConfigError(
            f"{key}: the unit {unit!r} of {shown(repr(value))} cannot be used here ({why}); expected {wanted}"
        )
    return count if unit == "ba" else f"{count}{unit}"


def _count(value: int | str) -> int:
    """The number of a kept time: its batches, or its epochs ("3ep" -> 3)."""
    return value if isinstance(value, int) else int(value[: -len("ep")])


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

    def construct_yaml_int(self, node):
        """An integer of at most MAX_INT_DIGITS digits (gcc.inputs.parse_int's rule); a longer one is refused
        naming its place (PyYAML's int() would fail past 4300 digits with a ValueError)."""
        digits = sum(c.isalnum() for c in str(node.value))
        if digits > MAX_INT_DIGITS:
            mark = node.start_mark
            raise ConfigError(
                f"{self.where}: line {mark.line + 1}, column {mark.column + 1}: an integer of {digits} digits "
                f"(at most {MAX_INT_DIGITS}): {shown(node.value, 40)}"
            )
        return super().construct_yaml_int(node)


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)


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
    for name, new in [(k, k) for k, _, _ in _fields(TrainConfig)] + list(RENAMED.items()):
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
    cfg = _build(TrainConfig, tree)
    validate(cfg)
    return cfg


def _get(cfg, dotted: str):
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
        problem = storage.userinfo_problem(_get(cfg, key))
        if problem:
            raise ConfigError(f"{key}: {problem}")
    for key, allowed in CHOICES.items():
        value = _get(cfg, key)  # None: in an optional section that is off
        if value is not None and value not in allowed:
            raise ConfigError(f"{key}: must be one of {allowed}, got {value!r}")
    for key, bounds in BOUNDS.items():
        value = _get(cfg, key)  # None: a field that may be null (data.limit), or in an optional section that is off
        if ROLES[key].units and value is not None:
            value = _count(value)
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
    if len(betas) != 2 or not all((b := _as_float(x)) is not None and 0 <= b < 1 for x in betas):
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
    bad_t = [t for t in cfg.val_timesteps if (x := _as_float(t)) is None or not 0 <= x <= 1000]
    if (
        bad_t
        or (not cfg.val_timesteps and cfg.eval_interval and cfg.val_n)
        or len(cfg.val_timesteps) > MAX_VAL_TIMESTEPS
    ):
        raise ConfigError(
            f"val_timesteps: must be a non-empty list of at most {MAX_VAL_TIMESTEPS} numbers in [0, 1000] "
            f"(scheduler timesteps), got {shown(cfg.val_timesteps)}"
        )
    _check_model_overrides(cfg.model.overrides)
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
    """Whether the run logs samples: it validates (eval_interval, val_n) and sample_every, sample_n are on."""
    return cfg.eval_interval > 0 and cfg.val_n > 0 and cfg.sample_every > 0 and cfg.sample_n > 0


def check_inputs(cfg: TrainConfig) -> None:
    """What the config names outside itself, checked before any work (every rank does it, before the process
    group): the folders it writes (run_dir, data.cache_dir) must be folders; an s3:// data.path or save_folder
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
    for key in ("data.path", "save_folder"):
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


def _type_name(typ: Any, role: Role) -> str:
    """How `describe` states a field's type: its choices, a time's units, `X | null`."""
    if role.units:
        return " | ".join({"ba": 'batches (N or "Nba")', "ep": 'epochs ("Nep")'}[u] for u in role.units)
    if typing.get_origin(typ) is Literal:
        return " | ".join(str(a) for a in typing.get_args(typ))
    if typing.get_origin(typ) in (typing.Union, types.UnionType):
        return " | ".join("null" if t is type(None) else t.__name__ for t in typing.get_args(typ))
    return getattr(typ, "__name__", str(typ))


TEST_ONLY = "faults."  # the keys of gcc's own tests (fault injection): never a real run's


def describe(cfg: TrainConfig | None = None, test_only: bool = False) -> list[str]:
    """`train.py --print_config`: every key (dotted) with its default and type, then its meaning, from the
    declarations; with `cfg` (a yaml and overrides, resolved), the key's value first, credentials masked. Then the
    old key names (RENAMED). The test-only `faults.*` keys only with `test_only` (`--print_config --all`)."""
    values = redact(dataclasses.asdict(cfg)) if cfg is not None else None
    lines = []
    for key, f, typ in _fields(TrainConfig):
        role = f.metadata[ROLE]
        if key.startswith(TEST_ONLY) and not test_only:
            continue
        default = json.dumps(_default(f))
        head = f"{key}: {default}"
        if values is not None:
            value = values
            for p in key.split("."):
                value = value[p] if value is not None else None  # None: an optional section that is off
            head = f"{key}: {json.dumps(value)}  (default {default})"
        lines += [f"{head}  [{_type_name(typ, role)}]", f"    {role.doc}"]
    lines.append("")
    if not test_only:
        lines.append(f"({TEST_ONLY}*: fault injection for gcc's own tests, not shown; --print_config --all shows them)")
    lines.append("old key names, still read as the new ones (with a warning):")
    lines += [f"  {old} -> {new}" for old, new in RENAMED.items()]
    return lines


def to_dict(cfg: TrainConfig) -> dict:
    return dataclasses.asdict(cfg)
