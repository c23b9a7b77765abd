"""File locks: node-wide ones of this user (the folder that holds them, and an exclusive lock waited for with a
timeout that names its holder), and locks taken now or never (`take_flock`: the run folder's, the shard
cache's), whose refusal names the live holder."""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import tempfile
import time
from pathlib import Path

from gcc import exit_codes
from gcc.errors import LockTimeout
from gcc.storage import open_in_place


def user_lock_dir() -> Path:
    """This user's folder for node-wide locks, `<tmp>/gcc-<uid>/`: created 0700, and refused unless it is a real
    folder owned by this user that no one else can write (another user cannot plant a link or hold our lock)."""
    d = Path(tempfile.gettempdir(), f"gcc-{os.getuid()}")
    with contextlib.suppress(FileExistsError):
        d.mkdir(mode=0o700)
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise LockTimeout(
            f"{d}: expected a folder of this user (uid {os.getuid()}) that only it can write, found "
            f"owner uid {st.st_uid}, mode {stat.filemode(st.st_mode)}; remove it and relaunch"
        )
    return d


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


def hold_flock(path: Path, timeout_s: float, what: str) -> int:
    """An exclusive flock on `path` (created 0600, never through a link), waited for at most `timeout_s`: `take_flock`
    tried again until then (one flock/holder sequence for both). Returns the open descriptor (closing it releases the
    lock). The holder writes its pid into the file, so that a timeout can say who holds it."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return take_flock(path, f"pid {os.getpid()}")
        except LockHeld as e:
            if time.monotonic() > deadline:
                raise LockTimeout(
                    f"{what}: {path} has been held by {e.holder} for more than {timeout_s:.0f} s; if "
                    f"that process is stuck, stop it, then relaunch"
                ) from None
            time.sleep(0.05)
