"""Composer callbacks of the gc25d run, one concept per module, and `CALLBACKS`: the run's callbacks by name, in the
order they run.

A callback is added in two places: its module here, and its entry in `CALLBACKS` (a name and a factory that builds it
from the run's `CallbackContext`, or returns None when the config turns it off), at the place its events need.
Composer's own callbacks that the yaml names (`callbacks:`) come from gcc/training/composer_callbacks.py.
`gcc/training/builders.py` `build_callbacks` walks the table; tests/training/callbacks/test_every_callback.py runs
every entry through every Composer event.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from composer.core import Callback

from gcc.training.batch_change import GlobalBatchRecord
from gcc.training.callbacks.console_log import ConsoleLog, console_lines_wanted
from gcc.training.callbacks.ema import Ema, build_ema
from gcc.training.callbacks.export import Export
from gcc.training.callbacks.grad_clip import GradClip
from gcc.training.callbacks.nonfinite import NonFiniteGuard, NonFiniteLoss
from gcc.training.callbacks.preemption import GraceCheck, PreemptedBeforeFirstStep, Preemption
from gcc.training.callbacks.run_files import RunFiles
from gcc.training.callbacks.step_deadline import StepDeadline, writes_at
from gcc.training.callbacks.step_sync import StepSync
from gcc.training.callbacks.train_stats import TRAIN_COLUMNS, TrainStats
from gcc.training.callbacks.validation import VAL_COLUMNS, ValidateAtStart, ValidationLog
from gcc.training.checkpoint.background import CheckpointWrites
from gcc.training.checkpoint.rotation import CheckpointRotation, SaveClock
from gcc.training.checkpoint.upload import CheckpointUpload
from gcc.training.composer_callbacks import COMPOSER_CALLBACKS, build_composer_callback

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

    from gcc.data.text_table import TextTable
    from gcc.training.config import TrainConfig
    from gcc.training.run_start import RunStart
    from gcc.training.watchdog import StallWatchdog


@dataclass
class CallbackContext:
    """What the factories of `CALLBACKS` build from: the run's pieces (gcc/training/builders.py `callback_context`
    makes them) and, by name, the callbacks the table built before (`context["step_sync"]`)."""

    cfg: TrainConfig
    start: RunStart  # its `store`: save_folder's CheckpointStore, or None
    model: Any  # the GcTrainModel
    per_rank_batch: int
    val_loader: DataLoader | None  # None: the run does not validate
    text: TextTable | None
    watchdog: StallWatchdog  # the rank's deadlines (step, preemption grace)
    export_metadata: Callable[[int], dict[str, str]]  # the export metadata of a step
    resolved_config: dict[str, Any]  # what RunFiles writes to config.json
    build_samples: Callable[[], Callback | None]  # the training samples (builders.build_samples), or None: off
    built: dict[str, Callback | None] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Any:
        return self.built[name]  # a KeyError: `name` is not an earlier entry of the table


@dataclass(frozen=True)
class Entry:
    name: str
    build: Callable[[CallbackContext], Callback | None]  # None: off in this run
    after_saver: bool = False  # appended after Composer's CheckpointSaver once the Trainer exists (it sees each save)


def _from_yaml(name: str) -> Callable[[CallbackContext], Callback | None]:
    """The factory of Composer's callback `name`: built when the yaml's `callbacks:` names it."""
    return lambda c: build_composer_callback(c.cfg.callbacks, name)


# Composer runs the callbacks in list order at every event, so this order is the run's: each entry may read the ones
# above it. The after-saver group is last: `run_after_checkpoint_saver` (gcc/compat/composer.py) appends it, in this
# order, after Composer's CheckpointSaver.
CALLBACKS: tuple[Entry, ...] = (
    # in every checkpoint: a resume sees a changed global batch (gcc/training/batch_change.py)
    Entry("global_batch", lambda c: GlobalBatchRecord(c.cfg.global_train_batch_size)),
    # before the saver at BATCH_CHECKPOINT: it times each save for the rotation's log line
    Entry("checkpoint_clock", lambda c: SaveClock()),
    # the step's one reduce; first at AFTER_TRAIN_BATCH: the guard, the stats and the preemption read its totals
    Entry("step_sync", lambda c: StepSync(c.per_rank_batch)),
    # the background checkpoint writer: its flag rides the step's reduce; the step deadline reads when it commits
    Entry(
        "checkpoint_writes",
        lambda c: CheckpointWrites(c["step_sync"], c.cfg.run_dir, c.cfg.save_async, c.cfg.faults.hold_async_write_step),
    ),
    Entry(
        "nonfinite_guard",
        lambda c: NonFiniteGuard(c["step_sync"], c.cfg.faults.nonfinite_step, c.cfg.faults.nonfinite_rank),
    ),
    # clips at the step's reduce, before it reads the sources; its norm rides the reduce
    Entry("grad_clip", lambda c: GradClip(c.cfg.algorithms.gradient_clipping.clipping_threshold, c["step_sync"])),
    Entry("train_stats", lambda c: TrainStats(c["step_sync"], c.start.manifest["splits"]["train"]["clip_ids"])),
    Entry(
        "preemption",
        lambda c: Preemption(
            c.watchdog,
            c.cfg.preemption_grace_s,
            c["step_sync"],
            {c.cfg.faults.sigterm_at_step: signal.SIGTERM, c.cfg.faults.sigint_at_step: signal.SIGINT},
        ),
    ),
    # before the step deadline: it samples at EVAL_END, still under the validation's deadline; a preempted step
    # skips it with its validation
    Entry("samples", lambda c: skipped_when_preempted(c, "training samples", c.build_samples())),
    Entry(
        "step_deadline",
        lambda c: StepDeadline(
            c.watchdog,
            c.cfg.stall_timeout_s,
            c.cfg.stall_floor_s,
            writes_at(c.cfg.max_steps, c.cfg.save_interval, c.cfg.export_every, c["checkpoint_writes"].commit_due),
        ),
    ),
    Entry("validation_log", lambda c: ValidationLog("val")),
    # algorithms.ema: before the export, which writes its averages at the step it updated them
    Entry("ema", lambda c: build_ema(c.cfg, c.model.dit, c.start.resumed_from)),
    Entry(
        "export",
        lambda c: skipped_when_preempted(
            c,
            "export",
            Export(
                c.cfg.run_dir,
                c.model.dit,
                c.cfg.export_every,
                c.cfg.max_steps,
                c.export_metadata,
                c["preemption"],
                c.start.store,
                c.start.launch,
                c["ema"],
            ),
        ),
    ),
    Entry("run_files", lambda c: RunFiles(c.cfg.run_dir, c.resolved_config, c["train_stats"])),
    # after the stats, the preemption and the validation log it prints; train.log gets its lines even under the bar
    Entry(
        "console_log",
        lambda c: (
            ConsoleLog(
                c.cfg.console_log_interval,
                c.cfg.max_steps,
                c["train_stats"],
                c["validation_log"],
                c["preemption"],
                console=console_lines_wanted(c.cfg.console_log_interval, c.cfg.progress_bar),
            )
            if c.cfg.console_log_interval > 0
            else None
        ),
    ),
    # Composer's own callbacks the yaml names in `callbacks:` (gcc/training/composer_callbacks.py); they only log
    *(Entry(name, _from_yaml(name)) for name in COMPOSER_CALLBACKS),
    # a launch that validates (no val loader: no evaluators): the step-0 validation of a launch that starts at step
    # 0 (`eval_first`), or on a resume the one a preemption skipped at its step
    Entry(
        "validate_at_start",
        lambda c: (
            ValidateAtStart(c["preemption"], c.cfg.eval_first and not c.start.resumed, c.cfg.faults.sigterm_at_val0)
            if c.val_loader is not None and (c.cfg.eval_first or c.start.resumed)
            else None
        ),
    ),
    # ---- after Composer's CheckpointSaver ----
    # first: it logs the save's time (its clock's) and keeps `save_num_checkpoints_to_keep` of them
    Entry(
        "checkpoint_rotation",
        lambda c: CheckpointRotation(c.cfg.run_dir, c.cfg.save_num_checkpoints_to_keep, c["checkpoint_clock"]),
        after_saver=True,
    ),
    # with an s3:// save_folder: upload and commit each checkpoint
    Entry(
        "checkpoint_upload",
        lambda c: (
            CheckpointUpload(
                c.start.store,
                c.start.launch,
                c.cfg.run_dir,
                c.cfg.save_num_checkpoints_to_keep,
                c.cfg.faults.stop_after_commit_step,
            )
            if c.start.store is not None
            else None
        ),
        after_saver=True,
    ),
    # once the launch's first checkpoint is saved (and committed): does a preemption's save fit in the grace?
    Entry(
        "grace_check",
        lambda c: GraceCheck(
            c.cfg.preemption_grace_s,
            c.cfg.save_interval,
            c["checkpoint_clock"].seconds,
            c["step_deadline"].times,
            None if c["checkpoint_upload"] is None else c["checkpoint_upload"].seconds,
        ),
        after_saver=True,
    ),
    # last: the step deadline again once every write of the step is done
    Entry("step_deadline_after_save", lambda c: c["step_deadline"].after_save, after_saver=True),
)


def skipped_when_preempted(c: CallbackContext, name: str, callback: Any) -> Any:
    """`callback` (None: off), with its `due(step)` registered as `name` with the run's Preemption: a preempted step
    skips it (gcc/training/callbacks/preemption.py)."""
    if callback is not None:
        c["preemption"].skippable(name, callback.due)
    return callback


def build_all(context: CallbackContext, table: tuple[Entry, ...] = CALLBACKS) -> tuple[list, list]:
    """Every entry of `table` built in its order (into `context.built`, by name); returns the callbacks in Composer's
    order and the after-saver group, without the ones that are off."""
    ordered: list[Any] = []
    after_saver: list[Any] = []
    for entry in table:
        callback = context.built[entry.name] = entry.build(context)
        if callback is not None:
            (after_saver if entry.after_saver else ordered).append(callback)
    return ordered, after_saver


__all__ = [
    "CALLBACKS",
    "TRAIN_COLUMNS",
    "VAL_COLUMNS",
    "CallbackContext",
    "CheckpointRotation",
    "CheckpointUpload",
    "CheckpointWrites",
    "ConsoleLog",
    "Ema",
    "Entry",
    "Export",
    "GraceCheck",
    "GradClip",
    "NonFiniteGuard",
    "NonFiniteLoss",
    "PreemptedBeforeFirstStep",
    "Preemption",
    "RunFiles",
    "StepDeadline",
    "StepSync",
    "TrainStats",
    "ValidateAtStart",
    "ValidationLog",
    "build_all",
]
