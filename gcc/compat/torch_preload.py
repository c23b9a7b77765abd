"""torch 2.7: importing `torch.distributed.nn` (as Streaming and Composer do) makes a folder in the temp folder
(`torch.distributed.nn.jit.instantiator`'s template folder, `tmpXXXXXXXX/_remote_module_non_scriptable.py`) that only
an exit handler removes. A forkserver of gcc is SIGKILLed at a rank's end (gcc/workers.py `stop_forkserver`: its
interpreter shutdown would take seconds), so its folder would stay behind, one per rank and launch.

This module is the forkserver's first preload (gcc/workers.py `FORKSERVER_PRELOAD`): it imports that module with the
temp folder pointed, for that import alone, at `forkserver_tmp(<its pid>)`, which `stop_forkserver` removes with the
forkserver, and which an exit handler removes when the forkserver exits by itself (its rank gone). Everything after
the import uses the usual temp folder. tests/compat/test_torch_preload.py checks the reliance."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

from gcc.compat import require
from gcc.workers import forkserver_tmp

require("torch", "gcc/compat/torch_preload.py")


def _import_torch() -> None:
    path = forkserver_tmp(os.getpid())
    try:
        os.mkdir(path, 0o700)
    except OSError:  # taken (a stale folder of this pid's): torch's folder goes to the usual temp folder
        return
    atexit.register(shutil.rmtree, path, True)  # before torch's own handler: runs after it
    usual = tempfile.tempdir
    tempfile.tempdir = path
    try:
        import torch.distributed.nn.jit.instantiator  # noqa: F401
    finally:
        tempfile.tempdir = usual


_import_torch()
