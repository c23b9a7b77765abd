"""Errors of data and storage: `BadInput` (input that cannot be used), `DamagedData` (a shard or index that
cannot be read back as written), `StorageUnavailable` (object storage that stops answering) and `DiskFull`
(no space left on a local disk). Each message names the file, object or folder concerned."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path


class BadInput(Exception):
    """Input that cannot be used (prepared clips, shards, a manifest); the message names the file or clip, the
    field, and what was expected."""


class DamagedData(BadInput):
    """A shard or index that cannot be read back as written: a failed hash check, a decompression or decoding
    error, a missing or unreadable file. The message names the data, the split and the shard file."""


class StorageUnavailable(Exception):
    """Object storage did not answer (connection refused or reset, timeouts, 5xx) within botocore's bounded
    retries (gcc.storage.s3_config). The message names the object."""


class DiskFull(Exception):
    """A local write failed for want of space. The message names what was written and the filesystem."""


class Refusal(Exception):
    """The run must not start (docs/design.md §9.5): exit code 3 with this message."""


class LockTimeout(Exception):
    """A node-wide lock that another process has held for too long (or a lock folder another user planted). The
    message names the lock file and its holder."""


def _chain(e: BaseException):
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def is_unreachable(e: BaseException) -> bool:
    """The error of a store or a logger's tracking server that does not answer (as opposed to one that answers 'no
    such key')."""
    try:
        # optional: only object-storage (s3://) errors; botocore is loaded only when a store is used
        from botocore.exceptions import ClientError, ConnectionError, HTTPClientError
        from s3transfer.exceptions import RetriesExceededError
    except ImportError:
        return False
    try:  # optional: a logger's tracking server (MLflow, W&B speak HTTP through requests)
        from requests.exceptions import ConnectionError as HTTPUnreachable
        from requests.exceptions import Timeout as HTTPTimeout
    except ImportError:
        HTTPUnreachable = HTTPTimeout = ConnectionError
    for x in _chain(e):
        if isinstance(x, (ConnectionError, HTTPClientError, RetriesExceededError, HTTPUnreachable, HTTPTimeout)):
            return True
        if isinstance(x, ClientError) and x.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) >= 500:
            return True
    return False


def no_space_errno(e: BaseException) -> bool:
    return any(isinstance(x, OSError) and x.errno in (errno.ENOSPC, errno.EDQUOT) for x in _chain(e))


# Writers that lose the errno (torch.save to a path, safetensors) are recognised by the filesystem being full.
NEARLY_FULL_BYTES = 16 << 20


def _transport_error(e: BaseException) -> bool:
    """A collective that failed because a peer is gone: not a write, whatever the disk holds."""
    text = str(e)
    return any(k in text for k in ("Connection closed by peer", "gloo", "NCCL", "Connection reset by peer"))


def mount_point(path: str | os.PathLike) -> Path:
    p = Path(os.path.abspath(path))
    while not p.exists():
        p = p.parent
    while not os.path.ismount(p):
        p = p.parent
    return p


def disk_full(e: BaseException, folder: str | os.PathLike, what: str = "") -> DiskFull | None:
    """`e` as a DiskFull naming `what` (or `folder`) and its filesystem, if it was a write that found no space;
    else None."""
    if isinstance(e, DiskFull):
        return e
    mount = mount_point(folder)
    try:
        usage = shutil.disk_usage(mount)
    except OSError:
        usage = None
    if not no_space_errno(e) and (usage is None or usage.free >= NEARLY_FULL_BYTES or _transport_error(e)):
        return None
    room = f"{usage.free / 2**20:.1f} MB free of {usage.total / 2**30:.2f} GB" if usage else "size unknown"
    return DiskFull(
        f"no space left on device writing {what or folder} ({type(e).__name__}: {str(e)[:300]}); "
        f"filesystem {mount}: {room}"
    )
