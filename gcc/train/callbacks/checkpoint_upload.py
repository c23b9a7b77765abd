"""After each checkpoint Composer writes, put it under `checkpoint_dir: s3://...` and commit it
(gcc/train/checkpoint_store.py): every rank uploads the files it wrote, a barrier, then rank 0 checks that this
launch still owns the prefix, rewrites `latest` and rotates the remote checkpoints. Every rank learns the verdict,
so a launch that lost the prefix to another stops on all ranks at the same step (`TakenOver`, exit code 3).

The upload is synchronous: the next step starts once the checkpoint is safe remotely, and a preemption's
checkpoint is uploaded within `preemption_grace_s`.
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from composer.callbacks import CheckpointSaver
from composer.core import Callback, State
from composer.loggers import Logger
from composer.utils import dist

from gcc.train.checkpoint_store import CheckpointStore, TakenOver
from gcc.train.run_folder import (DCP_METADATA, checkpoint_step, ckpt_dir, list_checkpoints,
                                  remove_checkpoint, to_rotate)

log = logging.getLogger(__name__)  # not `logger`: Composer passes its Logger under that name


class CheckpointUpload(Callback):
    """Must run after Composer's CheckpointSaver (the trainer appends it after the Trainer exists)."""

    def __init__(self, store: CheckpointStore, launch: str, run_dir: str | Path, keep: int):
        self.store, self.launch, self.keep = store, launch, keep
        self.run_dir = Path(run_dir).absolute()
        self.local = ckpt_dir(self.run_dir)
        self.saver: CheckpointSaver | None = None
        self.done_batch = -1

    def fit_start(self, state: State, logger: Logger) -> None:
        self.saver = next(cb for cb in state.callbacks if isinstance(cb, CheckpointSaver))

    def _files(self, batch: int) -> list[str]:
        """This rank's files of the checkpoint of `batch`, relative to the checkpoints folder."""
        saved = self.saver.saved_checkpoints
        if not saved:  # DDP: only rank 0 writes
            return []
        rel = Path(os.path.relpath(os.path.abspath(saved[-1]), self.local))
        if checkpoint_step(rel.parts[0]) != batch:
            return []
        if len(rel.parts) > 1 and dist.get_global_rank() == 0:  # a DCP folder: rank 0 also wrote its .metadata
            return [str(rel), str(rel.parent / DCP_METADATA)]
        return [str(rel)]

    def _after_save(self, state: State) -> None:
        batch = int(state.timestamp.batch)
        if self.saver is None or self.saver.last_checkpoint_batch is None or batch == self.done_batch \
                or int(self.saver.last_checkpoint_batch) != batch:
            return
        self.done_batch = batch
        t0 = time.perf_counter()
        files = self._files(batch)
        for f in files:
            self.store.upload(self.local / f, f)
        dist.barrier()  # every rank's files are up before `latest` names them
        verdict = ["", ""]  # the committed name, or why not
        if dist.get_global_rank() == 0:
            name = files[0].split("/")[0]
            try:
                self.store.commit(name, self.launch)
                gone = self.store.rotate(self.keep)
                verdict[0] = name
                log.info(f"checkpoint {name} committed to {self.store.ckpts} in {time.perf_counter() - t0:.1f} s"
                         + (f"; rotated out {', '.join(gone)}" if gone else ""))
            except TakenOver as e:
                verdict[1] = str(e)
        dist.broadcast_object_list(verdict, src=0)
        if verdict[1]:
            raise TakenOver(verdict[1])
        if dist.get_local_rank() == 0 and dist.get_global_rank() != 0:
            # another node's run folder (node-local: only its ranks' shards, no `latest`): rotated here
            local = [p for _, p in list_checkpoints(self.run_dir)]
            for p in to_rotate(local, self.local / verdict[0], self.keep):
                remove_checkpoint(p)

    def batch_checkpoint(self, state: State, logger: Logger) -> None:
        self._after_save(state)

    def fit_end(self, state: State, logger: Logger) -> None:
        self._after_save(state)
