"""Composer callbacks of the gc25d run, one concept per module."""
from gcc.callbacks.checkpoint_rotation import CheckpointRotation
from gcc.callbacks.export import Export
from gcc.callbacks.grad_clip import GradClip
from gcc.callbacks.nonfinite import NonFiniteGuard, NonFiniteLoss
from gcc.callbacks.preemption import Preemption
from gcc.callbacks.run_files import RunFiles
from gcc.callbacks.train_stats import TRAIN_COLUMNS, TrainStats
from gcc.callbacks.validation import VAL_COLUMNS, ValidationLog

__all__ = ["CheckpointRotation", "Export", "GradClip", "NonFiniteGuard", "NonFiniteLoss", "Preemption", "RunFiles",
           "TRAIN_COLUMNS", "TrainStats", "VAL_COLUMNS", "ValidationLog"]
