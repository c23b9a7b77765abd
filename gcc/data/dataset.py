"""The training/validation loader (docs/design.md §5–§6): a StreamingDataset of converted clips plus the text table,
the three dropouts and the world-anchored UNKNOWN mask.

Determinism: everything random about a sample is drawn from a generator keyed on (seed, epoch, sample id).
Streaming hands `get_item` the global sample id; the epoch is a local of Streaming's `__iter__`, which
gcc/compat/streaming.py's `StreamingBase.epoch` captures in every worker at the start of each epoch. Neither
depends on the worker count, rank count or resume point.
"""

from __future__ import annotations

import atexit
import json
import multiprocessing
import random
import time
import weakref
from collections.abc import Callable, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from gcc import storage
from gcc.compat.streaming import StreamingBase
from gcc.compat.torch import shutdown_loader_workers
from gcc.data.batch import gc_collate, new_tensor, pin_batches
from gcc.data.config import DataConfig
from gcc.data.mask import apply_unknown_mask
from gcc.data.sample_rng import draw_sample
from gcc.data.shards import SHARD_HASH, TEXT_TABLE, ClipRecord, SplitFormat, check_index, read_manifest
from gcc.data.text_table import TextTable
from gcc.errors import BadInput, DamagedData, StorageUnavailable, disk_full, is_unreachable
from gcc.geometry import Cameras
from gcc.names import inside
from gcc.vocab import UNKNOWN, check_vocab, collapse_parts
from gcc.workers import PREEMPTION_GRACE_S, LoaderWorkerInit, worker_context

# how a damaged or missing index.json fails inside StreamingDataset's constructor
INDEX_DAMAGE = (json.JSONDecodeError, OSError, KeyError, TypeError)


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
    ids = list(range(n))
    random.Random(seed).shuffle(ids)
    return np.array(sorted(ids[:limit]), np.int64)


class GcStreamingDataset(StreamingBase):
    """Converted clips of one split, as the `data:` section says (gcc/data/config.py): `config.path` is a
    conversion's root (local folder or s3:// URL); shards enter `cache_dir` (per run: Streaming refuses two live
    datasets on one local folder): downloaded from S3, linked from a local folder (uncompressed shards are then
    read in place). `config.limit`: every train epoch is a shuffle of the same seeded subset of `limit` clips
    (`subset_ids`) instead of the whole split. The val split never drops anything (docs/design.md §5)."""

    def __init__(
        self,
        config: DataConfig,
        split: str,
        cache_dir: str | Path,
        *,
        batch_size: int,
        seed: int = 0,
        vocab: str = "parts",
        shuffle: bool = True,
        predownload: int | None = None,
    ):
        data = config.path
        self.manifest = read_manifest(data)
        if split not in self.manifest["splits"]:
            raise BadInput(f"{data}: split {split!r} not in the manifest ({sorted(self.manifest['splits'])})")
        if not self.manifest["splits"][split]["clip_ids"]:  # convert_data writes no shards for an empty split
            raise BadInput(f"{data}: no {split} split (its conversion has 0 {split} clips: manifest.json)")
        self.data, self.split, self.seed, self.vocab = data, split, int(seed), check_vocab(vocab)
        self.format = SplitFormat.of(self.manifest, split)
        self.config = config.without_dropouts() if split == "val" else config
        cache_dir = Path(cache_dir)
        cache_dir.mkdir(parents=True, exist_ok=True)
        self.cache_folder = cache_dir / split
        self.text = TextTable(fetch_text_table(data, cache_dir), tuple(self.manifest["geometry"]["text"]))
        if len(self.text) != self.format.text_keys:
            raise DamagedData(
                f"{self.text.path}: {len(self.text)} keys, the manifest says {self.format.text_keys}; "
                f"not the text table of this conversion — restore or reconvert it"
            )
        index_url = storage.join(data, split, "index.json")
        try:
            # Streaming reads the index from the cache when it is there: it reads this checked copy, never the
            # data's own file, so a shard name or a column it would act on has passed check_index
            index = storage.read_bytes(index_url)
            check_index(index, self.manifest, split, index_url)
            storage.atomic_write(self.cache_folder / "index.json", index)
        except Exception as e:  # missing, cut or altered; or the store away, the disk full
            raise self._fault(index_url, e) from None
        # Streaming's own defaults, given explicitly (the same shuffle): left unset, each dataset logs a notice
        block = max(4_000_000 // config.num_canonical_nodes, 1 << 18)
        # validate_hash: every shard is checked against the xxh64 that convert_data recorded when it enters
        # the cache (a damaged shard otherwise decompresses to garbage or kills the loader's thread)
        try:
            super().__init__(
                remote=storage.join(data, split),
                local=str(self.cache_folder),
                batch_size=batch_size,
                shuffle=shuffle,
                shuffle_seed=self.seed,
                **config.streaming_args(),
                predownload=8 * batch_size if predownload is None else predownload,
                shuffle_block_size=block,
                validate_hash=SHARD_HASH,
            )
        except Exception as e:  # the cache's disk full, or Streaming refusing the (checked) index
            fault = self._fault(index_url, e)
            if isinstance(fault, DamagedData) and not isinstance(e, INDEX_DAMAGE):
                raise
            Path(self.cache_folder, "index.json").unlink(missing_ok=True)
            raise fault from None
        if config.limit and split == "train":
            self.restrict_to(subset_ids(self.num_samples, config.limit, self.seed))

    # ---- faults: an error naming the shard, never a silent early end of the epoch ------------------------------
    def _shard_name(self, shard_id: int) -> str:
        return storage.join(self.data, self.split, self.shard_file(shard_id))

    def fetch_failed(self, shard_id: int, error: BaseException) -> Exception:
        # drop the bad copy from the cache: a relaunch after the data is repaired fetches it again
        folder, names = self.shard_cache_files(shard_id)
        for name in names:  # only ever an entry of the cache (a checked name, resolved inside it)
            inside(folder, name, "shard").unlink(missing_ok=True)
        return self._fault(self._shard_name(shard_id), error)

    def download_failed(self, error: BaseException) -> Exception:
        return self._fault(f"data {self.data}, split {self.split}", error)

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

    @contextmanager
    def _decoding(self, sample_id: int):
        try:
            yield
        except Exception as e:
            shard_id, _ = self.spanner[sample_id]
            raise self._fault(f"{self._shard_name(shard_id)} (sample {sample_id})", e) from None

    def record(self, sample_id: int, empty: Callable | None = None, retry: int = 7) -> ClipRecord:
        """The stored clip of `sample_id`, checked against the manifest (shards.SplitFormat) before anything is
        allocated from it."""
        with self._decoding(sample_id):
            return self.format.decode(
                super().get_item(sample_id, retry), int(sample_id), f"{self.data}, split {self.split}", empty
            )

    def get_item(self, sample_id: int, retry: int = 7) -> dict[str, Any]:
        rec = self.record(sample_id, new_tensor, retry)  # its meta parsed and checked there
        return self.make_sample(rec, int(sample_id), self.epoch, rec.meta(), decoding=lambda: self._decoding(sample_id))

    def make_sample(
        self, rec: ClipRecord, sample_id: int, epoch: int, meta: dict | None = None, decoding: Callable = nullcontext
    ) -> dict[str, Any]:
        d = self.config
        draw = draw_sample(self.seed, epoch, sample_id, d.text_dropout, d.cond_dropout, d.mask_p)
        ids = np.full(len(rec.context_ids), self.text.null_id, np.int64) if draw.drop_text else rec.context_ids
        mask_frac = 0.0
        # sem ids are written once, into their final (in a worker: shared) storage
        sem_t = new_tensor(rec.sem_shape, torch.uint8)
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
                    calibration=d.mask_calibration,
                    max_frame_coverage=d.max_frame_coverage,
                    inplace=True,
                )
        if self.vocab == "ids":
            sem_t = torch.from_numpy(collapse_parts(sem))
        context, index = self.text.prompts(ids, empty=new_tensor)
        return {
            "input_latents": rec.input_latents,
            "context": context,
            "context_index": index,
            "context_ids": torch.from_numpy(np.asarray(ids, np.int64)),
            "sem_ids": sem_t,
            "clip_id": rec.clip_id,
            "sample_id": sample_id,
            "epoch": epoch,
            "dropped": {"text": bool(draw.drop_text), "cond": bool(draw.drop_cond), "mask": float(mask_frac)},
        }


class FaultAt:
    """Fault injection for tests: the loader's `batch`-th collate never returns, as a loader that stops
    delivering (a hung storage read, a deadlocked worker); or, with `fault`, calls it (`faulthandler._sigsegv`: a
    native crash). With one worker per rank, or none (the collate then runs in the rank), batch N is step N of the
    launch."""

    def __init__(self, collate: Callable, batch: int, fault: Callable[[], object] | None = None):
        self.collate, self.batch, self.fault, self.made = collate, batch, fault, 0

    def __call__(self, samples):
        self.made += 1
        if self.made == self.batch:
            if self.fault is not None:
                self.fault()
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
    samples per epoch, so every rank drops it at the same step). Batches are pinned for a GPU (`pin_batches`)."""
    if num_workers == 0:
        return DataLoader(
            dataset, batch_size=batch_size, collate_fn=collate_fn, drop_last=drop_last, pin_memory=pin_batches()
        )
    dl = DataLoader(
        dataset,
        batch_size=batch_size,
        num_workers=num_workers,
        collate_fn=collate_fn,
        pin_memory=pin_batches(),
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
    index queue, then join). Called by a launch's end (gcc.training.ending) and at interpreter exit: otherwise
    multiprocessing's exit handler, which runs before the loader is collected, stops them with SIGTERM, which a
    loader worker defers by its preemption grace (LoaderWorkerInit)."""
    for loader in list(_LOADERS):
        shutdown_loader_workers(loader)
    # A rank ending on an error may have dropped its loader already; its workers would hold the exit up by their
    # preemption grace (they defer multiprocessing's SIGTERM). Nothing is left to save in them: stop them now.
    for p in multiprocessing.active_children():
        if p.daemon:
            p.kill()
            p.join(5)
