"""Streaming 0.13.0: what gcc relies on beyond its documented API (gcc/compat/__init__.py).

- `BoundedS3Downloader`, `LinkingLocalDownloader`: Streaming's downloaders with gcc's retry policy and with links
  instead of copies (override `_create_s3_client` / `_download_file_impl`; installed in `DOWNLOADER_MAPPINGS`,
  which Streaming reads at each dataset's construction).
- `BoundedStream`: Streaming's Stream with shard files taken at their declared sizes and compressed shards inflated
  at most to their declared raw size (`get_shards`, `_download_file`, `_decompress_shard_part`; registered in
  `streams_registry`, which the dataset's `stream_name` looks up).
- `release_stale_shm`: a dead launch's shared memory released, and only its own (Streaming's segment names,
  `_get_path`, and the `locals` segment's layout, `_unpack_locals`).
- `register_prefix`: Streaming's shared-memory registration (`get_shm_prefix`) without its race between jobs on one
  node (its optimistic scan for a free prefix number), and without a lock shared with them.
- `SizedAttachSharedMemory`: an attach to a shared segment waits until its creator has sized it (installed as
  `streaming.base.shared.memory.BuiltinSharedMemory`, which Streaming's create-or-attach calls).
- `StreamingBase`, the StreamingDataset that gcc's dataset builds on, with:
  - `epoch`: the epoch of the running iteration, in each worker (`_resume_incr_epoch` computes it there);
  - a failed shard fetch handed back (`_shard_states`, `_cache_filelock`): Streaming leaves it marked PREPARING;
  - a download thread's error kept (`on_exception`, the stop event `_event`): Streaming's own version prints it,
    and the epoch then ends early without a word;
  - a download thread that raises still counts as exited (`_prepare_thread`, `_ready_thread`, `_Iterator.on_exit`):
    Streaming's iterator waits for both threads' exits at the end of `__iter__`, forever when one raised;
  - `restrict_to`: every epoch a shuffle of a fixed subset (`resample_streams`, `epoch_size`, `length`,
    `sample_offset_per_shard`);
  - `load_state_dict` called twice rewrites the segment it created (`_resume_shm`);
  - `shard_file`, `shard_cache_files`: a shard's stored file and its cache entries (`shards[i].file_pairs`,
    `streams`, `stream_per_shard`).
"""

from __future__ import annotations

import _posixshmem
import contextlib
import json
import os
import threading
import time
from collections.abc import Sequence
from multiprocessing.shared_memory import SharedMemory as BuiltinSharedMemory
from pathlib import Path
from tempfile import gettempdir
from typing import Any

import numpy as np

from gcc.compat import require, stand_ins

# checked before the library is imported: a changed library is then named, not met as an ImportError
require("mosaicml-streaming", "gcc/compat/streaming.py")

import torch.distributed as tdist
from boto3.session import Session

# Streaming's package imports its example datasets when it loads (streaming/__init__.py): streaming.text's C4, Pile
# and EnWiki import transformers' AutoTokenizer (which pulls in torch._dynamo), streaming.vision torchvision's,
# streaming.multimodal more; and its StreamingDataLoader (streaming.base.dataloader) imports transformers for two
# batch types. About 2 s in every rank and every loader forkserver, for classes gcc never uses (its loader is
# torch's DataLoader: gcc/data/dataset.py). Stand-ins take their place while Streaming loads (`stand_ins`,
# gcc/compat/__init__.py).
with stand_ins(["streaming.multimodal", "streaming.text", "streaming.vision", "streaming.base.dataloader"]):
    from streaming import MDSWriter, StreamingDataset  # noqa: F401  (MDSWriter: for gcc/data/convert.py)
    from streaming.base import dataset as streaming_dataset
    from streaming.base.constant import BARRIER_FILELOCK, CACHE_FILELOCK, LOCALS, SHM_TO_CLEAN
    from streaming.base.dataset import _ShardState
    from streaming.base.hashing import get_hash
    from streaming.base.shared import memory as streaming_memory
    from streaming.base.shared.memory import SharedMemory  # attaches without resource-tracker ownership
    from streaming.base.shared.prefix import (
        _check_and_find_retrying,
        _check_self,
        _get_path,
        _pack_locals,
        _unpack_locals,
    )
    from streaming.base.storage import download as streaming_download
    from streaming.base.stream import Stream, streams_registry
    from streaming.base.util import merge_index  # noqa: F401  (for gcc/data/convert.py)

from gcc import inputs, storage
from gcc.errors import DamagedData

# ---- downloaders ---------------------------------------------------------------------------------------------
# the size the file being fetched on this thread must have (`BoundedStream._download_file` sets it around the
# download it asks Streaming for: the same thread runs the downloader)
_fetching = threading.local()


class BoundedS3Downloader(streaming_download.S3Downloader):
    """Streaming's S3 shard downloader with the project's retry policy (botocore's standard mode, a bounded
    number of attempts: gcc.storage.s3_config) in place of Streaming's adaptive mode, which asks the object's
    length before downloading it: a shard of another size than its index declares (an index.json larger than a
    JSON file may be) is refused by its declared length, never downloaded."""

    def _create_s3_client(self, unsigned: bool = False, timeout: float = 60) -> None:
        self._s3_client = Session().client(
            "s3", config=storage.s3_config(timeout, unsigned), endpoint_url=os.environ.get("S3_ENDPOINT_URL")
        )

    def _download_file_impl(self, remote: str, local: str, timeout: float) -> None:
        expected: tuple[int, bool] | None = getattr(_fetching, "expected", None)  # (bytes, exactly or at most)
        if expected is not None:
            if self._s3_client is None:
                self._create_s3_client(timeout=timeout)
            bucket, _, key = remote.removeprefix("s3://").partition("/")
            size = int(self._s3_client.head_object(Bucket=bucket, Key=key)["ContentLength"])
            wanted, exactly = expected
            if size > wanted or (exactly and size != wanted):
                raise DamagedData(
                    f"{remote}: {size} bytes, "
                    + (f"its index.json says {wanted}" if exactly else f"larger than an index.json may be ({wanted})")
                    + " — restore or reconvert it"
                )
        super()._download_file_impl(remote, local, timeout)


class LinkingLocalDownloader(streaming_download.LocalDownloader):
    """A local dataset's files enter the run's cache as symbolic links, not copies: uncompressed shards are then
    read where they are (Streaming opens the cache's path), so no run writes a second copy of the dataset.
    Compressed shards are decompressed into the cache (the link goes once they are)."""

    def _download_file_impl(self, remote: str, local: str, timeout: float) -> None:
        if not os.path.isfile(remote):
            raise FileNotFoundError(f"{remote}: no such file")
        tmp = f"{local}.tmp{os.getpid()}"
        if os.path.lexists(tmp):
            os.remove(tmp)
        os.symlink(os.path.abspath(remote), tmp)
        os.replace(tmp, local)


# Streaming looks its downloader up by URL scheme at each dataset's construction; set at import, so that the
# loader workers (which import this module) have them too
streaming_download.DOWNLOADER_MAPPINGS["s3"] = BoundedS3Downloader
streaming_download.DOWNLOADER_MAPPINGS[""] = LinkingLocalDownloader


# ---- shard files read at their declared sizes ------------------------------------------------------------------
class BoundedStream(Stream):
    """Streaming's Stream whose shard files are taken at the sizes the (checked: gcc.data.shards.check_index)
    index declares: a fetched file must be a regular file of exactly its declared bytes before Streaming hashes
    it (Streaming reads it whole), and a compressed shard is read at its declared size and inflated no further
    than its declared raw size (`_decompress_shard_part`; Streaming's own inflates whatever the frame holds,
    into memory and the cache). Installed as the stream "gcc" (`StreamingBase` names it)."""

    def get_shards(self, world, allow_unsafe_types: bool) -> list:
        shards = super().get_shards(world, allow_unsafe_types)
        # {file basename: (its declared bytes, the raw bytes it inflates to)}, from the index just read
        self._declared = {
            info.basename: (info.bytes, raw.bytes)
            for shard in shards
            for raw, zipped in shard.file_pairs
            for info in (raw, zipped)
            if info is not None
        }
        return shards

    def _where(self, basename: str) -> str:
        return os.path.join(self.remote or self.local, self.split or "", basename)

    def _download_file(self, from_basename: str, to_basename: str | None = None) -> str:
        declared = getattr(self, "_declared", {}).get(from_basename)  # index.json itself: none
        _fetching.expected = (declared[0], True) if declared is not None else (inputs.CAPS["json"], False)
        try:
            local = super()._download_file(from_basename, to_basename)
        finally:
            _fetching.expected = None
        if declared is not None:
            with inputs.open_regular(local, "shard", cap=declared[0]) as (_, size):
                pass  # a link to a device, a folder or a larger file is refused by the opening itself
            if size != declared[0]:
                raise DamagedData(
                    f"{self._where(from_basename)}: {size} bytes, its index.json says {declared[0]} — restore or "
                    f"reconvert it"
                )
        return local

    def _decompress_shard_part(self, zip_info, zip_filename: str, raw_filename: str, compression: str | None) -> None:
        where = self._where(zip_info.basename)
        data = inputs.read_shard_file(zip_filename, zip_info.bytes, where)
        if self.validate_hash:  # as Streaming's own (the index's check made sure the hash is there)
            if get_hash(self.validate_hash, data) != zip_info.hashes.get(self.validate_hash):
                raise ValueError(f"Checksum failure: {zip_filename}")
        data = inputs.inflate_shard(data, compression, self._declared[zip_info.basename][1], where)
        tmp_filename = raw_filename + ".tmp"
        with open(tmp_filename, "wb") as out:
            out.write(data)
        os.rename(tmp_filename, raw_filename)
        if not self.safe_keep_zip:
            os.remove(zip_filename)


streams_registry.register("gcc", func=BoundedStream)


# ---- registration -------------------------------------------------------------------------------------------
# How many times a local leader scans again for a free prefix number when another job took the one it found.
REGISTRATION_TRIES = 100


def register_prefix(streams_local: list[str], streams_remote: list, world, retry: int = 100) -> tuple[int, Any]:
    """Streaming's `get_shm_prefix` (the number that prefixes a dataset's shared memory on this node) without its
    race between jobs, and without a lock any other job shares: installed in its place.

    Streaming's registration is optimistic: every local rank scans for the first free number, then the local leader
    creates it and the other ranks attach to the number *they* found. Two jobs starting at once could pick the same
    number (the leader died with FileExistsError '/000123_locals'), and a rank that scanned while another job was
    registering could find another number than its leader ("Internal error: shared memory prefix ... not
    registered by local leader"). Here only the local leader scans, and creates the number's segment exclusively:
    when another job created it first, it scans again. Then (a barrier) the job's other local ranks look up the
    number their leader registered for their cache folders: no other job can come between."""
    _check_self(streams_local)
    if world.is_local_leader:
        for _ in range(REGISTRATION_TRIES):
            prefix_int = max(
                _check_and_find_retrying(streams_local, streams_remote, shm_name=name, retry=retry)
                for name in SHM_TO_CLEAN
            )
            data = _pack_locals(streams_local, prefix_int)
            try:
                shm = SharedMemory(_get_path(prefix_int, LOCALS), True, len(data))
            except FileExistsError:  # another job's leader created this number since the scan
                continue
            shm.buf[: len(data)] = data
            break
        else:
            raise RuntimeError(f"no free shared-memory prefix for {streams_local} in {REGISTRATION_TRIES} scans")
    if tdist.is_available() and tdist.is_initialized():
        tdist.barrier()  # the leader has registered
    if not world.is_local_leader:
        mine = [p for p in shm_prefixes(streams_local) if _registered(p) == (streams_local, p)]
        if len(mine) != 1:
            raise RuntimeError(f"the local leader registered {streams_local} under {len(mine)} prefixes: {mine}")
        prefix_int = mine[0]
        shm = SharedMemory(_get_path(prefix_int, LOCALS), False)
    return prefix_int, shm


def _registered(prefix_int: int) -> tuple[list[str], int] | None:
    """What the prefix's segment records (its cache folders, its number); None when it has none (yet)."""
    try:
        shm = SharedMemory(_get_path(prefix_int, LOCALS), create=False, auto_cleanup=False)
    except (FileNotFoundError, PermissionError, ValueError):  # ValueError: being created (no size yet)
        return None
    try:
        return _unpack_locals(bytes(shm.buf))
    finally:
        shm.shm.close()


streaming_dataset.get_shm_prefix = register_prefix


# ---- shared memory -------------------------------------------------------------------------------------------
# Streaming creates each shared segment of a dataset (its barrier, its epoch counter, ...) in whichever local rank
# gets there first and attaches to it in the others (`streaming.base.shared.memory.SharedMemory`: create; on
# FileExistsError sleep 7 ms, then attach). The creator gives the segment its size (ftruncate) only after it created
# it (shm_open), so a rank whose attach falls in between finds it empty and fails ("ValueError: cannot mmap an empty
# file": seen on a loaded machine, where the creator can be off the CPU for longer than 7 ms). Here an attach waits,
# bounded, until the segment has its size.
SHM_SIZE_WAIT_S = 60.0


class SizedAttachSharedMemory(BuiltinSharedMemory):
    """Python's SharedMemory, whose attach (`create=False`) to a segment of a known `size` waits until the segment
    has a size: its creator may not have set it yet."""

    def __init__(self, name: str | None = None, create: bool = False, size: int = 0):
        if not create and name is not None and size > 0:
            path, deadline = Path("/dev/shm") / name.lstrip("/"), time.monotonic() + SHM_SIZE_WAIT_S
            while time.monotonic() < deadline:
                try:
                    if os.stat(path).st_size:
                        break
                except FileNotFoundError:  # none to attach to: Python's own error follows
                    break
                time.sleep(0.005)
        super().__init__(name, create, size)


streaming_memory.BuiltinSharedMemory = SizedAttachSharedMemory


def release_stale_shm(local_dirs: Sequence[str | Path] | None = None, scan: int = 256) -> int:
    """Unlink Streaming shared memory left by a *dead* launch that used these cache folders (with `local_dirs`
    None: segments whose every cache folder is gone, which nothing can be using).

    After a SIGKILL, Streaming's shared memory outlives the process and a relaunch on the same cache folder
    fails with "Reused local directory". Streaming's `clean_stale_shared_memory()` would fix that by unlinking
    every Streaming segment on the node, other live jobs' included (their loaders then fail): never call it.
    This removes only segments registered for our own folders (call it only while holding the lock of the cache
    they are in, the run lock for a cache inside the run folder: then no live run uses them,
    gcc/training/run_start.py `hold_cache`) or for folders that no longer exist. Returns the number of prefixes
    released."""
    return release_shm(shm_prefixes(local_dirs, scan))


def shm_prefixes(local_dirs: Sequence[str | Path] | None = None, scan: int = 256) -> list[int]:
    """The prefixes of the Streaming segments registered for these cache folders (with `local_dirs` None: for
    folders that no longer exist). Streaming's numbers only grow on a node (it skips numbers whose lock files remain
    in /tmp), so the segments that exist are looked at rather than a fixed range."""
    ours = {os.path.abspath(str(d)) for d in local_dirs or ()}
    shm_dir = Path("/dev/shm")
    prefixes = (
        sorted(int(p.name[:6]) for p in shm_dir.glob("[0-9][0-9][0-9][0-9][0-9][0-9]_" + LOCALS))
        if shm_dir.is_dir()
        else range(scan)
    )
    found = []
    for prefix in prefixes:
        registered = _registered(prefix)
        if registered is None:
            continue
        theirs, _ = registered
        if local_dirs is None:
            if not theirs or any(os.path.exists(t) for t in theirs):
                continue
        elif not ours.intersection(os.path.abspath(t) for t in theirs):
            continue
        found.append(prefix)
    return found


def release_shm(prefixes: Sequence[int]) -> int:
    """Unlink the Streaming segments and lock files of these prefixes; returns how many prefixes."""
    for prefix in prefixes:
        for name in SHM_TO_CLEAN:
            with contextlib.suppress(FileNotFoundError, PermissionError):
                _posixshmem.shm_unlink("/" + _get_path(prefix, name))
        for lock in (BARRIER_FILELOCK, CACHE_FILELOCK):
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(gettempdir(), _get_path(prefix, lock)))
    return len(prefixes)


# ---- the dataset ---------------------------------------------------------------------------------------------
class StreamingBase(StreamingDataset):
    """StreamingDataset with the hooks gcc's dataset needs (see the module's docstring). Subclasses implement
    `fetch_failed(shard_id, error)` (an exception to raise for a shard that could not be fetched) and
    `download_failed(error)` (the one to raise when a download thread failed)."""

    def __init__(self, *args, **kwargs):
        self.epoch = 0
        self.subset: np.ndarray | None = None
        self.resume_state: dict[str, Any] | None = None  # the last load_state_dict's
        self._thread_error: BaseException | None = None
        kwargs.setdefault("stream_name", "gcc")  # BoundedStream
        super().__init__(*args, **kwargs)

    # Streaming computes the epoch inside each worker's __iter__, at the start of each epoch
    def _resume_incr_epoch(self) -> tuple[int, int]:
        epoch, sample_in_epoch = super()._resume_incr_epoch()
        self.epoch = epoch
        return epoch, sample_in_epoch

    def restrict_to(self, subset: np.ndarray) -> None:
        """Every epoch is a shuffle of `subset` (sample ids) instead of the whole split: its size, and each
        rank's share of it."""
        self.subset = subset
        self.epoch_size = len(subset)
        self.length = -(-self.epoch_size // self._parallel_rank_world.num_ranks)

    def resample_streams(self, epoch: int, stream_id: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Streaming's epoch before its shuffle: (shuffle unit sizes, sample id of each slot). With a subset, the
        subset's ids, one unit per shard that holds some of them (Streaming's own subsampling, a stream's
        `choose`, draws how many samples each shard gives, and which, with its own generator: it cannot be told
        which clips)."""
        if self.subset is None:
            return super().resample_streams(epoch, stream_id)
        shard_of = np.searchsorted(self.sample_offset_per_shard, self.subset, side="right") - 1
        units = np.bincount(shard_of, minlength=self.num_shards)
        return units[units > 0].astype(np.int64), self.subset.copy()

    def load_state_dict(self, obj: dict[str, Any]) -> None:
        """Streaming's resume state, for the workers' next `__iter__` (kept as `resume_state` too: the node's
        segment is shared with the node's other ranks). Called again (a changed global batch moves the position a
        checkpoint loaded: gcc/training/batch_change.py), it rewrites the segment it created the first time.
        Streaming would attach a second copy of it, which the loader worker then takes back from the resource
        tracker (gcc/workers.py), so the creator's own cleanup fails at exit."""
        self.resume_state = dict(obj)
        shm = getattr(self, "_resume_shm", None)
        if shm is None:
            super().load_state_dict(obj)
            return
        data = json.dumps(obj, sort_keys=True).encode() + b"\0"  # as Streaming writes it: JSON, then a NUL
        shm.buf[: len(data)] = data

    def shard_file(self, shard_id: int) -> str:
        """The shard's stored file name (the compressed one, when it is)."""
        raw, zipped = self.shards[shard_id].file_pairs[0]
        return (zipped or raw).basename

    def shard_cache_files(self, shard_id: int) -> tuple[Path, list[str]]:
        """The cache folder of the shard's stream, and the names its files have there."""
        stream = self.streams[self.stream_per_shard[shard_id]]
        return Path(stream.local, stream.split or ""), [i.basename for i in self.shards[shard_id].file_pairs[0] if i]

    def prepare_shard(self, shard_id: int, blocking: bool = True) -> None:
        try:
            super().prepare_shard(shard_id, blocking)
        except Exception as e:
            fault = self.fetch_failed(shard_id, e)  # drops the bad copy first: no reader may see it marked present
            self._release_claim(shard_id)
            raise fault from None

    def _release_claim(self, shard_id: int) -> None:
        """Streaming marks a shard PREPARING (in the node's shared memory) before it fetches it and leaves the mark
        when the fetch raises; every later reader of that shard (this worker's next sample, a download thread, the
        node's other ranks and workers) would then wait for it forever, without a word. A failed fetch hands the
        shard back as LOCAL with its files gone (`fetch_failed` removed them), which is how Streaming sees a shard
        evicted under its feet: a reader's file access fails, it fetches the shard again, and meets the error
        itself. Not REMOTE: another worker's download thread that saw PREPARING waits for LOCAL and nothing else.
        Only the caller whose fetch raised holds the mark: Streaming's waiting branch never raises."""
        with contextlib.suppress(Exception):  # the error being raised is the one to report
            lock = self._cache_filelock
            lock.acquire()
            try:
                if self._shard_states[shard_id] == _ShardState.PREPARING:
                    self._shard_states[shard_id] = _ShardState.LOCAL
            finally:
                lock.release()

    # Streaming's download threads call `it.on_exit()` only when they return; `__iter__` ends by waiting for both
    # exits, so a thread that raised (a damaged shard) held the worker there forever
    def _prepare_thread(self, it) -> None:
        try:
            super()._prepare_thread(it)
        except BaseException:
            it.on_exit()
            raise

    def _ready_thread(self, it) -> None:
        try:
            super()._ready_thread(it)
        except BaseException:
            it.on_exit()
            raise

    def on_exception(self, future) -> None:
        # Streaming's download threads report here (its own version re-raises into the executor, which only
        # prints it); keep the error for the iterator, which otherwise just ends the epoch early
        err = future.exception()
        if err is not None:
            self._thread_error = self._thread_error or err
            self._event.set()

    def __iter__(self):
        yield from super().__iter__()
        if self._event.is_set():  # a download thread failed: Streaming ends the epoch early without a word
            raise self.download_failed(self._thread_error or RuntimeError("a Streaming download thread failed"))

    def fetch_failed(self, shard_id: int, error: BaseException) -> Exception:
        return error if isinstance(error, Exception) else RuntimeError(str(error))

    def download_failed(self, error: BaseException) -> Exception:
        return error if isinstance(error, Exception) else RuntimeError(str(error))
