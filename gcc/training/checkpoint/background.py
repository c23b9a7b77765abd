"""Periodic checkpoints written in the background (`save_async`, docs/training.md "Checkpoints in the
background"), under the names and in the format Composer's autoresume loads, with the run folder's commit rule
(gcc/training/run_folder.py).

At a periodic save (Composer's CheckpointSaver at the step's BATCH_CHECKPOINT) every rank builds Composer's
checkpoint state as Composer does (`{"state": state.state_dict(), "rng": ...}`: its collectives run on the main
thread), and each rank that writes copies it to host memory before the next step can change it: the step-N state,
bit for bit. One background thread per rank then writes the copy:
* DDP: rank 0's `ep{E}-ba{B}-rank0.pt` (torch.save), through the run folder's writer (a temporary name, fsynced,
  renamed: complete or absent);
* FSDP2: the DCP folder `ep{E}-ba{B}/` (each rank its shard; rank 0 writes `.metadata` last), with DCP's own
  staging and a gloo process group of its own, so its collectives run beside training's.

A write is done when every rank's part is; the ranks agree on that in the step's one reduce (StepSync's "written")
and commit it together at that step's BATCH_CHECKPOINT: `latest` repointed (rank 0), Composer's record of the
saved checkpoint, SaveClock's figure (staging + write), then the after-saver callbacks (rotation, upload, the step
deadline) see it as they see a synchronous save. At most one write is in flight: a save due while one is waits
for it and commits it first; so do the end-of-training and preemption saves, which are Composer's own,
synchronous. A write that failed raises on the main thread where it is committed, the next step at the latest:
the run stops as on a synchronous save's failure (gcc/training/trainer.py `as_fault`).

The copy goes into host memory allocated at the first save and refilled at every later one (`HostStaging`):
pinned on a GPU, so the copy from the device runs at full speed and no save allocates gigabytes anew. Its size is
logged at the first save (≈ 7.5 GB per GPU for sft_v10 on 8 GPUs: docs/training.md, "Checkpoints in the
background"). The cost: that host memory for the whole run; the gain: a save stops training only for the copy, not
for the write (bench/async_save.py).
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as torch_dist
import torch.distributed.checkpoint as dcp
from composer.core import Callback, State
from composer.loggers import Logger
from composer.utils import dist
from torch.distributed.tensor import DTensor

from gcc.compat.composer import DeferringCheckpointSaver, checkpoint_state
from gcc.compat.torch import copy_state_into, host_state_like, same_layout
from gcc.storage import atomic_path
from gcc.training.checkpoint.files import point_latest

if TYPE_CHECKING:  # the callbacks' table builds CheckpointWrites: no import of the package from here
    from gcc.training.callbacks.step_sync import StepSync
    from gcc.training.checkpoint.rotation import SaveClock

log = logging.getLogger(__name__)  # not `logger`: Composer passes its Logger under that name


class HostStaging:
    """The host copy of this rank's checkpoint state that a background write reads: its tensors (a DTensor: its
    local shard) in host memory allocated at the first save and refilled at every later save whose tensors have
    the same names, shapes and dtypes (the rest of the state, which grows as a run goes, deep-copied each time),
    pinned on a GPU (an asynchronous copy at full speed, then one wait for it). A write in flight holds it; the
    saver waits for that write before it stages the next (`AsyncCheckpointSaver`)."""

    def __init__(self, pin: bool | None = None):
        self.pin = torch.cuda.is_available() if pin is None else pin
        self._host: dict[tuple, Any] | None = None  # each tensor's host memory, by its path in the state
        self.nbytes = 0  # the host memory held, bytes
        self.allocations = 0  # how many times it was allocated (once, unless the model's tensors changed)

    def stage(self, state: Any) -> Any:
        tensors = dict(_tensor_leaves(state, ()))
        if self._host is None or not same_layout(tensors, self._host):
            self._host = None  # the old buffers go before the new ones come
            self._host = host_state_like(tensors, self.pin)
            self.nbytes = _tensor_bytes(self._host)
            self.allocations += 1
            pinned = "pinned " if self.pin else ""
            log.info(
                f"checkpoint staging: {self.nbytes / 1e9:.3g} GB of {pinned}host memory on this rank, allocated once "
                f"and reused by every background save"
            )
        staged = copy_state_into(tensors, self._host, non_blocking=self.pin)
        if self.pin:
            torch.cuda.synchronize()  # the step-N values are in host memory before training changes them
        return copy.deepcopy(state, {id(tensors[path]): staged[path] for path in tensors})


def _tensor_leaves(state: Any, path: tuple) -> Iterator[tuple[tuple, torch.Tensor]]:
    """(path, tensor) of every tensor in a checkpoint state's dicts, lists and tuples."""
    if isinstance(state, torch.Tensor):
        yield path, state
    elif isinstance(state, dict):
        for k, v in state.items():
            yield from _tensor_leaves(v, (*path, k))
    elif isinstance(state, (list, tuple)):
        for i, v in enumerate(state):
            yield from _tensor_leaves(v, (*path, i))


def _tensor_bytes(host: dict[tuple, torch.Tensor]) -> int:
    """The bytes of a staging's host tensors (flat, by path; a DTensor's: its local shard's)."""
    return sum((t.to_local() if isinstance(t, DTensor) else t).nbytes for t in host.values())


@dataclass
class Write:
    """A checkpoint write in flight: its name in the checkpoints folder, this rank's file (None: it writes none),
    the batch, its background job (None: nothing to write on this rank) and when its staging began."""

    name: str
    path: str | None
    batch: int
    job: Future | None
    t0: float
    seconds: float = 0.0  # staging + write, set when the job ends

    def done(self) -> bool:
        return self.job is None or self.job.done()


class CheckpointWrites(Callback):
    """The rank's background checkpoint writer and the ranks' agreement on when a write is complete (module
    docstring). Built before the step deadline (it reads `commit_due`), from the callbacks' table."""

    def __init__(self, sync: StepSync, run_dir: str | Path, enabled: bool, hold_step: int):
        """`hold_step`: fault injection for tests (`faults.hold_async_write_step`; 0: none): the write of that
        step's checkpoint waits until the launch is killed before it completes (before the rename; after DCP's
        `.metadata`). Only an in-process test sets `released`."""
        self.run_dir, self.enabled, self.hold_step, self.sync = Path(run_dir), enabled, hold_step, sync
        self.released = threading.Event()
        self.pending: Write | None = None
        self.staging = HostStaging()
        self._pool: ThreadPoolExecutor | None = None
        self._group: Any = None  # DCP's gloo process group, made at the first sharded write
        sync.flag("written", lambda: self.pending is None or self.pending.done())

    def commit_due(self, step: int) -> bool:
        """Every rank's part of the write in flight is done (step `step`'s reduce, after the save, said so): it is
        committed at this step's BATCH_CHECKPOINT."""
        return (
            self.pending is not None
            and step > self.pending.batch
            and self.sync.totals.get("written", 0.0) >= dist.get_world_size()
        )

    def start(self, name: str, path: str | None, batch: int, job: Callable[[], None] | None, t0: float) -> None:
        assert self.pending is None, "a write is in flight"  # the saver waits for it first
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="checkpoint-writer")
        write = Write(name, path, batch, None, t0)
        if job is not None:
            write.job = self._pool.submit(self._run, write, job)
        self.pending = write

    def _run(self, write: Write, job: Callable[[], None]) -> None:
        job()
        write.seconds = time.perf_counter() - write.t0

    def finish(self) -> Write:
        """The write in flight, waited for; its failure raised here, on the main thread."""
        write, self.pending = self.pending, None
        assert write is not None
        if write.job is not None:
            write.job.result()
        else:
            write.seconds = time.perf_counter() - write.t0
        return write

    def _held(self, batch: int) -> None:
        if batch == self.hold_step:
            log.warning(f"faults.hold_async_write_step={batch}: the write of this checkpoint waits to be killed")
            self.released.wait()

    def write_file(self, staged: dict, path: Path, batch: int) -> Callable[[], None]:
        """The job that writes a DDP checkpoint: torch.save to a temporary name, renamed once complete."""

        def job() -> None:
            with atomic_path(path, root=self.run_dir) as tmp, open(tmp, "wb") as f:
                torch.save(staged, f)
                f.flush()
                self._held(batch)

        return job

    def write_dcp(self, state_dict: dict, folder: Path, planner: Any, batch: int) -> Callable[[], None]:
        """The job that writes a DCP folder: the state staged to host memory now (`staging`, shards as shards),
        written in the background over the writer's own gloo group (every rank makes it at the same save: a
        collective)."""
        if self._group is None:
            self._group = torch_dist.new_group(backend="gloo")
        writer = dcp.FileSystemWriter(str(folder))
        writer.per_thread_copy_ahead = 0  # staged in host memory already (what FileSystemWriter.stage sets)
        staged = self.staging.stage(state_dict)
        group = self._group

        def job() -> None:
            dcp.save(staged, storage_writer=writer, planner=planner, process_group=group)
            self._held(batch)

        return job

    def close(self, state: State, logger: Logger) -> None:
        """A launch that stops with a write in flight (a non-finite loss, a prefix taken over: every rank closes at
        the same step) lets it end and commits it when rank 0's part succeeded: rank 0's part ends last (DDP: it
        writes alone; DCP: it writes `.metadata` once every rank's shard is written), so the checkpoint is then
        complete, and the relaunch resumes from it rather than remove it. A failed write stays uncommitted: the next
        start's repair removes what `latest` does not name."""
        write = self.pending
        if write is not None and write.job is not None:
            failed = write.job.exception()  # waits
            if failed is None and dist.get_global_rank() == 0:
                point_latest(self.run_dir, write.name)
                log.info(f"checkpoint {write.name}: written in the background, committed as the launch stops")
        self.pending = None
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None


class AsyncCheckpointSaver(DeferringCheckpointSaver):
    """Composer's CheckpointSaver whose periodic saves go through `CheckpointWrites` (the builder switches the
    Trainer's saver to this class: gcc/compat/composer.py `use_checkpoint_saver`). Composer's own save serves the
    end of training, a preemption (the run ends: nothing would overlap the write) and `save_async: false`."""

    writes: CheckpointWrites
    clock: SaveClock
    committed: list[int]  # the batches of the checkpoints committed by this launch, in order (CheckpointUpload)

    def batch_checkpoint(self, state: State, logger: Logger) -> None:
        if self.writes.commit_due(int(state.timestamp.batch)):
            self._commit(self.writes.finish())
        super().batch_checkpoint(state, logger)

    def _commit(self, write: Write) -> None:
        if write.path is not None:
            self.saved_checkpoints.append(write.path)
        if dist.get_global_rank() == 0:
            point_latest(self.writes.run_dir, write.name)
        self.clock.saved(write.batch, write.seconds)
        self.committed.append(write.batch)

    def save(self, state: State, logger: Logger) -> None:
        if self.writes.pending is not None:  # at most one write in flight
            self._commit(self.writes.finish())
        t0 = time.perf_counter()
        elapsed = state.get_elapsed_duration()
        if not self.writes.enabled or self.weights_only or self.ignore_keys or (elapsed is not None and elapsed >= 1):
            self.composer_save(state, logger)
            self.clock.saved(int(state.timestamp.batch), time.perf_counter() - t0)
            self.committed.append(int(state.timestamp.batch))
            return
        save_filename, state_dict = checkpoint_state(self, state)
        path = Path(save_filename)
        batch = int(state.timestamp.batch)
        if state.fsdp_sharded_state_dict_enabled:
            assert state.fsdp_config is not None
            planner = state.fsdp_config.save_planner or dcp.DefaultSavePlanner(dedup_save_to_lowest_rank=True)
            path.parent.mkdir(parents=True, exist_ok=True)
            job = self.writes.write_dcp(state_dict, path.parent, planner, batch)
            self.writes.start(path.parent.name, save_filename, batch, job, t0)
        elif dist.get_global_rank() == 0:
            staged = self.writes.staging.stage(state_dict)
            self.writes.start(path.name, save_filename, batch, self.writes.write_file(staged, path, batch), t0)
        else:
            self.writes.start(path.name, None, batch, None, t0)
