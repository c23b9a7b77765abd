"""Contract tests of gcc/compat/python.py against CPython."""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
from multiprocessing import shared_memory
from pathlib import Path

import pytest
from hostile import HOSTILE_MODULES, ran_in

from gcc.compat.python import forkserver_pid, helper_flags, longest_temp_folder, reap_forkserver, shm_name

ROOT = Path(__file__).resolve().parents[2]


def _nothing():
    pass


def test_the_forkserver_pid_and_its_reaping():
    p = mp.get_context("forkserver").Process(target=_nothing)
    p.start()
    p.join(60)
    pid = forkserver_pid()
    assert pid is not None and os.path.exists(f"/proc/{pid}")
    reap_forkserver()
    assert forkserver_pid() is None or not os.path.exists(f"/proc/{pid}")


def test_every_process_multiprocessing_starts_gets_the_safe_path_flag():
    """`-P` among the flags of the forkserver, the resource tracker and a spawned child (multiprocessing reads
    `util._args_from_interpreter_flags()` at each start), as among gcc's own helper's (`helper_flags`)."""
    from multiprocessing import resource_tracker, util

    assert "-P" in helper_flags() and "-P" in util._args_from_interpreter_flags()
    p = mp.get_context("forkserver").Process(target=_nothing)
    p.start()
    p.join(60)
    resource_tracker.ensure_running()
    tracker = resource_tracker._resource_tracker._pid
    for pid in (forkserver_pid(), tracker):
        assert pid is not None and b"-P" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"), pid
    reap_forkserver()


@pytest.mark.slow
def test_no_process_of_a_launch_imports_from_its_working_directory(reference):
    """The session's reference run (2 ranks, a loader worker each, samples, train.log's writers) was started in a
    folder holding gcc/, multiprocessing/, torch/, ... (tests/conftest.py `reference`): none was imported by any of
    its processes (the ranks are scripts; the writers, the forkservers, the workers and the resource trackers get
    -P)."""
    cwd = reference.parent / "cwd"
    assert all((cwd / name / "__init__.py").is_file() for name in HOSTILE_MODULES)
    assert ran_in(cwd) == []


def test_a_shared_memory_segment_name_has_its_slash():
    shm = shared_memory.SharedMemory(create=True, size=16)
    try:
        assert shm_name(shm) == "/" + shm.name
    finally:
        shm.close()
        shm.unlink()


RUN_EXIT_HANDLERS = """
import atexit, os
from gcc.compat.python import run_exit_handlers

atexit.register(print, "first registered")
atexit.register(print, "last registered")
run_exit_handlers()
print("after")
run_exit_handlers()  # nothing left to run
os._exit(0)  # past interpreter shutdown, which would run any handler still registered
"""


def test_the_exit_handlers_run_at_once_last_first_and_only_once():
    r = subprocess.run(
        [sys.executable, "-c", RUN_EXIT_HANDLERS],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines() == ["last registered", "first registered", "after"]


START = """
import sys
from multiprocessing import forkserver
try:
    forkserver.ensure_running()
    print("started")
except OSError as e:
    print("refused:", e)
"""


def test_the_forkserver_starts_under_the_longest_temp_folder_and_not_under_one_byte_more():
    """Its socket is `<tmp>/pymp-XXXXXXXX/listener-XXXXXXXX`, at most 107 bytes: `longest_temp_folder` is the bound,
    checked at it and one byte over it (each temp folder short-lived and of this test's own)."""
    base = Path(tempfile.mkdtemp(prefix="gcc-t-"))
    try:
        said = {}
        for extra in (0, 1):
            length = longest_temp_folder() + extra
            tmp = base / ("d" * (length - len(os.fsencode(str(base))) - 1))
            assert len(os.fsencode(str(tmp))) == length
            tmp.mkdir()
            r = subprocess.run(
                [sys.executable, "-c", START], env=dict(os.environ, TMPDIR=str(tmp)), capture_output=True, text=True
            )
            said[extra] = r.stdout.strip()
        assert said[0] == "started" and said[1].startswith("refused:") and "too long" in said[1], said
    finally:
        shutil.rmtree(base, ignore_errors=True)
