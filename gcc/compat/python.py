"""CPython 3.11: what gcc relies on beyond its documented API (gcc/compat/__init__.py).

- `forkserver_pid`, `reap_forkserver`: the process's forkserver (`multiprocessing.forkserver._forkserver`, its
  `_forkserver_pid` and `_stop()`, which closes its "alive" pipe and reaps it).
- `shm_name`: a `multiprocessing.shared_memory.SharedMemory`'s name as the resource tracker registered it
  (`_name`, with its leading slash).
- `run_exit_handlers`: the `atexit` handlers run now, as interpreter shutdown would run them
  (`atexit._run_exitfuncs`), so that a process can then leave through `os._exit` (gcc/training/ending.py).
- `longest_temp_folder`: how long the temp folder may be for the forkserver to bind its Unix socket there
  (`<tmp>/pymp-XXXXXXXX/listener-XXXXXXXX`: `util.get_temp_dir`, `connection.arbitrary_address`).
- `helper_flags`: the interpreter flags of every Python process multiprocessing starts (the forkserver, the resource
  tracker, a spawned child: `python <flags> -c ...`), which it reads from `util._args_from_interpreter_flags()` at
  each start; once this module is imported they hold `-P` (below).
"""

from __future__ import annotations

import atexit
from multiprocessing import forkserver, util

VERIFIED = (3, 11)  # gcc/compat/__init__.py checks the interpreter against it before it imports this module


def forkserver_pid() -> int | None:
    return getattr(forkserver._forkserver, "_forkserver_pid", None)


def reap_forkserver() -> None:
    forkserver._forkserver._stop()  # type: ignore[attr-defined]  # private, verified with VERIFIED


def shm_name(shm) -> str | None:
    return getattr(shm, "_name", None)


def longest_temp_folder() -> int:
    """The longest temp folder, in bytes, under which the forkserver can start: its socket's address is
    `<tmp>/pymp-XXXXXXXX/listener-XXXXXXXX` and a Unix socket's path at most 107 bytes (108 with its NUL). Checked
    by tests/compat/test_python.py at the bound and one byte over it."""
    return 107 - len("/pymp-XXXXXXXX/listener-XXXXXXXX")


def run_exit_handlers() -> None:
    """Run the `atexit` handlers now, last registered first, each once. Relies on `atexit._run_exitfuncs`
    (undocumented; verified with CPython 3.11), which runs them as interpreter shutdown does and unregisters them.
    tests/compat/test_python.py checks both in a child process (in the test's own process it would run the test
    runner's handlers)."""
    atexit._run_exitfuncs()


def helper_flags() -> list[str]:
    """The interpreter flags of a Python process gcc starts, `-P` among them (Python 3.11's safe path): `python -c`
    and `python -m` would otherwise put the working directory first on the process's sys.path, and a folder `gcc/`
    or `multiprocessing/` there would be imported and run. gcc's own helper (gcc/training/output_capture.py) is
    started with these; multiprocessing's get them through `_safe_path_helpers`."""
    return util._args_from_interpreter_flags()  # type: ignore[attr-defined]  # private, verified with VERIFIED


def _safe_path_helpers() -> None:
    """`-P` added to the flags multiprocessing starts its processes with. Relies on its start methods (forkserver,
    spawn) and its resource tracker reading `multiprocessing.util._args_from_interpreter_flags()` at each start
    (verified with CPython 3.11; tests/compat/test_python.py checks it)."""
    flags = util._args_from_interpreter_flags  # type: ignore[attr-defined]  # private, verified with VERIFIED
    if getattr(flags, "safe_path", False):
        return

    def with_safe_path() -> list[str]:
        found = flags()
        return found if "-P" in found else [*found, "-P"]

    with_safe_path.safe_path = True  # type: ignore[attr-defined]  # a marker: mypy has no function attributes
    util._args_from_interpreter_flags = with_safe_path  # type: ignore[attr-defined]


_safe_path_helpers()
