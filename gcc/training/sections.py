"""The training loop's config sections: `scheduler:` (gcc/training/schedule.py), `algorithms:` (gradient clipping
and EMA: gcc/training/callbacks/) and `faults:` (the fault injection of gcc's own tests). Each field's role and range
with it (gcc/settings.py); gcc/training/config.py loads and checks them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from gcc.settings import BATCHES, DAY_S, FRACTION, NON_NEGATIVE, STEPS, WORKERS, Range, role, setting
from gcc.workers import PREEMPTION_GRACE_S

# the schedulers whose rate depends on max_duration (they decay to lr * alpha_f at its end): their horizon is part
# of the run's identity (run_start.run_signature `SCHEDULE_HORIZON`); constant_with_warmup's run may be extended freely
DECAYING = ("cosine_with_warmup", "linear_decay_with_warmup")
# Composer's schedulers gcc builds (gcc/training/schedule.py `SCHEDULERS`)
SchedulerName = Literal["constant_with_warmup", "cosine_with_warmup", "linear_decay_with_warmup"]


@dataclass
class SchedulerConfig:
    """Composer's `scheduler:` section: one of Composer's schedulers by name, over max_duration (gcc/model/optim.py;
    docs/training.md, "Config keys")."""

    name: SchedulerName = setting(  # noqa: RUF009  (a Literal alias: immutable, as the other fields)
        "constant_with_warmup",
        identity=True,
        sign_default=False,
        exported=False,
        doc="Composer's scheduler by that name; cosine and linear decay run to max_duration",
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
class CheckpointSettings:
    """The run folder's checkpoints and exports (top-level keys): when a checkpoint and an export are written, how
    many are kept, where else they go, and what a relaunch does with them (gcc/training/run_folder.py,
    gcc/training/callbacks/)."""

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


@dataclass
class EvalSettings:
    """Validation and the samples during training (top-level keys): gcc/training/evaluators.py, gcc/sampling/,
    gcc/training/callbacks/samples.py."""

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


@dataclass
class ConsoleSettings:
    """What a run prints and logs (top-level keys): gcc/training/console.py, gcc/training/loggers.py."""

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


@dataclass
class HealthSettings:
    """How a run guards its processes (top-level keys): the process group's timeout, the event engine, the
    preemption grace and the stall deadline (gcc/training/callbacks/preemption.py, gcc/training/watchdog.py)."""

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
