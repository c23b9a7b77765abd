"""The background checkpoint writer (gcc/training/checkpoint/background.py), in process: the staged copy is the step's state
whatever training does next; a write is complete or absent under its name; the ranks' agreement decides when it
is committed; a failed write raises on the main thread and leaves nothing; the relaunch's repair removes an
unfinished write. The end-to-end proof (a SIGKILL during a write resumes from the checkpoint before it, exactly) is
tests/training/test_train_e2e.py `test_exact_resume_after_sigkill`."""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
import zipfile
from types import SimpleNamespace

import pytest
import torch

from gcc import exit_codes
from gcc.errors import DiskFull
from gcc.training.callbacks.step_sync import StepSync
from gcc.training.checkpoint.background import CheckpointWrites, HostStaging
from gcc.training.checkpoint.files import LATEST, ckpt_dir, point_latest, repair_checkpoints


def _state(w: torch.Tensor, batch: int) -> dict:
    """A checkpoint state as Composer builds one: tensors, numbers, objects of its own, in dicts, lists, tuples;
    the parts that are not the model's grow as the run goes (a callback's record per save)."""
    return {
        "state": {"model": {"w": w}, "optimizers": [{"exp_avg": w * 2, "step": torch.tensor(3.0)}]},
        "timestamp": {"batch": batch},
        "callbacks": {"SaveClock": {"saves": list(range(batch))}},
        "rng": [("MT19937", (1, 2), None)],
    }


def test_the_staged_copy_is_the_steps_state_whatever_training_does_next():
    w = torch.arange(6.0).reshape(2, 3)
    state = _state(w, 9)
    staging = HostStaging(pin=False)
    copy = staging.stage(state)
    w.add_(100.0)  # the next step's update, in place
    state["timestamp"]["batch"] = 10
    assert torch.equal(copy["state"]["model"]["w"], torch.arange(6.0).reshape(2, 3))
    assert copy["timestamp"] == {"batch": 9} and copy["rng"] == [("MT19937", (1, 2), None)]
    assert torch.equal(copy["state"]["optimizers"][0]["exp_avg"], torch.arange(6.0).reshape(2, 3) * 2)
    assert copy["state"]["optimizers"][0]["step"].item() == 3.0
    assert copy["state"]["model"]["w"] is not w and copy["timestamp"] is not state["timestamp"]


def test_the_host_memory_is_allocated_at_the_first_save_and_refilled_at_the_next(tmp_path, caplog):
    staging = HostStaging(pin=False)
    with caplog.at_level(logging.INFO, logger="gcc"):
        first = staging.stage(_state(torch.ones(4, 5), 3))
    buffer = first["state"]["model"]["w"]
    assert staging.nbytes == 2 * 4 * 5 * 4 + 4 and staging.allocations == 1  # w, exp_avg (fp32), step
    assert "checkpoint staging: 1.64e-07 GB of host memory on this rank, allocated once" in caplog.text
    second = staging.stage(_state(torch.full((4, 5), 7.0), 6))
    assert second["state"]["model"]["w"] is buffer and torch.equal(buffer, torch.full((4, 5), 7.0))  # refilled
    assert second["timestamp"] == {"batch": 6} and staging.allocations == 1  # although the records grew
    assert second["callbacks"]["SaveClock"]["saves"] == list(range(6))
    assert torch.equal(second["state"]["optimizers"][0]["exp_avg"], torch.full((4, 5), 14.0))
    third = staging.stage(_state(torch.ones(2, 5), 9))  # another layout (a model changed shape): new memory
    assert third["state"]["model"]["w"] is not buffer and staging.allocations == 2 and staging.nbytes == 84


def _writes(tmp_path, hold_step: int = 0) -> tuple[CheckpointWrites, StepSync]:
    sync = StepSync(per_rank_batch=1)
    ckpt_dir(tmp_path).mkdir()
    return CheckpointWrites(sync, tmp_path, enabled=True, hold_step=hold_step), sync


def _reduce(sync: StepSync) -> dict[str, float]:
    """A step's reduce on this one rank (StepSync.after_train_batch): the totals every rank's flags make."""
    from composer.devices import DeviceCPU

    state = SimpleNamespace(device=DeviceCPU(), batch={"sample_id": []})
    sync.batch_start(state, None)  # type: ignore[arg-type]
    sync.after_train_batch(state, None)  # type: ignore[arg-type]
    return sync.totals


def test_a_write_is_committed_when_the_ranks_agree_it_is_complete(tmp_path):
    writes, sync = _writes(tmp_path)
    path = ckpt_dir(tmp_path) / "ep0-ba3-rank0.pt"
    gate = threading.Event()
    job = writes.write_file({"w": torch.ones(3)}, path, 3)
    writes.start(path.name, str(path), 3, lambda: (gate.wait(), job()), 0.0)
    try:
        assert _reduce(sync)["written"] == 0.0  # step 4's reduce: this rank's part is not written yet
        assert not writes.commit_due(4) and not path.exists()
    finally:  # the writer is let go whatever failed: a thread left waiting would hang pytest's exit (it joins it)
        gate.set()
    writes.pending.job.result()  # type: ignore[union-attr]
    assert zipfile.is_zipfile(path) and [p.name for p in ckpt_dir(tmp_path).iterdir()] == [path.name]
    assert _reduce(sync)["written"] == 1.0
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
    assert os.readlink(ckpt_dir(tmp_path) / LATEST) == path.name  # not pointed at the failed one
    assert repair_checkpoints(tmp_path) == path and not failed.exists()


def test_nothing_is_due_before_a_reduction_and_a_write_takes_its_seconds(tmp_path):
    """Before the first reduction of a launch no rank has said its part is written; a finished write carries how
    long it took from the save's start (GraceCheck reads it against the preemption grace)."""
    writes, sync = _writes(tmp_path)
    path = ckpt_dir(tmp_path) / "ep0-ba3-rank0.pt"
    t0 = time.perf_counter()
    writes.start(path.name, str(path), 3, writes.write_file({"w": torch.ones(3)}, path, 3), t0)
    assert sync.totals == {} and not writes.commit_due(4)
    write = writes.finish()
    assert 0 < write.seconds <= time.perf_counter() - t0
    writes.close(None, None)  # type: ignore[arg-type]


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


def test_a_held_write_says_so_and_writes_nothing_until_released(tmp_path, caplog):
    """`faults.hold_async_write_step`, which the kill-during-a-write launches rely on: that step's write stops before
    its rename (nothing under the checkpoint's name) and says why; another step's write is not held."""
    writes, _ = _writes(tmp_path, hold_step=3)
    other = ckpt_dir(tmp_path) / "ep0-ba2-rank0.pt"
    writes.start(other.name, str(other), 2, writes.write_file({"w": torch.ones(2)}, other, 2), 0.0)
    writes.finish()
    path = ckpt_dir(tmp_path) / "ep0-ba3-rank0.pt"
    with caplog.at_level(logging.WARNING, logger="gcc"):
        writes.start(path.name, str(path), 3, writes.write_file({"w": torch.ones(2)}, path, 3), 0.0)
        try:
            deadline = time.monotonic() + 60
            while "waits to be killed" not in caplog.text and time.monotonic() < deadline:
                time.sleep(0.01)
            assert not writes.pending.done() and not path.exists()  # type: ignore[union-attr]
        finally:  # a writer left waiting would hang pytest's exit
            writes.released.set()
    assert "faults.hold_async_write_step=3: the write of this checkpoint waits to be killed" in caplog.text
    assert writes.finish().name == path.name and path.is_file() and other.is_file()
    writes.close(None, None)  # type: ignore[arg-type]


def test_close_ends_the_writer_thread_and_needs_no_write(tmp_path):
    def writers() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name.startswith("checkpoint-writer")]

    before = writers()
    writes, _ = _writes(tmp_path)
    writes.close(None, None)  # type: ignore[arg-type]  # a launch that stopped before its first save
    path = ckpt_dir(tmp_path) / "ep0-ba3-rank0.pt"
    writes.start(path.name, str(path), 3, writes.write_file({"w": torch.ones(2)}, path, 3), 0.0)
    writes.finish()
    (mine,) = set(writers()) - set(before)  # another test's pool may end its threads meanwhile: only ours counts
    writes.close(None, None)  # type: ignore[arg-type]
    assert not mine.is_alive()


def test_a_committed_write_is_named_by_latest_counted_and_timed(tmp_path):
    """The saver's commit (AsyncCheckpointSaver, Composer's CheckpointSaver switched as the builder switches it):
    `latest` names the write, Composer's list of saved checkpoints and the launch's list of commits gain it, and the
    save clock gets the write's own time."""
    from composer.callbacks import CheckpointSaver

    from gcc.compat.composer import use_checkpoint_saver
    from gcc.training.checkpoint.background import AsyncCheckpointSaver
    from gcc.training.checkpoint.rotation import SaveClock

    writes, _ = _writes(tmp_path)
    saver = CheckpointSaver(folder=str(ckpt_dir(tmp_path)))
    clock = SaveClock()
    use_checkpoint_saver(
        SimpleNamespace(_checkpoint_saver=saver), AsyncCheckpointSaver, writes=writes, clock=clock, committed=[]
    )
    path = ckpt_dir(tmp_path) / "ep0-ba3-rank0.pt"
    writes.start(path.name, str(path), 3, writes.write_file({"w": torch.ones(2)}, path, 3), time.perf_counter())
    write = writes.finish()
    saver._commit(write)
    assert os.readlink(ckpt_dir(tmp_path) / LATEST) == path.name
    assert saver.saved_checkpoints == [str(path)] and saver.committed == [3] and clock.seconds == {3: write.seconds}
    writes.close(None, None)  # type: ignore[arg-type]


def test_a_write_never_goes_through_a_linked_checkpoints_folder(tmp_path):
    """The run folder is the root the writer trusts: a `checkpoints` that is a link out of it is refused, naming it,
    and nothing is written where it points."""
    from gcc.storage import LinkRefused

    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    run.mkdir()
    elsewhere.mkdir()
    ckpt_dir(run).symlink_to(elsewhere)
    writes = CheckpointWrites(StepSync(per_rank_batch=1), run, enabled=True, hold_step=0)
    path = ckpt_dir(run) / "ep0-ba3-rank0.pt"
    writes.start(path.name, str(path), 3, writes.write_file({"w": torch.ones(2)}, path, 3), 0.0)
    with pytest.raises(LinkRefused, match=r"checkpoints: .*link"):
        writes.finish()
    assert list(elsewhere.iterdir()) == []
    writes.close(None, None)  # type: ignore[arg-type]
