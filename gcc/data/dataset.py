"""The training/validation loader (docs/design.md §5–§6): a StreamingDataset of converted clips plus the text table,
the three dropouts and the world-anchored UNKNOWN mask.

Determinism: everything random about a sample is drawn from a generator keyed on (seed, epoch, sample id).
Streaming hands `get_item` the global sample id; the epoch is a local of Streaming's `__iter__`, so this class
captures it where Streaming computes it (`_resume_incr_epoch`, run in every worker at the start of each
epoch). Neither depends on the worker count, rank count or resume point. Pinned to streaming==0.13.0.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import math
import multiprocessing
import os
import time
import weakref
from collections.abc import Callable, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from streaming import StreamingDataset
from streaming.base.storage import download as streaming_download
from torch.utils.data import get_worker_info

from gcc import storage
from gcc.data.mask import apply_unknown_mask
from gcc.data.sample_rng import draw_sample
from gcc.data.shards import SHARD_HASH, TEXT_TABLE, ClipRecord, SplitFormat, check_index, read_manifest
from gcc.data.text_table import TextTable
from gcc.errors import BadInput, DamagedData, LockTimeout, StorageUnavailable, disk_full, is_unreachable
from gcc.geometry import Cameras
from gcc.names import inside
from gcc.vocab import UNKNOWN, check_vocab, collapse_parts
from gcc.workers import PREEMPTION_GRACE_S, LoaderWorkerInit, worker_context


@dataclass(frozen=True)
class Dropouts:
    text: float = 0.1
    cond: float = 0.05
    mask: float = 0.5
    calibration: str = "frame0"  # "frame0" | "cap"
    max_frame_coverage: float = 0.4

    def __post_init__(self):
        if self.calibration not in ("frame0", "cap"):
            raise ValueError(f"mask calibration must be 'frame0' or 'cap', got {self.calibration!r}")


NO_DROPOUTS = Dropouts(text=0.0, cond=0.0, mask=0.0)
# how a damaged or missing index.json fails inside StreamingDataset's constructor
INDEX_DAMAGE = (json.JSONDecodeError, OSError, KeyError, TypeError)


class BoundedS3Downloader(streaming_download.S3Downloader):
    """Streaming's S3 shard downloader with the project's retry policy (botocore's standard mode, a bounded
    number of attempts: gcc.storage.s3_config) in place of Streaming's adaptive mode."""

    def _create_s3_client(self, unsigned: bool = False, timeout: float = 60) -> None:
        from boto3.session import Session

        self._s3_client = Session().client(
            "s3", config=storage.s3_config(timeout, unsigned), endpoint_url=os.environ.get("S3_ENDPOINT_URL")
        )


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


# Streaming looks its downloader up by URL scheme at each dataset's construction (workers import this module too)
streaming_download.DOWNLOADER_MAPPINGS["s3"] = BoundedS3Downloader
streaming_download.DOWNLOADER_MAPPINGS[""] = LinkingLocalDownloader


def release_stale_shm(local_dirs: Sequence[str | Path] | None = None, scan: int = 256) -> int:
    """Unlink Streaming shared memory left by a *dead* launch that used these cache folders (with `local_dirs`
    None: segments whose every cache folder is gone, which nothing can be using).

    After a SIGKILL, Streaming's shared memory outlives the process and a relaunch on the same cache folder
    fails with "Reused local directory". Streaming's `clean_stale_shared_memory()` would fix that by unlinking
    every Streaming segment on the node, other live jobs' included (their loaders then fail): never call it.
    This removes only segments registered for our own folders (call it only while holding the run lock: no
    live run uses them) or for folders that no longer exist. Returns the number of prefixes released."""
    import _posixshmem
    from tempfile import gettempdir

    from streaming.base.constant import BARRIER_FILELOCK, CACHE_FILELOCK, LOCALS, SHM_TO_CLEAN
    from streaming.base.shared.memory import SharedMemory  # attaches without resource-tracker ownership
    from streaming.base.shared.prefix import _get_path, _unpack_locals

    ours = {os.path.abspath(str(d)) for d in local_dirs or ()}
    released = 0
    # Streaming's prefix numbers only grow on a node (it skips numbers whose lock files remain in /tmp), so
    # look at the segments that exist rather than a fixed range
    shm_dir = Path("/dev/shm")
    prefixes = (
        sorted(int(p.name[:6]) for p in shm_dir.glob("[0-9][0-9][0-9][0-9][0-9][0-9]_" + LOCALS))
        if shm_dir.is_dir()
        else range(scan)
    )
    for prefix in prefixes:
        try:
            shm = SharedMemory(_get_path(prefix, LOCALS), create=False, auto_cleanup=False)
        except (FileNotFoundError, PermissionError):
            continue
        theirs, _ = _unpack_locals(bytes(shm.buf))
        shm.shm.close()
        if local_dirs is None:
            if not theirs or any(os.path.exists(t) for t in theirs):
                continue
        elif not ours.intersection(os.path.abspath(t) for t in theirs):
            continue
        for name in SHM_TO_CLEAN:
            with contextlib.suppress(FileNotFoundError, PermissionError):
                _posixshmem.shm_unlink("/" + _get_path(prefix, name))
        for lock in (BARRIER_FILELOCK, CACHE_FILELOCK):
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(gettempdir(), _get_path(prefix, lock)))
        released += 1
    return released


def _empty(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """A new uninitialised tensor. Inside a DataLoader worker its storage is shared memory from the start (as
    torch's default_collate does for its batches), so handing the sample or batch to the main process does
    not copy it once more: at v10 a sample's sem ids are 32 MB and a context 88 MB."""
    shape = tuple(int(s) for s in shape)
    if get_worker_info() is None:
        return torch.empty(shape, dtype=dtype)
    storage = torch.UntypedStorage._new_shared(math.prod(shape) * dtype.itemsize)
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape)


# Registering a dataset takes well under a second; a lock held this long belongs to a stuck process.
REGISTRATION_LOCK_TIMEOUT_S = 120.0


def user_lock_dir() -> Path:
    """This user's folder for node-wide locks, `<tmp>/gcc-<uid>/`: created 0700, and refused unless it is a real
    folder owned by this user that no one else can write (another user cannot plant a link or hold our lock)."""
    import stat
    from tempfile import gettempdir

    d = Path(gettempdir(), f"gcc-{os.getuid()}")
    with contextlib.suppress(FileExistsError):
        d.mkdir(mode=0o700)
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise LockTimeout(
            f"{d}: expected a folder of this user (uid {os.getuid()}) that only it can write, found "
            f"owner uid {st.st_uid}, mode {stat.filemode(st.st_mode)}; remove it and relaunch"
        )
    return d


def hold_flock(path: Path, timeout_s: float, what: str) -> int:
    """An exclusive flock on `path` (created 0600, never through a link), waited for at most `timeout_s`; returns
    the open descriptor (closing it releases the lock). The holder writes its pid into the file, so that a
    timeout can say who holds it."""
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                holder = os.pread(fd, 100, 0).decode(errors="replace").strip() or "an unknown process"
                os.close(fd)
                raise LockTimeout(
                    f"{what}: {path} has been held by {holder} for more than {timeout_s:.0f} s; if "
                    f"that process is stuck, stop it, then relaunch"
                ) from None
            time.sleep(0.05)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()}\n".encode(), 0)
    return fd


@contextlib.contextmanager
def node_registration_lock(timeout_s: float = REGISTRATION_LOCK_TIMEOUT_S):
    """Serialise Streaming's shared-memory registration between independent jobs of this user on one node. Every
    StreamingDataset this project builds (tests included) is built inside it.

    Streaming's registration is optimistic: every local rank scans for the first free prefix number, then the
    local leader creates it and the other ranks attach to the number *they* found. Two jobs starting at once can
    pick the same number (the leader dies with FileExistsError '/000123_locals'), and a rank that scanned while
    another job was registering finds another number than its leader (it dies: "Internal error: shared memory
    prefix ... not registered by local leader"). So the node's local leader takes a file lock, and only then do
    the other ranks start their scan (a barrier): no other job registers between the scans and the creation.
    The lock is per user (`user_lock_dir`) and waited for at most `timeout_s`, then LockTimeout names its holder."""
    import fcntl

    import torch.distributed as tdist

    sync = tdist.is_available() and tdist.is_initialized()
    if int(os.environ.get("LOCAL_RANK", 0)) != 0:
        if sync:
            tdist.barrier()  # the leader holds the lock now
        yield
        return
    fd = hold_flock(user_lock_dir() / "streaming_registration.lock", timeout_s, "Streaming's registration lock")
    try:
        if sync:
            tdist.barrier()
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def round_robin_by_run(items: Sequence[tuple[str, Any]], n: int) -> list:
    """Up to n items spread over runs: runs by name, items in the given order within a run; every run's first
    item, then every run's second, ... (fixed validation/evaluation clips that cover many recordings)."""
    by_run: dict[str, list] = {}
    for run, item in items:
        by_run.setdefault(run, []).append(item)
    out: list = []
    depth = 0
    while len(out) < n and any(depth < len(v) for v in by_run.values()):
        out += [v[depth] for _, v in sorted(by_run.items()) if depth < len(v)][: n - len(out)]
        depth += 1
    return out


def fetch_text_table(data: str, cache_dir: str | Path) -> Path:
    """The text table as a local file: in place for local data, else downloaded once into the cache."""
    if not storage.is_remote(data):
        return Path(data, TEXT_TABLE)
    local = Path(cache_dir, TEXT_TABLE)
    if not local.exists():
        with storage.atomic_path(local) as tmp:
            storage.download_file(storage.join(data, TEXT_TABLE), str(tmp))
    return local


def subset_ids(n: int, limit: int, seed: int) -> np.ndarray:
    """`data.limit`: the sample ids of a seeded subset of `limit` of a split's `n` clips (all of them when `limit`
    >= n), sorted. A pure function of its arguments: the same on every rank, worker and resume."""
    import random

    ids = list(range(n))
    random.Random(seed).shuffle(ids)
    return np.array(sorted(ids[:limit]), np.int64)


class GcStreamingDataset(StreamingDataset):
    """Converted clips of one split. `data` is a conversion's root (local folder or s3:// URL); shards enter
    `cache_dir` (per run: Streaming refuses two live datasets on one local folder): downloaded from S3, linked
    from a local folder (uncompressed shards are then read in place). `limit`: every epoch is a shuffle of the
    same seeded subset of `limit` clips (`subset_ids`) instead of the whole split."""

    def __init__(
        self,
        data: str,
        split: str,
        cache_dir: str | Path,
        *,
        batch_size: int,
        seed: int = 0,
        vocab: str = "parts",
        dropouts: Dropouts = Dropouts(),
        shuffle: bool = True,
        num_canonical_nodes: int | None = 1,
        cache_limit: str | None = None,
        predownload: int | None = None,
        limit: int | None = None,
    ):
        self.manifest = read_manifest(data)
        if split not in self.manifest["splits"]:
            raise BadInput(f"{data}: split {split!r} not in the manifest ({sorted(self.manifest['splits'])})")
        self.data, self.split, self.seed, self.vocab = data, split, int(seed), check_vocab(vocab)
        self.format = SplitFormat.of(self.manifest, split)
        # the val split never drops anything (docs/design.md §5)
        self.dropouts = NO_DROPOUTS if split == "val" else dropouts
        cache_dir = Path(cache_dir)
        cache_dir.mkdir(parents=True, exist_ok=True)
        self.cache_folder = cache_dir / split
        self.text = TextTable(fetch_text_table(data, cache_dir))
        if len(self.text) != self.format.text_keys:
            raise DamagedData(
                f"{self.text.path}: {len(self.text)} keys, the manifest says {self.format.text_keys}; "
                f"not the text table of this conversion — restore or reconvert it"
            )
        self._epoch = 0
        index_url = storage.join(data, split, "index.json")
        try:
            # Streaming reads the index from the cache when it is there: it reads this checked copy, never the
            # data's own file, so a shard name or a column it would act on has passed check_index
            index = storage.read_bytes(index_url)
            check_index(index, self.manifest, split, index_url)
            storage.atomic_write(self.cache_folder / "index.json", index)
        except Exception as e:  # missing, cut or altered; or the store away, the disk full
            raise self._fault(index_url, e) from None
        with node_registration_lock():
            # validate_hash: every shard is checked against the xxh64 that convert_data recorded when it enters
            # the cache (a damaged shard otherwise decompresses to garbage or kills the loader's thread)
            try:
                super().__init__(
                    remote=storage.join(data, split),
                    local=str(self.cache_folder),
                    batch_size=batch_size,
                    shuffle=shuffle,
                    shuffle_seed=self.seed,
                    num_canonical_nodes=num_canonical_nodes,
                    cache_limit=cache_limit,
                    predownload=predownload,
                    validate_hash=SHARD_HASH,
                )
            except Exception as e:  # the cache's disk full, or Streaming refusing the (checked) index
                fault = self._fault(index_url, e)
                if isinstance(fault, DamagedData) and not isinstance(e, INDEX_DAMAGE):
                    raise
                Path(self.cache_folder, "index.json").unlink(missing_ok=True)
                raise fault from None
        self._thread_error: BaseException | None = None
        self.resume_state: dict[str, Any] | None = None  # the last load_state_dict's
        self.subset = subset_ids(self.num_samples, limit, self.seed) if limit else None
        if self.subset is not None:  # an epoch is the subset: its size, and each rank's share of it
            self.epoch_size = len(self.subset)
            self.length = math.ceil(self.epoch_size / self._parallel_rank_world.num_ranks)

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

    # ---- faults: an error naming the shard, never a silent early end of the epoch ------------------------------
    def _shard_name(self, shard_id: int) -> str:
        raw, zipped = self.shards[shard_id].file_pairs[0]
        return storage.join(self.data, self.split, (zipped or raw).basename)

    def _fault(self, where: str, e: BaseException) -> Exception:
        """What went wrong reading `where`: the local cache's disk full, the store not answering, or else the
        data damaged."""
        if isinstance(e, (DamagedData, StorageUnavailable)):
            return e
        full = disk_full(e, self.cache_folder, f"the shard cache {self.cache_folder} (reading {where})")
        if full is not None:
            return full
        if is_unreachable(e):
            return storage.unavailable(f"{where} (split {self.split})", e)
        return DamagedData(
            f"{where}: cannot be read ({type(e).__name__}: {e}); the file is damaged or changed "
            f"since convert_data wrote it (split {self.split}) — restore or reconvert it"
        )

    def prepare_shard(self, shard_id: int, blocking: bool = True) -> None:
        try:
            super().prepare_shard(shard_id, blocking)
        except Exception as e:
            self._release_claim(shard_id)
            # drop the bad copy from the cache: a relaunch after the data is repaired fetches it again
            stream = self.streams[self.stream_per_shard[shard_id]]
            for info in self.shards[shard_id].file_pairs[0]:
                if info is not None:  # only ever an entry of the cache (a checked name, resolved inside it)
                    inside(Path(stream.local, stream.split or ""), info.basename, "shard").unlink(missing_ok=True)
            raise self._fault(self._shard_name(shard_id), e) from None

    def _release_claim(self, shard_id: int) -> None:
        """Streaming marks a shard PREPARING (in the node's shared memory) before it fetches it and leaves the mark
        when the fetch raises; every later reader of that shard (this worker's next sample, a download thread, the
        node's other ranks and workers) would then wait for it forever, without a word. A failed fetch hands the
        shard back (REMOTE): the next reader fetches it itself, and meets the error itself. Only the caller whose
        fetch raised holds the mark: Streaming's waiting branch never raises."""
        from streaming.base.dataset import _ShardState

        with contextlib.suppress(Exception):  # the error being raised is the one to report
            lock = self._cache_filelock
            lock.acquire()
            try:
                if self._shard_states[shard_id] == _ShardState.PREPARING:
                    self._shard_states[shard_id] = _ShardState.REMOTE
            finally:
                lock.release()

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
            err = self._thread_error or RuntimeError("a Streaming download thread failed")
            raise self._fault(f"data {self.data}, split {self.split}", err)

    @contextmanager
    def _decoding(self, sample_id: int):
        try:
            yield
        except Exception as e:
            shard_id, _ = self.spanner[sample_id]
            raise self._fault(f"{self._shard_name(shard_id)} (sample {sample_id})", e) from None

    # Streaming computes the epoch inside each worker's __iter__; keep it for get_item.
    def _resume_incr_epoch(self) -> tuple[int, int]:
        epoch, sample_in_epoch = super()._resume_incr_epoch()
        self._epoch = epoch
        return epoch, sample_in_epoch

    def record(self, sample_id: int, empty: Callable | None = None, retry: int = 7) -> ClipRecord:
        """The stored clip of `sample_id`, checked against the manifest (shards.SplitFormat) before anything is
        allocated from it."""
        with self._decoding(sample_id):
            return self.format.decode(
                super().get_item(sample_id, retry), int(sample_id), f"{self.data}, split {self.split}", empty
            )

    def get_item(self, sample_id: int, retry: int = 7) -> dict[str, Any]:
        rec = self.record(sample_id, _empty, retry)
        with self._decoding(sample_id):
            meta = rec.meta()
        return self.make_sample(rec, int(sample_id), self._epoch, meta, decoding=lambda: self._decoding(sample_id))

    def make_sample(
        self, rec: ClipRecord, sample_id: int, epoch: int, meta: dict | None = None, decoding: Callable = nullcontext
    ) -> dict[str, Any]:
        d = self.dropouts
        draw = draw_sample(self.seed, epoch, sample_id, d.text, d.cond, d.mask)
        ids = np.full(len(rec.context_ids), self.text.null_id, np.int64) if draw.drop_text else rec.context_ids
        mask_frac = 0.0
        # sem ids are written once, into their final (in a worker: shared) storage
        sem_t = _empty(rec.sem_shape, torch.uint8)
        sem = sem_t.numpy()
        if draw.drop_cond:
            sem.fill(UNKNOWN)  # the stored ids are never decompressed
        else:
            with decoding():
                rec.sem_ids(out=sem)
            if draw.mask is not None:
                meta = meta if meta is not None else rec.meta()
                sem, mask_frac = apply_unknown_mask(
                    sem,
                    Cameras.from_meta(meta),
                    np.asarray(meta["ground_z"], float),
                    draw.mask,
                    calibration=d.calibration,
                    max_frame_coverage=d.max_frame_coverage,
                    inplace=True,
                )
        if self.vocab == "ids":
            sem_t = torch.from_numpy(collapse_parts(sem))
        return {
            "input_latents": rec.input_latents,
            "context": self.text.gather(ids, empty=_empty),
            "context_ids": torch.from_numpy(np.asarray(ids, np.int64)),
            "sem_ids": sem_t,
            "clip_id": rec.clip_id,
            "sample_id": sample_id,
            "epoch": epoch,
            "dropped": {"text": bool(draw.drop_text), "cond": bool(draw.drop_cond), "mask": float(mask_frac)},
        }


def _stack(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """torch.stack; one tensor becomes a [1, ...] view (no copy); in a worker the stack is written straight
    into shared memory (as default_collate does)."""
    if len(tensors) == 1:
        return tensors[0].unsqueeze(0)
    out = _empty((len(tensors), *tensors[0].shape), tensors[0].dtype)
    return torch.stack(list(tensors), out=out)


def gc_collate(samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Stack samples into the batch the model consumes; `dropped` becomes three flat tensors. A batch of one
    sample holds views of the sample's tensors (values identical; a single-prompt context stays a stride-0
    expanded view, see `TextTable.gather`)."""
    return {
        "input_latents": _stack([s["input_latents"] for s in samples]),
        "context": _stack([s["context"] for s in samples]),
        "context_ids": torch.stack([s["context_ids"] for s in samples]),
        "sem_ids": _stack([s["sem_ids"] for s in samples]),
        "clip_id": [s["clip_id"] for s in samples],
        "sample_id": torch.tensor([s["sample_id"] for s in samples], dtype=torch.int64),
        "epoch": torch.tensor([s["epoch"] for s in samples], dtype=torch.int64),
        "drop_text": torch.tensor([s["dropped"]["text"] for s in samples], dtype=torch.bool),
        "drop_cond": torch.tensor([s["dropped"]["cond"] for s in samples], dtype=torch.bool),
        "mask_frac": torch.tensor([s["dropped"]["mask"] for s in samples], dtype=torch.float32),
    }


class StallAt:
    """Fault injection for tests: the worker's `batch`-th collate never returns, as a loader that stops
    delivering (a hung storage read, a deadlocked worker). With one worker per rank, batch N is step N of the
    launch."""

    def __init__(self, collate: Callable, batch: int):
        self.collate, self.batch, self.made = collate, batch, 0

    def __call__(self, samples):
        self.made += 1
        if self.made == self.batch:
            while True:
                time.sleep(3600)
        return self.collate(samples)


# after a preemption signal a loader worker lives this much longer than its rank's grace (see LoaderWorkerInit)
WORKER_EXTRA_GRACE_S = 30.0


def build_dataloader(
    dataset,
    batch_size: int,
    num_workers: int = 0,
    *,
    collate_fn: Callable = gc_collate,
    preemption_grace_s: float = PREEMPTION_GRACE_S,
    prefetch_factor: int | None = None,
    drop_last: bool = False,
):
    """The DataLoader of every gcc loader: a plain torch DataLoader (Composer saves/restores Streaming's
    position through `.dataset`) whose workers start once, from the forkserver, and live for the whole run
    (see gcc/workers.py). Streaming re-reads its resume state at each epoch's `__iter__`, persistent workers
    included. `drop_last`: an epoch's last, partial batch is not yielded (every rank has the same number of
    samples per epoch, so every rank drops it at the same step)."""
    from torch.utils.data import DataLoader

    if num_workers == 0:
        return DataLoader(dataset, batch_size=batch_size, collate_fn=collate_fn, drop_last=drop_last)
    dl = DataLoader(
        dataset,
        batch_size=batch_size,
        num_workers=num_workers,
        collate_fn=collate_fn,
        persistent_workers=True,
        prefetch_factor=prefetch_factor,
        drop_last=drop_last,
        multiprocessing_context=worker_context(),
        worker_init_fn=LoaderWorkerInit(preemption_grace_s + WORKER_EXTRA_GRACE_S),
    )
    _LOADERS.add(dl)
    atexit.unregister(stop_loader_workers)  # once, and after multiprocessing's exit handler: it runs before it
    atexit.register(stop_loader_workers)
    return dl


# the loaders with persistent workers that this process built (weakly: a dropped loader stops its own workers)
_LOADERS: weakref.WeakSet = weakref.WeakSet()


def stop_loader_workers() -> None:
    """Stop the persistent workers of every loader of this process the DataLoader's own way (a `None` on each
    index queue, then join). Called by a launch's end (gcc.training.trainer) and at interpreter exit: otherwise
    multiprocessing's exit handler, which runs before the loader is collected, stops them with SIGTERM, which a
    loader worker defers by its preemption grace (LoaderWorkerInit)."""
    for loader in list(_LOADERS):
        iterator = getattr(loader, "_iterator", None)
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()
    # A rank ending on an error may have dropped its loader already; its workers would hold the exit up by their
    # preemption grace (they defer multiprocessing's SIGTERM). Nothing is left to save in them: stop them now.
    for p in multiprocessing.active_children():
        if p.daemon:
            p.kill()
            p.join(5)
