"""Composer callbacks of the gc25d run, one concept per module."""

from gcc.training.callbacks.checkpoint_rotation import CheckpointRotation
from gcc.training.callbacks.checkpoint_upload import CheckpointUpload
from gcc.training.callbacks.console_log import ConsoleLog
from gcc.training.callbacks.export import Export
from gcc.training.callbacks.grad_clip import GradClip
from gcc.training.callbacks.nonfinite import NonFiniteGuard, NonFiniteLoss
from gcc.training.callbacks.preemption import PreemptedBeforeFirstStep, Preemption
from gcc.training.callbacks.run_files import RunFiles
from gcc.training.callbacks.step_deadline import StepDeadline
from gcc.training.callbacks.step_sync import StepSync
from gcc.training.callbacks.train_stats import TRAIN_COLUMNS, TrainStats
from gcc.training.callbacks.validation import VAL_COLUMNS, ValidateAtStart, ValidationLog

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
