"""Errors of data and storage: `BadInput` (input that cannot be used), `DamagedData` (a shard or index that
cannot be read back as written), `StorageUnavailable` (object storage that stops answering) and `DiskFull`
(no space left on a local disk). Each message names the file, object or folder concerned.

Every error class of gcc carries its exit code (`exit_code`, from gcc/exit_codes.py; docs/training.md "Exit
codes"), and `exit_for` turns any exception into its exit code and one-line message: the trainer and every tool
answer the same error with the same code.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gcc import exit_codes

# what an OSError's errno means for the file it names, in the words of every message gcc prints about one
ERRNO_WORDS: dict[int | None, str] = {
    errno.ENOENT: "not found",
    errno.EISDIR: "is a folder, expected a file",
    errno.ENOTDIR: "a part of the path is a file, expected a folder",
    errno.EEXIST: "already exists",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.ENODEV: "is not a regular file",
    errno.ELOOP: "too many levels of symbolic links",
    errno.ENAMETOOLONG: "the name is too long",
    errno.ENXIO: "not a readable file (a socket or a device without a reader)",
}


def errno_words(e: OSError) -> str:
    return ERRNO_WORDS.get(e.errno) or e.strerror or str(e)


def os_error_message(e: OSError) -> str:
    """`<file>: <what>` for an OSError, e.g. '/data/x.json: is a folder, expected a file'."""
    names = " -> ".join(str(f) for f in (e.filename, e.filename2) if f is not None)
    what = errno_words(e)
    return f"{names}: {what}" if names else what


class BadInput(Exception):
    """Input that cannot be used (prepared clips, shards, a manifest); the message names the file or clip, the
    field, and what was expected."""

    exit_code = exit_codes.CONFIG


class DamagedData(BadInput):
    """A shard or index that cannot be read back as written: a failed hash check, a decompression or decoding
    error, a missing or unreadable file. The message names the data, the split and the shard file."""

    exit_code = exit_codes.DATA


class StorageUnavailable(Exception):
    """Object storage did not answer (connection refused or reset, timeouts, 5xx) within botocore's bounded
    retries (gcc.storage.s3_config). The message names the object."""

    exit_code = exit_codes.STORAGE


class DiskFull(Exception):
    """A local write failed for want of space. The message names what was written and the filesystem."""

    exit_code = exit_codes.DISK


class Refusal(Exception):
    """The run must not start (docs/design.md §9.5): exit code 3 with this message."""

    exit_code = exit_codes.REFUSED


def _chain(e: BaseException | None) -> Iterator[BaseException]:
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

        http_errors: tuple[type[BaseException], ...] = (HTTPUnreachable, HTTPTimeout)
    except ImportError:
        http_errors = ()
    for x in _chain(e):
        if isinstance(x, (ConnectionError, HTTPClientError, RetriesExceededError, *http_errors)):
            return True
        if isinstance(x, ClientError) and x.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) >= 500:
            return True
    return False


# what a logger's tracking service says when it refuses the login, and what to do about it: W&B without an API key
# or with a wrong one (wandb.errors), MLflow's server answering 401/403 (MlflowException's error codes)
_LOGIN_HINT = {
    "wandb": "WANDB_MODE=offline logs the run under <run_dir>/wandb without an account (`wandb sync` uploads it "
    "later), or log in with `wandb login` (or set WANDB_API_KEY)",
    "mlflow": "set MLFLOW_TRACKING_TOKEN, or MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD",
}


def login_refused(e: BaseException) -> tuple[str, str] | None:
    """(the service's name, what to do) when `e` is a logger's tracking service refusing the login; else None."""
    for x in _chain(e):
        module, name = type(x).__module__, type(x).__name__
        if module.startswith("wandb") and (
            name == "AuthenticationError" or (name == "UsageError" and re.search(r"API key|login", str(x), re.I))
        ):
            return "W&B", _LOGIN_HINT["wandb"]
        if module.startswith("mlflow") and getattr(x, "error_code", "") in ("UNAUTHENTICATED", "PERMISSION_DENIED"):
            return "MLflow", _LOGIN_HINT["mlflow"]
    return None


def no_space_errno(e: BaseException) -> bool:
    return any(isinstance(x, OSError) and x.errno in (errno.ENOSPC, errno.EDQUOT) for x in _chain(e))


# Writers that lose the errno (torch.save to a path, safetensors) are recognised by the filesystem being full.
NEARLY_FULL_BYTES = 16 << 20


# Whether an error is a collective's failure (not a write, whatever the disk holds): the library that raises them
# says how to tell (gcc/compat/torch.py `collective_failed`, registered here when it loads; nothing else of gcc
# runs collectives).
COLLECTIVE_FAILURES: list[Callable[[BaseException], bool]] = []


def _transport_error(e: BaseException) -> bool:
    return any(failed(e) for failed in COLLECTIVE_FAILURES)


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


def fault_message(e: BaseException) -> str:
    """The error's own message, also when a DataLoader worker raised it (torch re-raises it wrapped in the
    worker's traceback text)."""
    text = str(e).strip()
    tail = text.rsplit(f"{type(e).__name__}: ", 1)
    return tail[-1].splitlines()[0] if len(tail) == 2 else text


@dataclass(frozen=True)
class Advice:
    """What a message says to do about a fault that passes (exit 7 or 8), after what happened: a tool's words and
    the trainer's differ (the trainer's relaunch resumes from a checkpoint)."""

    store: str  # after "storage unavailable: <object>"
    server: str  # after "a server did not answer: <what>"
    disk: str  # after "disk full: <file and filesystem>"


TOOL_ADVICE = Advice(
    store=". Rerun the same command once the store answers", server=". Rerun the same command once it answers", disk=""
)


_RESUMES = ": it resumes from the last complete checkpoint"
# the trainer's words: its relaunch resumes from a checkpoint
RELAUNCH = Advice(
    store=f". Relaunch the same command once the store answers{_RESUMES}",
    server=f". Relaunch the same command once it answers{_RESUMES}",
    disk=f". Free space there and relaunch the same command{_RESUMES}",
)
# how the launch's line starts for a verdict before any work (the others' words start with what happened)
_VERDICT = {exit_codes.CONFIG: "config error: ", exit_codes.REFUSED: "refused: "}


def _store_refusal(e: BaseException) -> bool:
    try:  # optional: only object-storage (s3://) errors; botocore is loaded only when a store is used
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:
        return False
    return isinstance(e, (BotoCoreError, ClientError))


def exit_for(
    e: BaseException, folder: str | os.PathLike | None = None, advice: Advice = TOOL_ADVICE, foreign_input: bool = True
) -> tuple[int, str] | None:
    """(exit code, one-line message) for `e` (docs/training.md "Exit codes"), or None for an error gcc does not
    know: a bug, which keeps its traceback.

    An error of gcc's own has its class's `exit_code`. Of the others: a store or a logger's tracking server that
    did not answer is 7; a write that found no space is 8 (with `folder`, the filesystem written to, also a writer
    that loses the errno: `disk_full`). With `foreign_input` (a tool: what it reads is what its user named), an
    OSError names its file, and a file that is not UTF-8 or not JSON, or a request object storage refused, is
    bad input (2); without it (the trainer, whose inputs were all checked before the start) they are not gcc's to
    explain."""
    if isinstance(e, StorageUnavailable):
        return e.exit_code, f"storage unavailable: {fault_message(e)}{advice.store}"
    if isinstance(e, DiskFull):
        return e.exit_code, f"disk full: {fault_message(e)}{advice.disk}"
    if isinstance(e, DamagedData):
        return e.exit_code, f"damaged data: {fault_message(e)}"
    code = getattr(type(e), "exit_code", None)
    if isinstance(code, int):
        return code, fault_message(e)
    if is_unreachable(e):  # a logger's tracking server (gcc.storage turns object storage's into StorageUnavailable)
        return exit_codes.STORAGE, f"a server did not answer: {fault_message(e)}{advice.server}"
    refused = login_refused(e)
    if refused is not None:  # the service answers, but not to us: no retry helps, a login or offline logging does
        return exit_codes.STORAGE, f"{refused[0]} refused the login ({fault_message(e)}): {refused[1]}"
    full = disk_full(e, folder, f"under {folder}") if folder is not None else None
    if full is not None:
        return full.exit_code, f"disk full: {fault_message(full)}{advice.disk}"
    if not foreign_input:
        return None
    if isinstance(e, OSError):
        return exit_codes.CONFIG, os_error_message(e)
    if isinstance(e, (UnicodeDecodeError, json.JSONDecodeError)):
        return exit_codes.CONFIG, f"an input is not what was expected ({type(e).__name__}: {e})"
    if _store_refusal(e):
        return exit_codes.CONFIG, f"object storage refused a request: {e}"
    return None


def launch_verdict(e: BaseException) -> tuple[int, str]:
    """The launch's (exit code, line) for an error of gcc's own that ends it before any work (`exit_for`, with
    the trainer's advice): 'config error: ...' (2), 'refused: ...' (3), or a fault's own words. Anything else is
    a bug and is raised again, keeping its traceback."""
    found = exit_for(e, advice=RELAUNCH, foreign_input=False)
    if found is None:
        raise e
    code, message = found
    return code, _VERDICT.get(code, "") + message
