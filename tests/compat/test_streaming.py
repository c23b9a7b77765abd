"""Contract tests of gcc/compat/streaming.py: what gcc relies on in Streaming's insides, checked against the
installed Streaming. Each fails when that behaviour changes under a new version."""

from __future__ import annotations

import _posixshmem
import os
import shutil
import threading
import uuid
from pathlib import Path

import pytest
from _launch import run_ranks
from streaming.base.dataset import StreamingDataset, _Iterator, _ShardState

import gcc.compat.streaming as S  # (installs its fixes)

ROOT = Path(__file__).resolve().parents[2]

RANK = """
import os, sys
from pathlib import Path
from gcc.data.config import DataConfig
from gcc.data.dataset import GcStreamingDataset, build_dataloader
if __name__ == "__main__":  # loader workers import this file (forkserver): nothing may run at import
    ds = GcStreamingDataset(DataConfig(sys.argv[1]), "train", Path(sys.argv[2]), batch_size=2, seed=0)
    try:
        for _ in build_dataloader(ds, batch_size=2, num_workers=1):
            pass
        print("NO ERROR", flush=True)
    except Exception as e:
        print("ERROR", type(e).__name__, e, flush=True)
"""


def test_the_private_names_the_adapter_uses_exist():
    for name in ("_prepare_thread", "_ready_thread", "_resume_incr_epoch", "prepare_shard", "on_exception"):
        assert callable(getattr(StreamingDataset, name, None)), name
    assert {s.name for s in _ShardState} >= {"REMOTE", "PREPARING", "LOCAL"}
    assert callable(_Iterator.on_exit) and _Iterator._num_threads_to_exit == 2


@pytest.mark.slow
def test_a_damaged_shard_met_by_a_download_thread_stops_every_rank_of_the_node_naming_it(shards, tmp_path):
    """Two ranks of one node, a loader worker each, one shard damaged. Streaming's download threads meet it first;
    a thread that raises never counted as exited, so the worker waited at the end of its epoch forever, and a
    worker whose own thread had skipped the shard (the other rank's was fetching it) waited for it to become
    local forever. Each rank now fails, naming the shard."""
    data = tmp_path / "shards"
    shutil.copytree(shards, data)
    bad = sorted((data / "train").rglob("shard.*.mds"))[0]
    raw = bytearray(bad.read_bytes())
    for i in range(len(raw) // 2, len(raw) // 2 + 64):
        raw[i] ^= 0xFF
    bad.write_bytes(bytes(raw))
    cache = tmp_path / "cache" / uuid.uuid4().hex  # one node: one cache (Streaming keys its shared memory on it)
    # a rank still waiting for its loader 180 s after one of its shards was found damaged: the failure shows where
    _, outs = run_ranks(tmp_path / "ranks", RANK, str(data), str(cache), timeout=180)
    for rank, out in enumerate(outs):
        assert "ERROR DamagedData" in out and bad.name in out, f"rank {rank}: {out[-2000:]}"


def test_an_attach_waits_for_the_creator_to_size_the_segment():
    """What a loaded machine showed (a rank's attach between its peer's shm_open and ftruncate: "cannot mmap an
    empty file"), made deterministic: the segment exists with no size, its creator sizes it 0.3 s later."""
    from streaming.base.shared.memory import SharedMemory as StreamingSharedMemory

    name = f"gcc_test_{uuid.uuid4().hex[:12]}"
    fd = _posixshmem.shm_open(f"/{name}", os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
    sizer = threading.Timer(0.3, os.ftruncate, (fd, 64))
    try:
        sizer.start()
        shm = StreamingSharedMemory(name, size=64, auto_cleanup=False)  # create -> FileExistsError -> attach
        assert shm.shm.size == 64 and shm.opened_shms and not shm.created_shms
        shm.shm.close()
    finally:
        sizer.join()
        os.close(fd)
        _posixshmem.shm_unlink(f"/{name}")


# ---- registration (gcc/compat/streaming.py `register_prefix`) ----------------------------------------------------
def test_streaming_registers_through_the_adapter():
    from streaming.base import dataset

    assert dataset.get_shm_prefix is S.register_prefix


def test_a_number_another_job_took_after_the_scan_is_scanned_past(tmp_path, monkeypatch):
    """Between the leader's scan and its creation another job creates that number: the leader scans again and
    registers the next free one (Streaming's own died with FileExistsError); the job's other local ranks then find
    their leader's number by their folders."""
    from types import SimpleNamespace

    from streaming.base.shared.prefix import _pack_locals

    ours, theirs = [str(tmp_path / "ours")], [str(tmp_path / "theirs")]
    scans, taken = [], []
    real_scan = S._check_and_find_retrying

    def scan(*args, **kwargs):
        found = real_scan(*args, **kwargs)
        if not taken:  # the other job creates the number this first scan found, before our leader does
            data = _pack_locals(theirs, found)
            taken.append(S.SharedMemory(S._get_path(found, S.LOCALS), True, len(data), auto_cleanup=False))
            taken[0].buf[: len(data)] = data
        scans.append(found)
        return found

    monkeypatch.setattr(S, "_check_and_find_retrying", scan)
    try:
        prefix, shm = S.register_prefix(ours, [None], SimpleNamespace(is_local_leader=True))
        other = S._registered(scans[0])
        assert other == (theirs, scans[0]) and prefix != scans[0]  # theirs kept, ours on another number
        assert S._registered(prefix) == (ours, prefix)
        # a rank of ours that is not the node's leader: its leader's number, by its folders
        found, attached = S.register_prefix(ours, [None], SimpleNamespace(is_local_leader=False))
        assert found == prefix
        attached.shm.close()
        shm.cleanup()
    finally:
        S.release_shm([scans[0]])
