"""Which code ran: gcc's version and the git revision of the checkout it runs from, with a dirty flag, or "not a
checkout" (an installed package, or git cannot say). One launch reads it once, on rank 0 (`this_code`), and records
it in train.log's launch header, config.json, run.json's launch history and every export's metadata
(docs/training.md, "The run folder"). It identifies the code, not the run: it is never part of the run signature,
so a resume with newer code is not refused.
"""

from __future__ import annotations

import functools
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gcc import __version__

NOT_A_CHECKOUT = "not a checkout"
CODE_ROOT = Path(__file__).resolve().parents[1]  # gcc/provenance.py -> the folder holding the package


@dataclass(frozen=True)
class Provenance:
    version: str  # gcc.__version__
    revision: str  # the commit of the checkout, or NOT_A_CHECKOUT
    dirty: bool | None  # tracked files differ from that commit; None when not a checkout

    def as_dict(self) -> dict[str, Any]:
        """As config.json and run.json hold it."""
        return {"gcc_version": self.version, "git_revision": self.revision, "git_dirty": self.dirty}

    @classmethod
    def recorded(cls, version: Any, revision: Any, dirty: Any) -> Provenance | None:
        """The provenance a file recorded (config.json, run.json, an export's metadata: read from outside, so any
        value), or None when it recorded no revision (a file of an earlier gcc)."""
        if not revision:
            return None
        return cls(str(version), str(revision), None if revision == NOT_A_CHECKOUT else dirty in (True, "True"))

    def __str__(self) -> str:
        if self.revision == NOT_A_CHECKOUT:
            return f"gcc {self.version}, {NOT_A_CHECKOUT}"
        return f"gcc {self.version}, git {self.revision}" + (" (modified)" if self.dirty else "")


def read_provenance(root: Path = CODE_ROOT) -> Provenance:
    """The provenance of the code under `root`: a git checkout only when `root` itself holds `.git` (a package
    installed into a virtual environment inside some checkout is not that checkout's code)."""
    # git's own environment (set inside a git hook, say) would point it at another repository
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, env=env)

    unknown = Provenance(__version__, NOT_A_CHECKOUT, None)
    if not (root / ".git").exists():
        return unknown
    try:
        rev = git("rev-parse", "--verify", "HEAD")
        status = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):  # no git, or it hangs
        return unknown
    if rev.returncode != 0 or status.returncode != 0:  # no commit yet, a repository git refuses to read
        return unknown
    return Provenance(__version__, rev.stdout.strip(), bool(status.stdout.strip()))


@functools.cache
def this_code() -> Provenance:
    """The provenance of the running gcc, read once per process (a launch's rank 0: the header, the record)."""
    return read_provenance()
