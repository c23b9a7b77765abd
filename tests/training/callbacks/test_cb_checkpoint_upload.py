"""CheckpointUpload (gcc/training/checkpoint/upload.py), against a real S3 server on loopback (moto): after
each checkpoint Composer's CheckpointSaver writes, the launch that owns `save_folder` uploads it, commits it (the
head names it with each file's size and sha256) and rotates the remote checkpoints to `save_num_checkpoints_to_keep`; steps
without a save upload nothing, and a launch that lost the prefix to another raises TakenOver and uploads nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from _cbfit import Fit, records
from composer.callbacks import CheckpointSaver

from gcc import storage
from gcc.training.callbacks import CheckpointUpload
from gcc.training.checkpoint.files import ckpt_dir
from gcc.training.checkpoint.store import CheckpointStore, TakenOver
from gcc.training.config import TrainConfig

LOGGER = "gcc.training.checkpoint.upload"


def launch_with_upload(store: CheckpointStore, launch: str, run_dir: Path, every: int = 3, max_steps: int = 100):
    keep = TrainConfig().save_num_checkpoints_to_keep  # 2
    saver = CheckpointSaver(folder=str(ckpt_dir(run_dir)), save_interval=f"{every}ba", num_checkpoints_to_keep=-1)
    upload = CheckpointUpload(store, launch, run_dir, keep)  # after the saver, as the trainer appends it
    fit = Fit([saver, upload], max_steps=max_steps)
    fit.fit_start()
    return fit


def test_each_save_is_uploaded_committed_with_its_digest_and_rotated(s3_bucket, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a relative run_dir, as yamls give it (runs/demo/train)
    store = CheckpointStore(f"{s3_bucket}/run")
    launch = store.claim()
    fit = launch_with_upload(store, launch, Path("run"), max_steps=9)
    with records(LOGGER) as got:
        fit.step()
        fit.step()
        assert store.latest() is None and store.checkpoints() == {}  # no save yet, nothing uploaded
        fit.step()
        head = store.head()
        assert head.launch == launch and head.checkpoint == "ep0-ba3-rank0.pt"
        local = tmp_path / "run" / "checkpoints" / "ep0-ba3-rank0.pt"
        assert head.files == {"ep0-ba3-rank0.pt": {"size": local.stat().st_size, "sha256": storage.sha256_file(local)}}
        fit.step()  # step 4: no save, nothing new
        assert list(store.checkpoints()) == ["ep0-ba3-rank0.pt"] and store.latest() == "ep0-ba3-rank0.pt"
        for _ in range(5):
            fit.step()  # saves at 6 and 9 (the last step)
        fit.fit_end()  # the same checkpoint is not committed twice
    assert store.latest() == "ep0-ba9-rank0.pt"
    assert list(store.checkpoints()) == [
        "ep0-ba6-rank0.pt",
        "ep0-ba9-rank0.pt",
    ]  # save_num_checkpoints_to_keep remotely
    remote = tmp_path / "fetched.pt"
    storage.download_file(f"{store.ckpts}/ep0-ba9-rank0.pt", str(remote))
    assert remote.read_bytes() == (tmp_path / "run" / "checkpoints" / "ep0-ba9-rank0.pt").read_bytes()
    lines = [r.getMessage() for r in got]
    assert [line.split(" in ")[0] for line in lines] == [
        f"checkpoint ep0-ba{b}-rank0.pt committed to {store.ckpts}" for b in (3, 6, 9)
    ]
    assert lines[2].endswith("; rotated out ep0-ba3-rank0.pt")


def test_a_launch_that_lost_the_prefix_stops_and_uploads_nothing(s3_bucket, tmp_path):
    store = CheckpointStore(f"{s3_bucket}/run")
    launch = store.claim()
    fit = launch_with_upload(store, launch, tmp_path / "run")
    for _ in range(3):
        fit.step()
    assert store.latest() == "ep0-ba3-rank0.pt"
    newer = CheckpointStore(f"{s3_bucket}/run").claim()  # another launch claims the prefix
    fit.step()
    fit.step()
    with pytest.raises(TakenOver, match="another launch claimed this checkpoint prefix"):
        fit.step()  # step 6's save
    assert (tmp_path / "run" / "checkpoints" / "ep0-ba6-rank0.pt").is_file()  # Composer wrote it locally ...
    assert list(store.checkpoints()) == ["ep0-ba3-rank0.pt"]  # ... but it was never uploaded
    head = store.head()
    assert head.launch == newer and head.checkpoint == "ep0-ba3-rank0.pt"
