"""How a rank's process ends (docs/training.md, "How a launch ends"): always past interpreter shutdown, through
`os._exit`. Kept apart from gcc/training/teardown.py because the entry script uses it before torch is loaded.

Interpreter shutdown would destroy the process group, which joins gloo's worker threads while holding the GIL. A
worker that is still dropping the tensors of a collective the rank has already left behind (the temporaries of
`broadcast_object_list`, for one) needs the GIL to do so: the process hangs for ever. No drain before the join
can rule that out, so the process group is never destroyed; its threads end with the process."""

from __future__ import annotations

import atexit
import logging
import os
import sys
from typing import NoReturn

from gcc.redact import redact_text


def leave_now(code: int) -> NoReturn:
    """Exit at once with `code` (the fault paths): the log and the streams flushed, nothing else run."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing more can reach it
            pass
    os._exit(code)


def exit_process(code: int) -> NoReturn:
    """The orderly exit: the exit handlers (multiprocessing's finalizers, which release this rank's semaphores;
    Streaming's shared memory; the loader workers), then `leave_now`. Everything else that needs closing (loggers,
    uploads, this rank's threads) was closed before."""
    atexit._run_exitfuncs()
    leave_now(code)


def code_of(e: SystemExit) -> int:
    """The exit status CPython gives a `SystemExit`: None is 0, an int itself, anything else printed and 1."""
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(redact_text(str(e.code)), file=sys.stderr)
    return 1
