"""Node-wide file locks of this user: the folder that holds them, and an exclusive lock waited for with a timeout
that names its holder."""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import tempfile
import time
from pathlib import Path

from gcc.errors import LockTimeout


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


def hold_flock(path: Path, timeout_s: float, what: str) -> int:
    """An exclusive flock on `path` (created 0600, never through a link), waited for at most `timeout_s`; returns
    the open descriptor (closing it releases the lock). The holder writes its pid into the file, so that a
    timeout can say who holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                holder = os.pread(fd, 100, 0).decode(errors="replace").strip() or "an unknown process"
                os.close(fd)
                raise LockTimeout(
                    f"{what}: {path} has been held by {holder} for more than {timeout_s:.0f} s; if "
                    f"that process is stuck, stop it, then relaunch"
                ) from None
            time.sleep(0.05)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()}\n".encode(), 0)
    return fd
