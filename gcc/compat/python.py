"""CPython 3.11: what gcc relies on beyond its documented API (gcc/compat/__init__.py).

- `forkserver_pid`, `reap_forkserver`: the process's forkserver (`multiprocessing.forkserver._forkserver`, its
  `_forkserver_pid` and `_stop()`, which closes its "alive" pipe and reaps it).
- `shm_name`: a `multiprocessing.shared_memory.SharedMemory`'s name as the resource tracker registered it
  (`_name`, with its leading slash).
- `run_exit_handlers`: the `atexit` handlers run now, as interpreter shutdown would run them
  (`atexit._run_exitfuncs`), so that a process can then leave through `os._exit` (gcc/training/ending.py).
"""

from __future__ import annotations

import atexit
import sys
from multiprocessing import forkserver

from gcc.compat import stop

VERIFIED = (3, 11)
if sys.version_info[:2] != VERIFIED:  # the interpreter is not a distribution: no override, pyproject pins it too
    stop(f"gcc/compat/python.py was verified with Python 3.11, this is {sys.version.split()[0]}")


def forkserver_pid() -> int | None:
    return getattr(forkserver._forkserver, "_forkserver_pid", None)


def reap_forkserver() -> None:
    forkserver._forkserver._stop()  # type: ignore[attr-defined]  # private, verified with VERIFIED


def shm_name(shm) -> str | None:
    return getattr(shm, "_name", None)


def run_exit_handlers() -> None:
    """Run the `atexit` handlers now, last registered first, each once. Relies on `atexit._run_exitfuncs`
    (undocumented; verified with CPython 3.11), which runs them as interpreter shutdown does and unregisters them.
    tests/compat/test_python.py checks both in a child process (in the test's own process it would run the test
    runner's handlers)."""
    atexit._run_exitfuncs()
