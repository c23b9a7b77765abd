"""Composer callbacks of the gc25d run, one concept per module."""

from gcc.train.callbacks.checkpoint_rotation import CheckpointRotation
from gcc.train.callbacks.checkpoint_upload import CheckpointUpload
from gcc.train.callbacks.console_log import ConsoleLog
from gcc.train.callbacks.export import Export
from gcc.train.callbacks.grad_clip import GradClip
from gcc.train.callbacks.nonfinite import NonFiniteGuard, NonFiniteLoss
from gcc.train.callbacks.preemption import PreemptedBeforeFirstStep, Preemption
from gcc.train.callbacks.run_files import RunFiles
from gcc.train.callbacks.step_deadline import StepDeadline
from gcc.train.callbacks.step_sync import StepSync
from gcc.train.callbacks.train_stats import TRAIN_COLUMNS, TrainStats
from gcc.train.callbacks.validation import VAL_COLUMNS, ValidateAtStart, ValidationLog

__all__ = [
    "TRAIN_COLUMNS",
    "VAL_COLUMNS",
    "CheckpointRotation",
    "CheckpointUpload",
    "ConsoleLog",
    "Export",
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
]
