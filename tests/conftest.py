"""Shared fixtures. `prepared_tiny` is a session-wide synthetic dataset in the prepared layout (docs/design.md §4):
24 tiny clips, seed 0 (which clips are val/dropped/NaN-ground is documented in gcc/synth/world.py). Treat it as
read-only; a test that modifies data writes its own copy with `make_prepared(tmp_path, clips=..., seed=...)`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests' own helper modules (s3server)

from gcc.synth.world import make_prepared

PREPARED_TINY_CLIPS = 24
PREPARED_TINY_SEED = 0


@pytest.fixture(scope="session")
def prepared_tiny(tmp_path_factory):
    """Root Path of a tiny prepared dataset (24 clips, seed 0), written once per session."""
    return make_prepared(tmp_path_factory.mktemp("prepared_tiny"), clips=PREPARED_TINY_CLIPS, seed=PREPARED_TINY_SEED)


@pytest.fixture(scope="session")
def s3():
    """A real S3 server (moto_server) on loopback for this session/xdist worker; tests take a fresh bucket."""
    from s3server import S3Server

    server = S3Server()
    yield server
    server.stop()


@pytest.fixture
def s3_bucket(s3, monkeypatch) -> str:
    """This process pointed at the loopback S3 server (S3_ENDPOINT_URL and test credentials, as production reads
    them; restored after the test, and inherited by launched subprocesses) and a fresh bucket: 's3://<bucket>'."""
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    return f"s3://{s3.new_bucket()}"


@pytest.fixture(scope="session")
def shards(tmp_path_factory):
    """The loader tests' shards: 24 tiny clips (seed 3) converted to MDS in chunks of 4; read-only, its prepared
    source is `shards.parent / "prepared"`. The folder is this session's (and xdist worker's) own; a test streams
    it into a cache folder of its own (a fresh name: Streaming keys its shared memory on it)."""
    from gcc.data.convert import convert

    root = tmp_path_factory.mktemp("loader")
    out = root / "shards"
    convert(make_prepared(root, clips=24, seed=3), str(out), chunk_clips=4, progress=False)
    return out


@pytest.fixture(scope="session")
def e2e_shards(tmp_path_factory):
    """The end-to-end tests' shards: 32 tiny clips (seed 1) converted to MDS; read-only."""
    from gcc.data.convert import convert

    root = tmp_path_factory.mktemp("e2e")
    out = root / "shards"
    convert(make_prepared(root, clips=32, seed=1), str(out), chunk_clips=8, progress=False)
    return out


@pytest.fixture(scope="session")
def reference(e2e_shards, tmp_path_factory):
    """One uninterrupted 12-step DDP run on 2 ranks (tests/_launch.py BASE) with a loader worker per rank and
    samples during training (SAMPLES); interrupted runs, mostly without either, must reproduce it."""
    from _launch import SAMPLES, WORKER, launch, ok

    run_dir = tmp_path_factory.mktemp("ref") / "run"
    ok(launch(run_dir, e2e_shards, WORKER, *SAMPLES))
    return run_dir


def pytest_configure(config):
    # Streaming segments left by an earlier, killed test session whose folders are gone could only collide
    # with a test that reuses such a folder name; release those (never Streaming's clean_stale_shared_memory(),
    # which unlinks every job's segments on the machine: a training run or another test session beside us).
    if not hasattr(config, "workerinput"):
        from gcc.compat.streaming import release_stale_shm

        release_stale_shm()
