"""After each checkpoint Composer writes, put it under `save_folder: s3://...` and commit it
(gcc/training/checkpoint/store.py): rank 0 checks that this launch still owns the prefix (every rank learns the verdict:
a launch that lost the prefix uploads nothing more), every rank uploads the files it wrote with their size and sha256,
and rank 0 commits them (the head names the checkpoint and its manifest, a write conditional on the head it checked)
and rotates the remote checkpoints. Every rank learns that verdict too, so a launch that lost the prefix to another
stops on all ranks at the same step (`TakenOver`, exit code 3).

The upload is synchronous: the next step starts once the checkpoint is safe remotely, and a preemption's
checkpoint is uploaded within `preemption_grace_s`. A checkpoint written in the background (`save_async`) is uploaded
once its write is complete and committed, at a later step (gcc/training/checkpoint/background.py).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

from composer.callbacks import CheckpointSaver
from composer.core import Callback, State
from composer.loggers import Logger
from composer.utils import dist

from gcc.compat.torch import DCP_METADATA
from gcc.errors import Refusal
from gcc.training.checkpoint.files import checkpoint_step, ckpt_dir, list_checkpoints, remove_checkpoint, to_rotate
from gcc.training.checkpoint.store import CheckpointStore, TakenOver, checkpoint_of

log = logging.getLogger(__name__)  # not `logger`: Composer passes its Logger under that name


class CheckpointUpload(Callback):
    """Must run after Composer's CheckpointSaver (the trainer appends it after the Trainer exists)."""

    def __init__(self, store: CheckpointStore, launch: str, run_dir: str | Path, keep: int, stop_after_step: int = 0):
        """`stop_after_step`: fault injection for tests (`faults.stop_after_commit_step`)."""
        self.store, self.launch, self.keep, self.stop_after_step = store, launch, keep, stop_after_step
        self.run_dir = Path(run_dir).absolute()
        self.local = ckpt_dir(self.run_dir)
        self.saver: CheckpointSaver | None = None
        self.done_batch = -1
        self.seconds: dict[int, float] = {}  # step -> its checkpoint's upload and commit time (the grace check's)

    def fit_start(self, state: State, logger: Logger) -> None:
        self.saver = next(cb for cb in state.callbacks if isinstance(cb, CheckpointSaver))

    def _files(self, batch: int) -> list[str]:
        """This rank's files of the checkpoint of `batch`, relative to the checkpoints folder."""
        assert self.saver is not None  # set at fit_start
        for saved in reversed(self.saver.saved_checkpoints):  # DDP: only rank 0 writes
            rel = Path(os.path.relpath(os.path.abspath(saved), self.local))
            if checkpoint_step(rel.parts[0]) != batch:
                continue
            if len(rel.parts) > 1 and dist.get_global_rank() == 0:  # a DCP folder: rank 0 also wrote its .metadata
                return [str(rel), str(rel.parent / DCP_METADATA)]
            return [str(rel)]
        return []

    def _committed(self) -> list[int]:
        """The batches of the checkpoints written completely so far, the same on every rank: the run's saver's
        record (a background write completes steps after its save: gcc/training/checkpoint/background.py), else
        Composer's last save."""
        assert self.saver is not None  # set at fit_start
        committed = getattr(self.saver, "committed", None)
        if committed is not None:
            return committed
        last = self.saver.last_checkpoint_batch
        return [] if last is None else [int(last)]

    def _after_save(self, state: State) -> None:
        if self.saver is None:
            return
        for batch in [b for b in self._committed() if b > self.done_batch]:
            self._upload(batch)

    def _upload(self, batch: int) -> None:
        self.done_batch = batch
        t0 = time.perf_counter()
        self._agree(self._owned)  # a launch that lost the prefix uploads nothing more
        files = {f: self.store.upload(self.local / f, f) for f in self._files(batch)}
        parts = dist.all_gather_object(files)  # also the barrier: every rank's files are up before the commit
        name = self._agree(lambda: self._commit({k: v for part in parts for k, v in part.items()}, t0))
        self.seconds[batch] = time.perf_counter() - t0
        if dist.get_local_rank() == 0 and dist.get_global_rank() != 0:
            # another node's run folder (node-local: only its ranks' shards, no `latest`): rotated here
            local = [p for _, p in list_checkpoints(self.run_dir)]
            for p in to_rotate(local, self.local / name, self.keep):
                remove_checkpoint(p)
        self._stop_if_injected(batch)

    def _agree(self, on_rank0) -> str:
        """Rank 0 runs `on_rank0` (its result, or why it failed: a TakenOver, a head that cannot be read); every rank
        gets it and raises TakenOver on a failure."""
        verdict = ["", ""]
        if dist.get_global_rank() == 0:
            try:
                verdict[0] = on_rank0()
            except (TakenOver, Refusal) as e:
                verdict[1] = str(e)
        dist.broadcast_object_list(verdict, src=0)
        if verdict[1]:
            raise TakenOver(verdict[1])
        return verdict[0]

    def _owned(self) -> str:
        self.store.check_owner(self.launch)
        return ""

    def _commit(self, manifest: dict, t0: float) -> str:
        names = sorted({checkpoint_of(k, self.store.ckpts) for k in manifest})
        if len(names) != 1:
            raise Refusal(f"checkpoint upload: the ranks uploaded files of {names or 'no checkpoint'}, not of one")
        self.store.commit(names[0], manifest, self.launch)
        gone = self.store.rotate(self.keep)
        log.info(
            f"checkpoint {names[0]} committed to {self.store.ckpts} in {time.perf_counter() - t0:.1f} s"
            + (f"; rotated out {', '.join(gone)}" if gone else "")
        )
        return names[0]

    def _stop_if_injected(self, batch: int) -> None:
        """Fault injection (tests): freeze the whole launch (launcher, ranks, loader workers: its process group) right
        after this step's commit, so a test knows exactly what is committed; it then kills it, or claims the prefix
        and continues it with SIGCONT."""
        if batch == self.stop_after_step and dist.get_global_rank() == 0:
            log.warning(f"faults.stop_after_commit_step={batch}: stopping the launch's process group")
            os.killpg(os.getpgid(0), signal.SIGSTOP)

    def batch_checkpoint(self, state: State, logger: Logger) -> None:
        self._after_save(state)

    def fit_end(self, state: State, logger: Logger) -> None:
        self._after_save(state)
