"""How every entry point answers bad input (docs/training.md, "Tools"): exit 2 and one line
`<prog>: error: <message>` on stderr, argparse's own convention (`parser.error`), that names the input (a file,
a flag, a key) and says what was expected; never a traceback.

Input is checked where it is read, and a failure is converted there into `gcc.errors.BadInput` naming the
file. `run_tool` is the net around a tool's body: an error gets the code and message of `gcc.errors.exit_for`,
the trainer's too (an OSError names its file; a non-UTF-8 or non-JSON input that no reader caught still gives
a message; damaged data exits 6, object storage that does not answer 7 and a full disk 8). Anything else is a
bug and keeps its traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

from gcc import exit_codes, redact
from gcc.errors import exit_for
from gcc.inputs import printable
from gcc.redact import redact_text
from gcc.storage import userinfo_problem


def fail(prog: str, message: str, code: int = exit_codes.CONFIG) -> int:
    # a URL's credentials masked, a control character from outside escaped
    print(f"{prog}: error: {printable(redact_text(message))}", file=sys.stderr, flush=True)
    return code


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


def run_tool(prog: str, body: Callable[[], int]) -> int:
    """`body()`'s exit code, or the code and message of the error it raised (module docstring). Every line the
    tool logs or reports from here on, a traceback included, has its credentials masked (gcc/redact.py)."""
    redact.install()
    try:
        return body()
    except Exception as e:
        verdict = exit_for(e)
        if verdict is None:
            raise
        return fail(prog, verdict[1], verdict[0])
