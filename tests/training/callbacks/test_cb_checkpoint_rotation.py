"""CheckpointRotation (gcc/training/checkpoint/rotation.py): after each of Composer's saves, keep the
`save_num_checkpoints_to_keep` newest checkpoints up to `latest`, those of earlier launches included (Composer's own rotation
only knows this process's saves), never one newer than `latest`; and log what each new save cost, once:
`checkpoint ep0-ba6-rank0.pt: 0.0 s, 1.2e-06 GB`."""

from __future__ import annotations

import re

from _cbfit import Fit, records
from composer.callbacks import CheckpointSaver
from composer.core import Timestamp

from gcc.training.callbacks import CheckpointRotation
from gcc.training.checkpoint.files import ckpt_dir, disk_gb, latest_checkpoint, point_latest
from gcc.training.config import TrainConfig

LOGGER = "gcc.training.checkpoint.rotation"


def saver(run_dir, every: int) -> CheckpointSaver:
    """Composer's saver as gcc's Trainer configures it (build_trainer): its own rotation off."""
    return CheckpointSaver(folder=str(ckpt_dir(run_dir)), save_interval=f"{every}ba", num_checkpoints_to_keep=-1)


def names(run_dir) -> list[str]:
    return sorted(p.name for p in ckpt_dir(run_dir).iterdir() if not p.is_symlink())


def resumed_at(fit: Fit, batch: int) -> None:
    """Where autoresume puts the timestamp of a launch that resumes from step `batch`."""
    fit.state.timestamp = Timestamp(batch=batch, sample=2 * batch, batch_in_epoch=batch, sample_in_epoch=2 * batch)


def earlier_launch(run_dir, steps: int, every: int) -> None:
    """A launch that saved every `every` steps and rotated nothing (Composer alone)."""
    fit = Fit([saver(run_dir, every)], max_steps=100)
    fit.fit_start()
    for _ in range(steps):
        fit.step()


def test_keeps_the_newest_across_restarts_and_logs_each_new_save_once(tmp_path):
    run_dir = tmp_path / "run"
    earlier_launch(run_dir, steps=4, every=2)
    assert names(run_dir) == ["ep0-ba2-rank0.pt", "ep0-ba4-rank0.pt"]
    keep = TrainConfig().save_num_checkpoints_to_keep
    assert keep == 2
    rotation = CheckpointRotation(run_dir, keep)  # built before the Trainer, as build_callbacks does
    fit = Fit([rotation.clock, saver(run_dir, 2), rotation], max_steps=8)
    resumed_at(fit, 4)
    fit.fit_start()
    with records(LOGGER) as got:
        fit.step()  # step 5: no save
        assert names(run_dir) == ["ep0-ba2-rank0.pt", "ep0-ba4-rank0.pt"] and got == []
        fit.step()  # step 6: a save; the earlier launch's ba2 goes
        assert names(run_dir) == ["ep0-ba4-rank0.pt", "ep0-ba6-rank0.pt"]
        [line] = [r.getMessage() for r in got]
        ba6 = ckpt_dir(run_dir) / "ep0-ba6-rank0.pt"
        assert re.fullmatch(rf"checkpoint ep0-ba6-rank0\.pt: \d+\.\d s, {re.escape(f'{disk_gb(ba6):.3g}')} GB", line)
        fit.step()
        fit.step()  # step 8: the last, saved
        assert names(run_dir) == ["ep0-ba6-rank0.pt", "ep0-ba8-rank0.pt"]
        assert latest_checkpoint(run_dir).name == "ep0-ba8-rank0.pt"
        fit.fit_end()  # rotates again; no new checkpoint, so no second line
        assert names(run_dir) == ["ep0-ba6-rank0.pt", "ep0-ba8-rank0.pt"]
    assert [r.getMessage().split(":")[0] for r in got] == ["checkpoint ep0-ba6-rank0.pt", "checkpoint ep0-ba8-rank0.pt"]


def test_a_checkpoint_newer_than_latest_is_left_alone(tmp_path):
    run_dir = tmp_path / "run"
    rotation = CheckpointRotation(run_dir, keep=1)
    fit = Fit([rotation.clock, saver(run_dir, 2), rotation], max_steps=100)
    fit.fit_start()
    fit.step()
    fit.step()
    leftover = ckpt_dir(run_dir) / "ep0-ba20-rank0.pt"  # e.g. what a killed launch left; `repair` deals with it
    leftover.write_bytes(b"partial")
    fit.step()
    fit.step()
    assert names(run_dir) == ["ep0-ba20-rank0.pt", "ep0-ba4-rank0.pt"]


def test_sharded_checkpoint_folders_are_rotated_whole_and_sized_by_their_shards(tmp_path):
    """FSDP: each checkpoint a folder of DCP shards and its .metadata (written here as Composer lays them out)."""
    run_dir = tmp_path / "run"
    rotation = CheckpointRotation(run_dir, keep=1)
    fit = Fit([rotation.clock, rotation], max_steps=100)
    fit.fit_start()
    with records(LOGGER) as got:
        for step, shard_bytes in ((3, 1000), (6, 3000)):
            while fit.step_count < step - 1:
                fit.step()
            folder = ckpt_dir(run_dir) / f"ep0-ba{step}"
            folder.mkdir(parents=True)
            for f in ("__0_0.distcp", "__1_0.distcp"):
                (folder / f).write_bytes(b"x" * shard_bytes)
            (folder / ".metadata").write_bytes(b"m" * 10)
            point_latest(run_dir, folder.name)
            fit.step()
    assert names(run_dir) == ["ep0-ba6"]
    assert sorted(p.name for p in (ckpt_dir(run_dir) / "ep0-ba6").iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
    ]
    lines = [r.getMessage() for r in got]
    assert len(lines) == 2 and lines[1].startswith("checkpoint ep0-ba6: ")
    assert lines[1].endswith(f", {6010 / 1e9:.3g} GB")
