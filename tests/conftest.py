"""Shared fixtures. `prepared_tiny` is a session-wide synthetic dataset in the prepared layout (docs/design.md §4):
24 tiny clips, seed 0 (which clips are val/dropped/NaN-ground is documented in gcc/synth/world.py). Treat it as
read-only; a test that modifies data writes its own copy with `make_prepared(tmp_path, clips=..., seed=...)`.
Datasets and launches that several tests read are built once for the session, whichever xdist worker asks first
(`shared`).

The order: the tests that `durations.json` knows to take LONG_S or more run first, longest first, so that no worker
is left with a long test at the end while the other idles; the rest keep pytest's order. Before them all, the first
test to need each shared launch (SHARED_LAUNCHES), so that no worker waits for another to build one. `make durations` (tests'
call times of a run, GCC_DURATIONS_OUT) writes the table anew after tests were added or changed."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests' own helper modules (s3server)

from hostile import process_state_restored

from gcc.synth.world import make_prepared


def _raise_open_files_limit(want: int = 65536) -> None:
    """Streaming keeps every dataset's shared memory, and so its descriptors (~7 a dataset), open until the
    process exits (its cleanup is an atexit handler, which holds the objects). A rank builds two datasets; a test
    worker builds hundreds, past the 1024 that many machines set as the soft limit. The soft limit is raised
    toward the hard one for the test processes only."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


_raise_open_files_limit()

PREPARED_TINY_CLIPS = 24
PREPARED_TINY_SEED = 0


@pytest.fixture(scope="session")
def shared(tmp_path_factory, worker_id):
    """`shared(name, build)`: the folder `name`, built by `build(path)` once for the whole test session: by the
    first xdist worker that asks, under a file lock, while the others wait for it and then read it. Treat it as
    read-only. A build that failed fails every test that asks for it, with the first failure's message."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    root = base.parent if worker_id != "master" else base  # the folder the session's workers share

    def get(name: str, build) -> Path:
        path = root / "shared" / name
        path.parent.mkdir(exist_ok=True)
        done, failed = path.with_name(name + ".done"), path.with_name(name + ".failed")
        with FileLock(str(path) + ".lock"):
            if failed.exists():
                pytest.fail(f"the shared {name} could not be built (in another worker):\n{failed.read_text()}")
            if not done.exists():
                try:
                    build(path)
                except BaseException as e:
                    failed.write_text(f"{type(e).__name__}: {e}"[-20000:])
                    raise
                done.touch()
        return path

    return get


@pytest.fixture(scope="session")
def prepared_tiny(shared):
    """Root Path of a tiny prepared dataset (24 clips, seed 0), written once per session."""
    build = lambda p: make_prepared(p, clips=PREPARED_TINY_CLIPS, seed=PREPARED_TINY_SEED)  # noqa: E731
    return shared("prepared_tiny", build) / "prepared"


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


def _converted(root: Path, clips: int, seed: int, chunk_clips: int) -> None:
    """`root/prepared`: `clips` synthetic clips (seed `seed`), converted to MDS in `root/shards`."""
    from gcc.data.convert import convert

    convert(make_prepared(root, clips=clips, seed=seed), str(root / "shards"), chunk_clips=chunk_clips, progress=False)


@pytest.fixture(scope="session")
def shards(shared):
    """The loader tests' shards: 24 tiny clips (seed 3) converted to MDS in chunks of 4; read-only, its prepared
    source is `shards.parent / "prepared"`. A test streams it into a cache folder of its own (a fresh name:
    Streaming keys its shared memory on it)."""
    return shared("loader", lambda p: _converted(p, clips=24, seed=3, chunk_clips=4)) / "shards"


@pytest.fixture(scope="session")
def e2e_shards(shared):
    """The end-to-end tests' shards: 32 tiny clips (seed 1) converted to MDS; read-only."""
    return shared("e2e", lambda p: _converted(p, clips=32, seed=1, chunk_clips=8)) / "shards"


@pytest.fixture(scope="session")
def reference(e2e_shards, shared):
    """One uninterrupted 12-step DDP run on 2 ranks (tests/_launch.py BASE, by the old key names: OLD_BASE) with a
    loader worker per rank, samples during training (SAMPLES) and the EMA (EMA), launched once for the session;
    interrupted runs, mostly without any of these and by the new key names, must reproduce it. It is started in a
    folder `cwd/` beside it that holds modules named gcc, multiprocessing, torch, ... (tests/hostile.py
    `hostile_folder`), which none of its processes may import (tests/compat/test_python.py)."""
    from _launch import EMA, OLD_BASE, SAMPLES, WORKER, launch, ok
    from hostile import hostile_folder

    def run(p: Path) -> None:
        ok(launch(p / "run", e2e_shards, WORKER, *SAMPLES, EMA, base=OLD_BASE, cwd=hostile_folder(p / "cwd")))

    return shared("ref", run) / "run"


@pytest.fixture
def in_process():
    """For a test that runs an entry point's main() in this process: what a process would have thrown away is put
    back afterwards (tests/hostile.py `process_state_restored`)."""
    with process_state_restored():
        yield


DURATIONS = Path(__file__).with_name("durations.json")
LONG_S = 8.0  # a test known to take this long is handed out first


# the session's launches that several tests read (`shared`; the FSDP one is tests/training/test_fsdp_e2e.py's)
SHARED_LAUNCHES = ("reference", "fsdp_reference")


def pytest_collection_modifyitems(session, config, items):
    known = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}
    long = sorted((it for it in items if known.get(it.nodeid, 0) >= LONG_S), key=lambda it: -known[it.nodeid])
    order = long + [it for it in items if known.get(it.nodeid, 0) < LONG_S]
    # the first test that needs each shared launch goes first, so its worker builds it at the start: the other
    # tests that need it (neighbours in this order) then find it built instead of waiting on its lock, a core idle
    first = [next((it for it in order if name in it.fixturenames), None) for name in SHARED_LAUNCHES]
    first = list(dict.fromkeys(it for it in first if it is not None))
    items[:] = first + [it for it in order if it not in first]


_calls: dict[str, float] = {}


def pytest_runtest_logreport(report):
    if report.when == "call":
        _calls[report.nodeid] = report.duration


def pytest_sessionfinish(session, exitstatus):
    out = os.environ.get("GCC_DURATIONS_OUT")
    if out and not hasattr(session.config, "workerinput"):  # the controller sees every worker's reports
        table = {k: round(v, 1) for k, v in sorted(_calls.items()) if v >= 1.0}
        Path(out).write_text(json.dumps(table, indent=0, sort_keys=True) + "\n")


def pytest_configure(config):
    # Streaming segments left by an earlier, killed test session whose folders are gone could only collide
    # with a test that reuses such a folder name; release those (never Streaming's clean_stale_shared_memory(),
    # which unlinks every job's segments on the machine: a training run or another test session beside us).
    if not hasattr(config, "workerinput"):
        from gcc.compat.streaming import release_stale_shm

        release_stale_shm()
