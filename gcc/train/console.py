"""What a launch prints: Python `logging` for every `gcc.*` module, configured once per process.

Rank 0 speaks for the run (`gcc.train: <message>`, warnings and errors on stderr); other ranks stay quiet
except for records logged with `extra=ALL_RANKS` (a per-rank figure such as the memory a rank used to load the
model). The level is the yaml's `log_level` (DEBUG, INFO, WARNING, ERROR).
"""
from __future__ import annotations

import logging
import sys

from gcc.redact import RedactingFilter

PREFIX = "gcc.train: "
ALL_RANKS = {"all_ranks": True}


class _RankFilter(logging.Filter):
    def __init__(self, rank: int):
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        return self.rank == 0 or getattr(record, "all_ranks", False)


class _Below(logging.Filter):
    def __init__(self, level: int):
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < self.level


def configure_logging(level: str = "INFO", rank: int = 0) -> None:
    """Route the `gcc` logger to stdout (below WARNING) and stderr (WARNING and up), flushed per line."""
    root = logging.getLogger("gcc")
    for h in list(root.handlers):
        root.removeHandler(h)
    fmt = logging.Formatter(PREFIX + "%(message)s")
    out = logging.StreamHandler(sys.stdout)
    out.addFilter(_Below(logging.WARNING))
    err = logging.StreamHandler(sys.stderr)
    err.setLevel(logging.WARNING)
    for h in (out, err):
        h.setFormatter(fmt)
        h.addFilter(_RankFilter(rank))
        h.addFilter(RedactingFilter())  # a credential in a URL or path never reaches the job log
        root.addHandler(h)
    root.setLevel(level.upper())
    root.propagate = False
