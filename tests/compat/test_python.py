"""Contract tests of gcc/compat/python.py against CPython's multiprocessing."""

from __future__ import annotations

import multiprocessing as mp
import os
from multiprocessing import shared_memory

from gcc.compat.python import forkserver_pid, reap_forkserver, shm_name


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


def test_a_shared_memory_segment_name_has_its_slash():
    shm = shared_memory.SharedMemory(create=True, size=16)
    try:
        assert shm_name(shm) == "/" + shm.name
    finally:
        shm.close()
        shm.unlink()
