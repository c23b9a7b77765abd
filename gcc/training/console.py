"""What a launch prints: Python `logging` for every `gcc.*` module, configured once per process, and the run
folder's own copy of everything a rank prints, `<run_dir>/train.log`.

Rank 0 speaks for the run (`gcc.train: <message>`, warnings and errors on stderr); other ranks stay quiet
except for records logged with `extra=ALL_RANKS` (a per-rank figure such as the memory a rank used to load the
model). The level is the yaml's `log_level` (DEBUG, INFO, WARNING, ERROR).

`train.log` (docs/training.md, "The run folder") gets, appended launch after launch, a header line per launch and,
from every rank, everything it prints. The `gcc` logger's records come by `RunLogHandler`, with their level, as
the console gets them: rank 0's and every rank's own (`ALL_RANKS`), so that a verdict that every rank logs is
there once (rank 0's); records logged with `extra=RUN_LOG_ONLY` go there alone (the progress lines while
Composer's bar draws on a terminal). The rest of what a rank writes to its stdout and stderr (library warnings,
tracebacks, a native crash's stacks, NCCL's lines) comes through the writer of gcc/training/output_capture.py,
which a launch's process starts (`open_run_log(..., capture_output=True)`); the `gcc` logger's console lines
bypass it, so they are not there twice. The launcher's own lines come from `gcc-launch` (gcc/launcher.py).
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import TextIO

from gcc.errors import Refusal
from gcc.provenance import this_code
from gcc.redact import RedactingFilter
from gcc.storage import LinkRefused, open_in_place
from gcc.training import output_capture
from gcc.training.config import ConfigError

PREFIX = "gcc.train: "
ALL_RANKS = {"all_ranks": True}
RUN_LOG_ONLY = {"run_log_only": True}
RUN_LOG = "train.log"


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


def _not_run_log_only(record: logging.LogRecord) -> bool:
    return not getattr(record, "run_log_only", False)


def _gcc_logger() -> logging.Logger:
    return logging.getLogger("gcc")


class _ConsoleHandler(logging.StreamHandler):
    """A console stream of the `gcc` logger. While the process's output is captured (gcc/training/output_capture.py)
    it writes to the console itself, after the writer has passed on what came before (the record keeps its place);
    train.log gets the record from RunLogHandler."""

    def __init__(self, fd: int):
        super().__init__(_console_stream(fd))
        self.fd = fd

    def emit(self, record: logging.LogRecord) -> None:
        output_capture.drain()
        if output_capture.console(self.fd) == self.fd:  # not captured: sys.stdout/sys.stderr as they are now, not as
            self.stream = sys.stdout if self.fd == 1 else sys.stderr  # they were when logging was configured
        super().emit(record)


def _console_stream(fd: int) -> TextIO:
    """The console of fd 1 or 2, where `configure_logging`'s handlers write: sys.stdout or sys.stderr, or, while the
    process's output is captured, the console as it was before."""
    console = output_capture.console(fd)
    if console == fd:
        return sys.stdout if fd == 1 else sys.stderr
    return open(console, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)


def progress_bar_draws(allowed: bool) -> bool:
    """Whether Composer's progress bar draws: the yaml's `progress_bar` allows it, and stdout is a terminal (under
    the capture of train.log a pseudo-terminal stands for it: gcc/training/output_capture.py). Under a scheduler
    (stdout a file or a pipe) it never does, whatever the yaml says: the progress lines take its place."""
    return allowed and sys.stdout.isatty()


def progress_bar_stream() -> TextIO:
    """Where the bar draws: the terminal itself, past train.log's capture. Its redraws are terminal control, not
    lines of a log; train.log gets the progress lines instead (ConsoleLog, `RUN_LOG_ONLY`)."""
    return _console_stream(1)


def configure_logging(level: str = "INFO", rank: int = 0) -> None:
    """Route the `gcc` logger to stdout (below WARNING) and stderr (WARNING and up), flushed per line. A run log
    opened before (`open_run_log`) stays."""
    root = _gcc_logger()
    for h in list(root.handlers):
        if not isinstance(h, RunLogHandler):
            root.removeHandler(h)
    fmt = logging.Formatter(PREFIX + "%(message)s")
    out = _ConsoleHandler(1)
    out.addFilter(_Below(logging.WARNING))
    err = _ConsoleHandler(2)
    err.setLevel(logging.WARNING)
    for h in (out, err):
        h.setFormatter(fmt)
        h.addFilter(_RankFilter(rank))
        h.addFilter(_not_run_log_only)
        h.addFilter(RedactingFilter())  # a credential in a URL or path never reaches the job log
        root.addHandler(h)
    root.setLevel(level.upper())
    root.propagate = False


class RunLogHandler(logging.Handler):
    """Appends each record as one write() to a file opened with O_APPEND: the ranks of a node append to one file
    without cutting into each other's lines (on NFS, which emulates O_APPEND, lines from several nodes could still
    clash; the other ranks write only their rare warnings)."""

    def __init__(self, fd: int, path: Path, rank: int):
        super().__init__()
        self.fd, self.path, self.rank = fd, path, rank
        fmt = logging.Formatter(f"%(asctime)s rank {rank} %(levelname)s {PREFIX}%(message)s", "%Y-%m-%dT%H:%M:%SZ")
        fmt.converter = time.gmtime
        self.setFormatter(fmt)

    def write(self, text: str) -> None:
        output_capture.append(self.fd, text)

    def emit(self, record: logging.LogRecord) -> None:
        if self.fd < 0:
            return
        output_capture.drain()  # what the rank printed before comes first (gcc/training/output_capture.py)
        try:
            self.write(self.format(record) + "\n")
        except OSError as e:  # a full or gone disk: the run deals with it; the log says so once and stops
            self.close()
            sys.stderr.write(
                f"{PREFIX}rank {self.rank}: {self.path}: cannot be written ({e.strerror}); it gets no "
                f"more lines from this rank in this launch\n"
            )

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        super().close()


def launch_header(world: int) -> str:
    """The line that opens a launch in train.log: UTC time, host, world size, rank 0's pid, the code
    (gcc/provenance.py)."""
    return (
        f"==== launch {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}  host {socket.gethostname()}  "
        f"world {world}  pid {os.getpid()}  {this_code()} ===="
    )


def open_log_file(path: Path) -> int:
    """`path` (a train.log) opened for appending, created with the user's umask (its folder, the run folder, too),
    never through a link, symbolic or hard (`gcc.storage.open_in_place`): a write-only fd (O_APPEND, close-on-exec).
    Anything but a regular file of its own there is a Refusal naming it, a run folder that cannot be created a
    ConfigError."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"run_dir: {path.parent}: cannot be created ({e.strerror})") from None
    try:  # never through a link, symbolic or hard; a FIFO is refused, not waited on
        return open_in_place(path, os.O_WRONLY | os.O_APPEND)
    except LinkRefused as e:
        raise Refusal(f"{e}; it is the run's log: move it away and relaunch") from None
    except OSError as e:
        raise Refusal(f"{path}: cannot be opened as the run's log ({e.strerror}); remove it and relaunch") from None


def open_run_log(run_dir: str | Path, rank: int, world: int, capture_output: bool = False) -> Path:
    """Append this rank's share of what it prints to `<run_dir>/train.log` from now on (see the module's
    docstring): its `gcc` records, and with `capture_output` (a launch's own process: gcc/training/entry.py `run`)
    everything else it writes to fd 1 and fd 2; rank 0 first writes the launch's header line. The file is created
    with the user's umask and never opened through a link; anything but a regular file there is a Refusal naming
    it, a run_dir that cannot be created a ConfigError."""
    path = Path(run_dir) / RUN_LOG
    fd = open_log_file(path)
    handler = RunLogHandler(fd, path, rank)
    if rank == 0:
        handler.write(launch_header(world) + "\n")
    handler.addFilter(_RankFilter(rank))  # what the console gets: rank 0's records, the other ranks' own
    handler.addFilter(RedactingFilter())
    root = _gcc_logger()
    for h in list(root.handlers):  # one run log per process (a second launch in one process: tests)
        if isinstance(h, RunLogHandler):
            root.removeHandler(h)
            h.close()
    root.addHandler(handler)
    if capture_output:
        output_capture.start(fd, rank)
        configure_logging(logging.getLevelName(root.level), rank)  # the console handlers to the console itself
    return path
