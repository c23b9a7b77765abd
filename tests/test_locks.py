"""File locks (gcc/locks.py): `take_flock` now or never, its refusal naming the live holder; the holder text written
into the file; a lock file never opened through a link. Two descriptors of one file lock each other (flock is per open file), so one process shows it."""

from __future__ import annotations

import os
import time

import pytest

from gcc.locks import LockHeld, open_lock_file, take_flock
from gcc.storage import LinkRefused


def test_take_flock_is_now_or_never_and_the_refusal_names_the_live_holder(tmp_path):
    path = tmp_path / ".lock"
    fd = take_flock(path, "pid 1 on host-a, run r")
    assert path.read_text() == "pid 1 on host-a, run r\n" and os.stat(path).st_mode & 0o777 == 0o600
    t0 = time.monotonic()
    with pytest.raises(LockHeld) as e:
        take_flock(path, "pid 2 on host-b")
    assert time.monotonic() - t0 < 1.0  # no wait (a refusal takes about a millisecond: far under the bound)
    assert e.value.holder == "pid 1 on host-a, run r" and e.value.path == path
    assert str(e.value) == f"{path}: held by pid 1 on host-a, run r"
    assert path.read_text() == "pid 1 on host-a, run r\n"  # the refused one wrote nothing
    os.close(fd)  # released: the next one takes it and writes itself over the old holder
    os.close(take_flock(path, "pid 3"))
    assert path.read_text() == "pid 3\n"


@pytest.mark.parametrize("link", ["symbolic", "hard"])
def test_a_lock_file_is_never_opened_through_a_link(tmp_path, link):
    """A hard link too: O_NOFOLLOW stops a symbolic link only, and the holder would truncate the file's other name."""
    target = tmp_path / "victim"
    target.write_text("keep me")
    (tmp_path / ".lock").symlink_to(target) if link == "symbolic" else os.link(target, tmp_path / ".lock")
    said = "a symbolic link" if link == "symbolic" else "a file with 2 names"
    with pytest.raises(LinkRefused, match=f"{tmp_path / '.lock'}: {said}"):
        open_lock_file(tmp_path / ".lock")
    with pytest.raises(LinkRefused, match=said):
        take_flock(tmp_path / ".lock", "pid 1")
    assert target.read_text() == "keep me"
