"""Faults that do not kill the process (docs/training.md, exit codes): damaged data (6), a rank that stalls (5),
object storage that goes away (7) and a full disk (8) each stop every rank within a bounded time with a message
naming the file, object or disk; nothing partial is kept, and the relaunch after the repair continues exactly."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from _launch import WORKER, exact, finish, launch, ok, rows, start_bg, stopped_copy, wait_for

from gcc.data import convert as C
from gcc.synth.world import make_prepared
from gcc.training.run_folder import checkpoint_step

SHARD = "train/chunk_00001/shard.00000.mds"


def _flip(path, start: int, n: int = 64) -> None:
    b = bytearray(path.read_bytes())
    for i in range(start, min(start + n, len(b))):
        b[i] ^= 0xFF
    path.write_bytes(bytes(b))


def _damage(shards, damage: str) -> Path:
    """Damage the copy `shards` of the e2e data as `damage` says; returns the damaged file's path."""
    bad = shards / ("train/index.json" if damage == "index" else SHARD)
    if damage == "bytes":
        _flip(bad, bad.stat().st_size // 2)
    elif damage in ("cut", "index"):
        bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 3])
    else:
        bad.unlink()
    return bad


def _stopped_on_damage(r, bad: Path, took: float) -> None:
    out = r.stdout + r.stderr
    assert r.returncode == 6, out[-3000:]  # the launcher's code is the faulting rank's, not a peer's collateral
    assert "damaged data" in out and str(bad) in out, out[-3000:]
    assert "Traceback" not in out, out[-3000:]  # each rank says why it stopped; no rank dies on a bare error
    assert took < 240, f"took {took:.0f} s to stop"


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["bytes", "cut", "missing"])
def test_damaged_data_stops_the_run_naming_the_file(damage, e2e_shards, tmp_path):
    """Met in the loader worker: every rank stops with exit 6 naming the file, before any step, and nothing is
    written that a relaunch could take for progress. A cut shard under the launcher on 2 ranks (every rank stops,
    the launcher's code is the faulting rank's); flipped bytes and a missing shard, met by the same read in the
    same worker, on one rank alone. A cut index (met where the dataset is opened), under the launcher on 2 ranks:
    test_a_run_stopped_by_damaged_data_resumes_exactly_once_the_data_is_repaired, whose first launch meets it."""
    shards = tmp_path / "shards"
    shutil.copytree(e2e_shards, shards)
    bad = _damage(shards, damage)
    run_dir = tmp_path / "run"
    t0 = time.time()
    r = launch(run_dir, shards, WORKER, timeout=300, direct=damage in ("bytes", "missing"))
    _stopped_on_damage(r, bad, time.time() - t0)
    assert not list((run_dir / "checkpoints").glob("ep*")) and not list(run_dir.glob("step-*"))
    assert not (run_dir / "train_log.csv").exists() or rows(run_dir) == []


@pytest.mark.slow
def test_a_run_stopped_by_damaged_data_resumes_exactly_once_the_data_is_repaired(e2e_shards, reference, tmp_path):
    """A run at step 9's checkpoint (tests/_launch.py stopped_copy) relaunched under the launcher on 2 ranks on
    data whose index was damaged: every rank stops with exit 6 naming the file (the launcher's code is the faulting
    rank's) before any step, and writes nothing a relaunch could take for progress (its checkpoints, exports and
    rows as they were); relaunched on the repaired data it resumes from step 9 and gives the uninterrupted run's
    rows exactly. The run folder is a `cp -rL` copy (`latest` a file, not a link): the launch finds the newest
    complete checkpoint itself and points `latest` at it."""
    shards = tmp_path / "shards"
    shutil.copytree(e2e_shards, shards)
    bad = _damage(shards, "index")
    run_dir = stopped_copy(reference, tmp_path / "run", at=9, dereferenced=True)
    before = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    exports, logged = sorted(p.name for p in run_dir.glob("step-*")), rows(run_dir)
    t0 = time.time()
    r = launch(run_dir, shards, WORKER, timeout=300)
    _stopped_on_damage(r, bad, time.time() - t0)
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == before
    assert sorted(p.name for p in run_dir.glob("step-*")) == exports and rows(run_dir) == logged
    assert os.readlink(run_dir / "checkpoints" / "latest-rank0.pt") == "ep1-ba9-rank0.pt"

    shutil.copyfile(e2e_shards / "train" / "index.json", bad)  # repaired
    r = ok(launch(run_dir, shards))
    assert f"resuming from {run_dir / 'checkpoints' / 'ep1-ba9-rank0.pt'}" in r.stdout, r.stdout[-3000:]
    assert exact(rows(run_dir)) == exact(rows(reference))


@pytest.mark.slow
def test_a_rank_that_completes_no_step_leaves_every_stack_and_exits_5(e2e_shards, tmp_path):
    """Rank 1's loader stops delivering at step 15 (rank 0 then waits in a collective): once 10 steps are timed
    the deadline is max(stall_floor_s, 20 × the median step), so both ranks stop with their stacks."""
    run_dir = tmp_path / "run"
    t0 = time.time()
    r = launch(
        run_dir,
        e2e_shards,
        WORKER,
        "max_duration=40",
        "faults.stall_step=15",
        "faults.stall_rank=1",
        "stall_timeout_s=300",
        "stall_floor_s=8",
        "eval_interval=0",
        timeout=400,
    )
    took = time.time() - t0
    out = r.stdout + r.stderr
    assert r.returncode == 5, out[-3000:]  # whichever rank's deadline passed first, the other follows with 5
    assert took < 300, f"took {took:.0f} s"  # far below stall_timeout_s: the deadline scaled to the steps
    log = (run_dir / "train.log").read_text()  # each rank's watchdog line, though its main thread hangs
    for rank in (0, 1):
        text = (run_dir / "stacks" / f"rank{rank}.txt").read_text()
        assert f"rank {rank} pid" in text and "no step completed within 8 s" in text, text[:500]
        assert "--- thread MainThread" in text
        # its own deadline's line, or the line of a rank stopped by the other's ("stopped with rank 0, which met a
        # fault: no step completed ..."): whichever passed first
        line = next((x for x in log.splitlines() if f" rank {rank} ERROR gcc.train: rank {rank}: " in x), "")
        assert "no step completed within 8 s" in line, log[-3000:]
    assert max(int(x["step"]) for x in rows(run_dir)) == 14  # step 15 never completed


@pytest.fixture
def small_disk(tmp_path):
    """A 64 MB tmpfs of this test's own (mounting needs root; without the right the test is skipped, saying so)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"a size-limited tmpfs needs the right to mount (root): mount said {r.stderr.strip()!r}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(mnt, leave: int):
    """A file that takes all but `leave` bytes of the filesystem."""
    filler = mnt / "filler"
    with open(filler, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, shutil.disk_usage(mnt).free - leave)
    return filler


@pytest.mark.slow
@pytest.mark.parametrize("during", ["checkpoint", "export"])
def test_a_full_disk_stops_the_run_keeping_nothing_partial(during, e2e_shards, reference, small_disk):
    """The run folder on a small tmpfs, at step 9's checkpoint (tests/_launch.py stopped_copy), then the disk is
    filled to 64 KB: the relaunch fails writing the step-12 checkpoint (or the step-10 export), exits 8 naming the
    disk, and leaves no partial file. With the space freed, the next relaunch (after the checkpoint's failure)
    resumes from step 9 and gives the uninterrupted run's rows exactly."""
    run_dir = stopped_copy(reference, small_disk / "run", at=9)
    exports = sorted(p.name for p in run_dir.glob("step-*"))
    filler = _fill(small_disk, leave=64 << 10)
    cadence = (
        ["eval_interval=0", "export_every=0"] if during == "checkpoint" else ["eval_interval=0", "export_every=10"]
    )
    r = launch(run_dir, e2e_shards, *cadence, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 8, out[-3000:]
    assert "disk full: no space left on device" in out and f"filesystem {small_disk}" in out, out[-3000:]
    assert "last complete checkpoint: ep1-ba9-rank0.pt" in out, out[-3000:]
    if during == "export":  # the message names the file
        assert f"no space left on device writing {run_dir / 'step-10.safetensors'}" in out, out[-3000:]
    else:  # Composer's torch.save does not say which file; the cut one is removed at once, saying so
        assert re.search(r"removing incomplete/stale ep\d+-ba12-rank0\.pt", out), out[-3000:]
    ckpts = run_dir / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["ep1-ba9-rank0.pt", "latest-rank0.pt"]
    assert os.readlink(ckpts / "latest-rank0.pt") == "ep1-ba9-rank0.pt"
    assert sorted(p.name for p in run_dir.glob("step-*")) == exports  # no partial export
    assert not [p for p in run_dir.rglob("*.tmp*")], "a temporary file was left behind"
    assert max(int(x["step"]) for x in rows(run_dir)) >= 10  # it did train on before the write that failed
    if during == "export":  # that a relaunch then resumes exactly: the checkpoint case
        return

    filler.unlink()  # space freed
    r = ok(launch(run_dir, e2e_shards))
    assert "resuming from" in r.stdout and "ep1-ba9-rank0.pt" in r.stdout
    assert exact(rows(run_dir)) == exact(rows(reference))


@pytest.mark.slow
def test_object_storage_going_away_stops_the_run_naming_the_object_and_the_relaunch_resumes(tmp_path, monkeypatch):
    """Shards on a real S3 server (this test's own moto, one clip per shard, so a 2-rank epoch streams for 30 steps
    from a cold cache) stopped once the first checkpoint is written: reads retry (bounded), then the run exits 7
    naming the object; the checkpoint is intact, and with the server back the relaunch resumes from it, keeps the
    rows before it and trains on past where the first launch stopped (reading objects that launch never got).
    That a resume after a fault gives the uninterrupted run's rows exactly:
    test_a_run_stopped_by_damaged_data_resumes_exactly_once_the_data_is_repaired."""
    from s3server import S3Server

    local = tmp_path / "shards"
    C.convert(make_prepared(tmp_path, clips=130, seed=5), str(local), chunk_clips=1, progress=False)
    steps = ["max_duration=30", "eval_interval=0", "export_every=0"]
    server = S3Server()  # not the session's: this one is stopped mid-run
    try:
        for k, v in server.env().items():
            monkeypatch.setenv(k, v)
        bucket = server.new_bucket()
        remote = server.upload_tree(local, bucket, "shards")
        run_dir = tmp_path / "run"
        p = start_bg(run_dir, remote, WORKER, *steps)  # the downloads fail in the loader worker
        wait_for(lambda: (run_dir / "checkpoints" / "latest-rank0.pt").exists(), p, "the first checkpoint")
        server.stop()
        t0 = time.time()
        out = finish(p, 300)
        assert p.returncode == 7, out[-3000:]
        assert f"storage unavailable: {remote}/train/" in out, out[-3000:]  # names the object
        assert "Traceback" not in out, out[-3000:]
        assert time.time() - t0 < 150, "the retries are bounded"
        latest = os.readlink(run_dir / "checkpoints" / "latest-rank0.pt")
        before = rows(run_dir)
        stopped = max(int(x["step"]) for x in before)
        assert stopped < 30, "the run ended before the server went away: nothing tested"

        server.start()  # back, with the same objects
        server.new_bucket(bucket)
        server.upload_tree(local, bucket, "shards")
        # a few steps past the last one done: its reads ahead then go past every object the first launch got
        end = min(30, stopped + 4)
        r = ok(launch(run_dir, remote, *steps, f"max_duration={end}"))
        assert f"resuming from {run_dir / 'checkpoints' / latest}" in r.stdout
        after = rows(run_dir)
        kept = checkpoint_step(latest)
        assert after[:kept] == before[:kept]
        assert [int(x["step"]) for x in after] == list(range(1, end + 1))
    finally:
        server.stop()
