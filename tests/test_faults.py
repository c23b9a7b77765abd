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
