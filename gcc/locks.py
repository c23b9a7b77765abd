"""File locks taken now or never (`take_flock`: the run folder's, the shard cache's), whose refusal names the live
holder."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from gcc import exit_codes
from gcc.storage import open_in_place


class LockHeld(Exception):
    """A lock another live process holds; `holder` is what it wrote into the lock file (pid, host, run)."""

    exit_code = exit_codes.REFUSED

    def __init__(self, path: Path, holder: str):
        super().__init__(f"{path}: held by {holder}")
        self.path, self.holder = path, holder


def open_lock_file(path: Path, mode: int = 0o600) -> int:
    """The lock file `path` opened for reading and writing, created if missing, never through a link, symbolic or
    hard (a planted one would make the holder truncate its target): `gcc.storage.open_in_place`, whose LinkRefused
    names it; another OSError as is."""
    return open_in_place(path, os.O_RDWR, mode)


def _holder(fd: int) -> str:
    return os.pread(fd, 200, 0).decode(errors="replace").strip() or "an unknown process"


def _write_holder(fd: int, holder: str) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{holder}\n".encode(), 0)


def take_flock(path: Path, holder: str, mode: int = 0o600) -> int:
    """An exclusive flock on `path` (`open_lock_file`), taken now or never: LockHeld naming the live holder. The
    holder text (who we are) is written into the file; returns the open descriptor (closing it releases the lock;
    the kernel releases it on any exit)."""
    fd = open_lock_file(path, mode)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder_now = _holder(fd)
        os.close(fd)
        raise LockHeld(path, holder_now) from None
    _write_holder(fd, holder)
    return fd
