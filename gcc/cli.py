"""How every entry point answers bad input (docs/training.md, "Tools"): exit 2 and one line
`<prog>: error: <message>` on stderr, argparse's own convention (`parser.error`), that names the input (a file,
a flag, a key) and says what was expected; never a traceback.

Input is checked where it is read, and a failure is converted there into `gcc.errors.BadInput` naming the
file. `run_tool` is the net around a tool's body: BadInput (and the tool's own error type) becomes the message;
an OSError names its file (missing, a folder where a file was expected, ...); a non-UTF-8 or non-JSON input
that no reader caught still gives a message; object storage that does not answer exits 7 and a full disk 8,
as for the trainer. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import errno
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from gcc import exit_codes, redact
from gcc.errors import BadInput, DiskFull, StorageUnavailable
from gcc.inputs import printable
from gcc.redact import redact_text
from gcc.storage import userinfo_problem

EXIT_BAD_INPUT, EXIT_STORAGE, EXIT_DISK = exit_codes.CONFIG, exit_codes.STORAGE, exit_codes.DISK

_ERRNO_WORDS = {
    errno.ENOENT: "not found",
    errno.EISDIR: "is a folder, expected a file",
    errno.ENOTDIR: "a part of the path is a file, expected a folder",
    errno.EEXIST: "already exists",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.ENODEV: "is not a regular file",
}


def fail(prog: str, message: str, code: int = EXIT_BAD_INPUT) -> int:
    # a URL's credentials masked, a control character from outside escaped
    print(f"{prog}: error: {printable(redact_text(message))}", file=sys.stderr, flush=True)
    return code


def os_error_message(e: OSError) -> str:
    """`<file>: <what>` for an OSError, e.g. '/data/x.json: is a folder, expected a file'."""
    names = " -> ".join(str(f) for f in (e.filename, e.filename2) if f is not None)
    what = _ERRNO_WORDS.get(e.errno) or e.strerror or str(e)
    return f"{names}: {what}" if names else what


def _file_in_the_way(p: Path) -> Path | None:
    """`p` or the nearest existing folder above it, when that is not a folder."""
    for q in (p, *p.parents):
        if q.exists():
            return None if q.is_dir() else q
    return None


def folder_problem(path: str | os.PathLike) -> str | None:
    """Why `path` cannot be (or become) a folder to write into: it, or a folder above it, is a file; it is a URL
    with credentials in it (`gcc.storage.userinfo_problem`, as for each of these checks). None if it can."""
    if problem := userinfo_problem(str(path)):
        return problem
    p = Path(path)
    blocker = _file_in_the_way(p)
    if blocker is None:
        return None
    return "is a file, expected a folder" if blocker == p else f"{blocker} is a file, expected a folder"


def file_problem(path: str | os.PathLike) -> str | None:
    """Why `path` cannot be written as a file: it is a folder, or a folder above it is a file. None if it can."""
    if problem := userinfo_problem(str(path)):
        return problem
    p = Path(path)
    if p.is_dir():
        return "is a folder, expected a file name"
    blocker = _file_in_the_way(p.parent)
    return f"{blocker} is a file, expected a folder" if blocker is not None else None


def input_file_problem(path: str | os.PathLike) -> str | None:
    """Why `path` cannot be read as a file: missing, or a folder. None if it can."""
    if problem := userinfo_problem(str(path)):
        return problem
    p = Path(path)
    if not p.exists():
        return "not found"
    if p.is_dir():
        return "is a folder, expected a file"
    return None


def run_tool(prog: str, body: Callable[[], int], bad: tuple[type[BaseException], ...] = ()) -> int:
    """`body()`'s exit code, or the message and exit code of an input error it raised (module docstring). Every
    line the tool logs or reports from here on, a traceback included, has its credentials masked (gcc/redact.py)."""
    redact.install()
    try:
        from botocore.exceptions import BotoCoreError, ClientError  # optional: only object-storage (s3://) errors

        store_errors: tuple[type[BaseException], ...] = (BotoCoreError, ClientError)
    except ImportError:
        store_errors = ()
    try:
        return body()
    except StorageUnavailable as e:
        return fail(prog, f"storage unavailable: {e}. Rerun the same command once the store answers", EXIT_STORAGE)
    except DiskFull as e:
        return fail(prog, f"disk full: {e}", EXIT_DISK)
    except (BadInput, *bad) as e:
        return fail(prog, str(e))
    except OSError as e:
        return fail(prog, os_error_message(e))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        return fail(prog, f"an input is not what was expected ({type(e).__name__}: {e})")
    except store_errors as e:
        return fail(prog, f"object storage refused a request: {e}")
