"""The background checkpoint writer (gcc/training/async_checkpoint.py), in process: the staged copy is the step's state
whatever training does next; a write is complete or absent under its name; the ranks' agreement decides when it
is committed; a failed write raises on the main thread and leaves nothing; the relaunch's repair removes an
unfinished write. The end-to-end proof (a SIGKILL during a write resumes from the checkpoint before it, exactly) is
tests/training/test_train_e2e.py `test_exact_resume_after_sigkill`."""

from __future__ import annotations

import errno
import threading
import zipfile

import pytest
import torch

from gcc import exit_codes
from gcc.errors import DiskFull
from gcc.training.async_checkpoint import CheckpointWrites, host_copy
from gcc.training.callbacks.step_sync import StepSync
from gcc.training.run_folder import ckpt_dir, point_latest, repair_checkpoints


def test_the_staged_copy_is_the_steps_state_whatever_training_does_next():
    w = torch.arange(6.0).reshape(2, 3)
    state = {"state": {"model": {"w": w}, "optimizers": [{"exp_avg": w * 2}], "timestamp": {"batch": 9}}, "rng": [1]}
    copy = host_copy(state)
    w.add_(100.0)  # the next step's update, in place
    state["state"]["timestamp"]["batch"] = 10
    assert torch.equal(copy["state"]["model"]["w"], torch.arange(6.0).reshape(2, 3))
    assert copy["state"]["timestamp"] == {"batch": 9} and copy["rng"] == [1]
    assert torch.equal(copy["state"]["optimizers"][0]["exp_avg"], torch.arange(6.0).reshape(2, 3) * 2)
    left = host_copy(state, tensors=False)  # DCP stages the tensors itself: they are the live ones
    assert left["state"]["model"]["w"] is w and left["state"]["timestamp"] is not state["state"]["timestamp"]


def _writes(tmp_path, hold_step: int = 0) -> tuple[CheckpointWrites, StepSync]:
    sync = StepSync(per_rank_batch=1)
    ckpt_dir(tmp_path).mkdir()
    return CheckpointWrites(sync, tmp_path, enabled=True, hold_step=hold_step), sync


def test_a_write_is_committed_when_the_ranks_agree_it_is_complete(tmp_path):
    writes, sync = _writes(tmp_path)
    path = ckpt_dir(tmp_path) / "ep0-ba3-rank0.pt"
    gate = threading.Event()
    job = writes.write_file({"w": torch.ones(3)}, path, 3)
    writes.start(path.name, str(path), 3, lambda: (gate.wait(), job()), 0.0)
    sync.totals = {"written": 0.0}  # step 4's reduce: not done on every rank
    assert not writes.commit_due(4) and not path.exists()
    gate.set()
    writes.pending.job.result()  # type: ignore[union-attr]
    assert zipfile.is_zipfile(path) and [p.name for p in ckpt_dir(tmp_path).iterdir()] == [path.name]
    sync.totals = {"written": 1.0}
    assert not writes.commit_due(3)  # the save's own step: its reduce came before the save
    assert writes.commit_due(5)
    assert writes.finish().name == path.name and writes.pending is None
    assert torch.equal(torch.load(path)["w"], torch.ones(3))
    writes.close(None, None)  # type: ignore[arg-type]


def test_a_launch_that_stops_during_a_write_commits_it_once_complete(tmp_path):
    """A non-finite loss stops every rank, closing the Trainer, with the last save still being written: the write
    ends and is committed, so the relaunch resumes from it (the repair would remove a checkpoint newer than `latest`)."""
    writes, _ = _writes(tmp_path)
    old = ckpt_dir(tmp_path) / "ep0-ba3-rank0.pt"
    torch.save({"w": torch.zeros(3)}, old)
    point_latest(tmp_path, old.name)
    path = ckpt_dir(tmp_path) / "ep1-ba6-rank0.pt"
    writes.start(path.name, str(path), 6, writes.write_file({"w": torch.ones(3)}, path, 6), 0.0)
    writes.close(None, None)  # type: ignore[arg-type]
    assert repair_checkpoints(tmp_path) == path and old.exists()
    failed = ckpt_dir(tmp_path) / "ep1-ba9-rank0.pt"  # a failed write is not committed
    writes.start(failed.name, str(failed), 9, writes.write_file({"x": threading.Lock()}, failed, 9), 0.0)
    writes.close(None, None)  # type: ignore[arg-type]
    assert repair_checkpoints(tmp_path) == path and not failed.exists()


def test_a_failed_write_raises_on_the_main_thread_and_leaves_nothing(tmp_path):
    writes, _ = _writes(tmp_path)
    path = ckpt_dir(tmp_path) / "ep0-ba3-rank0.pt"
    writes.start(path.name, str(path), 3, writes.write_file({"x": threading.Lock()}, path, 3), 0.0)  # unpicklable
    with pytest.raises(TypeError, match="lock"):
        writes.finish()
    assert list(ckpt_dir(tmp_path).iterdir()) == []
    writes.close(None, None)  # type: ignore[arg-type]


def test_a_full_disk_during_a_background_write_is_the_runs_disk_fault(tmp_path, monkeypatch):
    """What trainer.py's `as_fault` turns into exit 8 with the message a synchronous write gives: DiskFull naming the
    checkpoint and its filesystem, raised on the main thread."""
    writes, _ = _writes(tmp_path)
    path = ckpt_dir(tmp_path) / "ep0-ba3-rank0.pt"

    def no_space(obj, f):
        f.write(b"PK partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", no_space)
    writes.start(path.name, str(path), 3, writes.write_file({"w": torch.ones(2)}, path, 3), 0.0)
    with pytest.raises(DiskFull, match=f"no space left on device writing {path}") as e:
        writes.finish()
    assert e.value.exit_code == exit_codes.DISK and list(ckpt_dir(tmp_path).iterdir()) == []
    writes.close(None, None)  # type: ignore[arg-type]


def test_the_relaunch_removes_an_unfinished_write_and_keeps_latest(tmp_path):
    ckpts = ckpt_dir(tmp_path)
    ckpts.mkdir()
    torch.save({"w": 1}, ckpts / "ep0-ba6-rank0.pt")
    point_latest(tmp_path, "ep0-ba6-rank0.pt")
    (ckpts / "ep0-ba9-rank0.pt.tmp4242").write_bytes(b"PK")  # a write the SIGKILL cut
    (ckpts / "notes.tmp1").write_text("not ours")
    assert repair_checkpoints(tmp_path) == ckpts / "ep0-ba6-rank0.pt"
    assert sorted(p.name for p in ckpts.iterdir()) == ["ep0-ba6-rank0.pt", "latest-rank0.pt", "notes.tmp1"]
