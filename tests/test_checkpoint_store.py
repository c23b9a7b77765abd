"""The remote side of `checkpoint_dir: s3://...` (gcc/train/checkpoint_store.py) against a real S3 server on
loopback (moto): the commit point, the guard between two launches, the repair of uploads cut short, rotation and the
download into a run folder. The end-to-end runs are in tests/test_remote_checkpoints.py."""
from __future__ import annotations

import os
import zipfile

import pytest

from gcc.train.checkpoint_store import CheckpointStore, TakenOver
from gcc.train.run_folder import LATEST, ckpt_dir, is_complete, latest_checkpoint


def ddp_file(path, payload: bytes = b"weights"):
    """A stand-in for a torch.save file: a zip, which is what `is_complete` checks."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("data.pkl", payload)
    return path


def put_ddp(store: CheckpointStore, tmp_path, name: str) -> None:
    store.upload(ddp_file(tmp_path / "src" / name, name.encode()), name)


def put_dcp(store: CheckpointStore, tmp_path, name: str, ranks: int = 2) -> None:
    for f in [f"__{r}_0.distcp" for r in range(ranks)] + [".metadata"]:
        src = tmp_path / "src" / name / f
        src.parent.mkdir(parents=True, exist_ok=True)
        src.write_bytes(f"{name}/{f}".encode())
        store.upload(src, f"{name}/{f}")


def test_the_newest_launch_owns_the_prefix_and_an_older_one_commits_nothing(s3_bucket, tmp_path):
    first, second = CheckpointStore(f"{s3_bucket}/run"), CheckpointStore(f"{s3_bucket}/run/")
    a = first.claim()
    put_ddp(first, tmp_path, "ep0-ba3-rank0.pt")
    first.commit("ep0-ba3-rank0.pt", a)
    b = second.claim()  # a second launch on the same prefix
    put_ddp(first, tmp_path, "ep0-ba6-rank0.pt")
    with pytest.raises(TakenOver, match=rf"{s3_bucket}/run: another launch claimed this checkpoint prefix \(pid "):
        first.commit("ep0-ba6-rank0.pt", a)
    assert first.latest() == "ep0-ba3-rank0.pt"  # the older launch moved nothing
    second.commit("ep0-ba6-rank0.pt", b)
    assert first.latest() == "ep0-ba6-rank0.pt"


def test_repair_removes_uploads_newer_than_latest_and_rotation_keeps_n(s3_bucket, tmp_path):
    store = CheckpointStore(f"{s3_bucket}/run")
    launch = store.claim()
    for step in (3, 6, 9):
        put_dcp(store, tmp_path, f"ep0-ba{step}")
        store.commit(f"ep0-ba{step}", launch)
    put_dcp(store, tmp_path, "ep1-ba12", ranks=1)  # killed mid-upload: never committed
    assert list(store.checkpoints()) == ["ep0-ba3", "ep0-ba6", "ep0-ba9", "ep1-ba12"]
    assert store.repair() == "ep0-ba9"
    assert list(store.checkpoints()) == ["ep0-ba3", "ep0-ba6", "ep0-ba9"]
    assert store.rotate(2) == ["ep0-ba3"]
    assert list(store.checkpoints()) == ["ep0-ba6", "ep0-ba9"]
    assert store.checkpoints()["ep0-ba9"] == ["ep0-ba9/.metadata", "ep0-ba9/__0_0.distcp", "ep0-ba9/__1_0.distcp"]


def test_repair_without_any_commit_removes_everything(s3_bucket, tmp_path):
    store = CheckpointStore(f"{s3_bucket}/run")
    put_ddp(store, tmp_path, "ep0-ba3-rank0.pt")
    assert store.repair() is None and store.checkpoints() == {}


@pytest.mark.parametrize("kind", ["ddp", "dcp"])
def test_fetch_downloads_whole_and_points_latest(kind, s3_bucket, tmp_path):
    store = CheckpointStore(f"{s3_bucket}/run")
    launch = store.claim()
    name = "ep1-ba6-rank0.pt" if kind == "ddp" else "ep1-ba6"
    (put_ddp if kind == "ddp" else put_dcp)(store, tmp_path, name)
    store.commit(name, launch)
    run_dir = tmp_path / "fresh"
    older = ddp_file(ckpt_dir(run_dir) / "ep0-ba3-rank0.pt")
    os.symlink(older.name, ckpt_dir(run_dir) / LATEST)
    leftover = ckpt_dir(run_dir) / f".{name}.fetch999"  # a fetch killed earlier
    leftover.mkdir()
    got = store.fetch(name, run_dir)
    assert got == ckpt_dir(run_dir) / name and is_complete(got)
    assert latest_checkpoint(run_dir) == got.resolve()
    assert not leftover.exists()
    src = tmp_path / "src" / name
    if kind == "ddp":
        assert got.read_bytes() == src.read_bytes()
    else:
        assert sorted(p.name for p in got.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
        assert all((got / p.name).read_bytes() == p.read_bytes() for p in src.iterdir())


def test_record_round_trip(s3_bucket):
    store = CheckpointStore(f"{s3_bucket}/run")
    assert store.read_record() is None
    store.write_record({"signature": {"seed": 1}, "lineage": {"init_ckpt": ""}})
    assert store.read_record() == {"signature": {"seed": 1}, "lineage": {"init_ckpt": ""}}
