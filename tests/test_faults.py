"""Faults that do not kill the process: damaged data stops every rank with a message naming the shard, within a
bounded time (exit code 6), and a relaunch after the data is repaired continues the run exactly (docs/training.md, exit codes)."""
from __future__ import annotations

import shutil
import time

import pytest
from _launch import exact, launch, ok, rows

SHARD = "train/chunk_00001/shard.00000.mds.zstd"


def _flip(path, start: int, n: int = 64) -> None:
    b = bytearray(path.read_bytes())
    for i in range(start, min(start + n, len(b))):
        b[i] ^= 0xFF
    path.write_bytes(bytes(b))


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["bytes", "cut", "missing", "index"])
def test_damaged_shard_stops_the_run_naming_it_and_the_repaired_data_resumes_exactly(damage, e2e_shards, reference,
                                                                                      tmp_path):
    shards = tmp_path / "shards"
    shutil.copytree(e2e_shards, shards)
    name = "train/index.json" if damage == "index" else SHARD
    bad = shards / name
    if damage == "bytes":
        _flip(bad, bad.stat().st_size // 2)
    elif damage in ("cut", "index"):
        bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 3])
    else:
        bad.unlink()
    run_dir = tmp_path / "run"
    t0 = time.time()
    r = launch(run_dir, shards, timeout=300)
    took = time.time() - t0
    out = r.stdout + r.stderr
    assert r.returncode != 0, out[-3000:]
    assert "damaged data" in out and str(bad) in out, out[-3000:]
    assert "exited with code 6" in out, out[-3000:]  # the launcher names the rank's exit code (docs: 6)
    assert took < 240, f"took {took:.0f} s to stop"

    shutil.copyfile(e2e_shards / name, bad)  # repaired
    ok(launch(run_dir, shards))
    assert exact(rows(run_dir)) == exact(rows(reference))


@pytest.mark.slow
def test_a_rank_that_completes_no_step_leaves_every_stack_and_exits_5(e2e_shards, tmp_path):
    """Rank 1's loader stops delivering at step 15 (rank 0 then waits in a collective): once 10 steps are timed
    the deadline is max(stall_floor_s, 20 × the median step), so both ranks stop with their stacks."""
    run_dir = tmp_path / "run"
    t0 = time.time()
    r = launch(run_dir, e2e_shards, "max_steps=40", "inject_stall_step=15", "inject_stall_rank=1",
               "stall_timeout_s=300", "stall_floor_s=8", "val_every=0", timeout=400)
    took = time.time() - t0
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "exited with code 5" in out, out[-3000:]
    assert took < 300, f"took {took:.0f} s"  # far below stall_timeout_s: the deadline scaled to the steps
    for rank in (0, 1):
        text = (run_dir / "stacks" / f"rank{rank}.txt").read_text()
        assert f"rank {rank} pid" in text and "no step completed within 8 s" in text, text[:500]
        assert "--- thread MainThread" in text
    assert max(int(x["step"]) for x in rows(run_dir)) == 14  # step 15 never completed
