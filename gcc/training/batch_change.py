"""A global batch that changes on resume (docs/training.md, "A changed global batch").

Streaming's mid-epoch position holds only for the global batch it was written with: its partition of the epoch is
cut into per-rank batches of the old size. With another global batch the run therefore continues at the start
of the next epoch: model, optimizer, schedule and step come from the checkpoint as always; the rest of the
checkpoint's epoch is skipped (logged with its count); Composer's clock moves to that epoch's start with it; the
change is recorded in run.json's lineage (`global_batch_changes`). `max_duration`, the lr schedule, validation and
exports count steps, so they continue as before. Without a change nothing here acts: the resume stays exact.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from composer.core import Callback
from composer.utils import dist

from gcc.compat.composer import forget_saved_rng
from gcc.storage import atomic_write
from gcc.training.run_folder import stored_record

logger = logging.getLogger(__name__)

CHANGES = "global_batch_changes"  # run.json lineage: [{step, old, new}, ...]


class GlobalBatchRecord(Callback):
    """Writes the run's global batch into every checkpoint (Composer saves a callback's state_dict), and holds the
    one the loaded checkpoint was written with (`saved`; None for a checkpoint written before this record)."""

    def __init__(self, global_batch: int):
        self.global_batch = global_batch
        self.saved: int | None = None

    def state_dict(self) -> dict[str, Any]:
        return {"global_batch": self.global_batch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.saved = int(state["global_batch"])


def checkpoint_global_batch(saved: int | None, batch_in_epoch: int, sample_in_epoch: int) -> int | None:
    """The global batch the checkpoint was written with: its record, else (an older checkpoint) the samples of its
    epoch over its steps in that epoch (every step takes the whole global batch); None at an epoch's start."""
    if saved is not None:
        return saved
    return sample_in_epoch // batch_in_epoch if batch_in_epoch else None


def continue_after_change(trainer, record: GlobalBatchRecord, run_dir: Path, store=None) -> dict | None:
    """Called on every rank after the Trainer loaded a checkpoint. If its global batch differs from this launch's,
    start the next epoch (Streaming's resume state and Composer's timestamp), drop Composer's saved RNG state (it
    would be restored at that epoch's start, though it belongs to the middle of the old one), and on rank 0 record
    the change. Returns the change {step, old, new}, or None."""
    state = trainer.state
    ts = state.timestamp
    old = checkpoint_global_batch(record.saved, int(ts.batch_in_epoch), int(ts.sample_in_epoch))
    if old is None or old == record.global_batch:
        return None
    change = {"step": int(ts.batch), "old": old, "new": record.global_batch}
    ds = state.train_dataloader.dataset
    position = ds.resume_state  # the checkpoint's {epoch, sample_in_epoch, ...}, as Composer loaded it
    if int(ts.batch_in_epoch):
        # the node's ranks share Streaming's resume segment: each rewrites it only once every rank has loaded
        # the checkpoint (which writes the old position there), and all of them write the same new one
        dist.barrier()
        ds.load_state_dict({**position, "epoch": position["epoch"] + 1, "sample_in_epoch": 0})
        state.timestamp = ts.to_next_epoch()
        forget_saved_rng(trainer)  # it belongs to the middle of the old epoch
        skipped = max(0, ds.epoch_size - position["sample_in_epoch"])
        logger.info(
            f"global batch changed from {old} (the checkpoint's) to {record.global_batch}: step "
            f"{change['step']} continues at the start of epoch {position['epoch'] + 1}; the rest of epoch "
            f"{position['epoch']}, {skipped} of its {ds.epoch_size} samples, is skipped"
        )
    else:
        logger.info(
            f"global batch changed from {old} (the checkpoint's) to {record.global_batch}: step "
            f"{change['step']} is at the start of epoch {position['epoch']}; nothing is skipped"
        )
    if dist.get_global_rank() == 0:
        record_change(Path(run_dir), change, store)
    return change


def record_change(run_dir: Path, change: dict, store=None) -> None:
    """Append the change to run.json's lineage (and the checkpoint prefix's copy); a relaunch that meets the same
    change again (the launch that made it stopped before its next checkpoint) does not append it twice."""
    record = stored_record(run_dir)
    assert record is not None  # a resume: run.json exists
    changes = record["lineage"].setdefault(CHANGES, [])
    if changes and changes[-1] == change:
        return
    changes.append(change)
    atomic_write(run_dir / "run.json", json.dumps(record, indent=1, sort_keys=True))
    if store is not None:
        store.write_record(record)
