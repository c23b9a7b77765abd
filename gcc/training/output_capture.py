"""Everything a rank prints, in `<run_dir>/train.log` (docs/training.md, "The run folder").

Once train.log is open (gcc/training/console.py `open_run_log`), a rank's fd 1 and fd 2 are each a pipe to one
writer, a small process that the rank starts (`python -m gcc.training.output_capture`). Whatever reaches them (Python's
prints, tracebacks and library warnings, a library's C-level writes, NCCL's and gloo's lines, faulthandler's dump of a
native crash, a loader worker's output) it passes on to the rank's console byte for byte as it comes (the terminal,
or the file the launcher gave the other ranks; a pseudo-terminal stands in for a terminal, so that whatever asks
`isatty` gets the same answer), and appends to train.log line by line: `<UTC time> rank <R> <stdout|stderr>: <line>`,
masked for credentials (gcc/redact.py) and control characters, whole lines in each write() to the O_APPEND file,
so that lines of several ranks never cut into each other.

A process and not a thread, because it outlives the rank: the last words of a segfault (faulthandler's stacks) or of
`std::terminate`, written just before the rank dies, still reach the console and train.log, and a rank that hangs,
even holding the GIL, does not stop it. It ignores the signals that stop a launch (Ctrl-C, the scheduler's SIGTERM,
SIGUSR1) and ends once every process that holds the pipes (the rank and its loader workers) has closed them. `drain`
returns once it has written everything this process wrote before: the rank's exit calls it
(gcc/training/ending.py `leave_now`), and so does each record of the `gcc` logger, which reaches the console and
train.log by its own path (gcc/training/console.py: once, with its level) and so keeps its place among the other
lines.

`LogLines` (the lines of one stream into train.log) is also the launcher's (gcc/launcher.py `main`).
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import faulthandler
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gcc.compat.python import helper_flags
from gcc.inputs import printable
from gcc.redact import redact_span

# a line longer than this (a progress bar redrawn with \r for hours, a dump without newlines) is written in pieces
MAX_LINE = 64 * 1024
# how much of a long line around each cut its masking reads (a credential that a cut runs through)
CONTEXT = 64 * 1024
# how long a rank waits for the writer to catch up before it goes on without (a console that blocks it)
DRAIN_S = 5.0
# the signals that stop a launch: the writer outlives them, to write the rank's last lines
IGNORED = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP)
STREAMS = ((1, "stdout"), (2, "stderr"))


# a terminal's control sequences (colours, cursor moves, a progress bar's redraws): CSI, OSC and the two-byte ones.
# train.log holds the text of a line, never these (they would move a terminal's cursor when the file is shown)
CONTROL_SEQUENCE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[ -/]*[0-~])")


def plain(piece: str) -> str:
    """A piece of a line (masked already: `_pieces`) as train.log keeps it: its terminal control sequences removed,
    what a terminal last shows of a line redrawn with carriage returns, other control characters escaped."""
    return printable(CONTROL_SEQUENCE.sub("", piece).rstrip("\r").rsplit("\r", 1)[-1])


def append(fd: int, text: str) -> None:
    """`text` (whole lines) appended to the O_APPEND file `fd` in one write() (more only if the kernel takes part)."""
    _write_all(fd, text.encode("utf-8", "backslashreplace"))


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class LogLines:
    """The text of one stream, cut into train.log's lines: `<UTC time> <source>: <line>`, masked. A line redrawn
    with carriage returns (a progress bar) is written as a terminal last shows it, without a terminal's control
    sequences (CONTROL_SEQUENCE: colours, cursor moves; a line of them alone is dropped: `plain`). A line longer
    than MAX_LINE is written in pieces of MAX_LINE, each masked with up to CONTEXT characters of the line before and
    after it (`gcc.redact.redact_span`): a credential that a cut runs through is masked on both sides of it. A
    write that fails (a full or gone disk) stops the lines of this stream and says so once on `complain`; the
    console is not affected."""

    def __init__(self, fd: int, source: str, complain: Callable[[str], object] | None = None):
        self.fd, self.source, self.complain = fd, source, complain
        # the line so far, in the parts it came in (joined only when there is something to write: a writer that
        # prints a byte at a time costs no more than one that prints lines); its first `written` characters are
        # written already, kept as the context of what follows
        self.parts: list[str] = []
        self.size = 0
        self.written = 0
        self.decoder = codecs.getincrementaldecoder("utf-8")("backslashreplace")

    def feed(self, data: bytes | str, final: bool = False) -> None:
        text = data if isinstance(data, str) else self.decoder.decode(data, final)
        self.parts.append(text)
        self.size += len(text)
        if not final and "\n" not in text and self.size - self.written <= MAX_LINE + CONTEXT:
            return
        *lines, pending = "".join(self.parts).split("\n")
        pieces = [p for i, ln in enumerate(lines) for p in _pieces(ln, self.written if i == 0 else 0, len(ln))]
        if lines:
            self.written = 0
        if len(pending) > MAX_LINE:  # a bar redrawn for hours without a newline: what a terminal shows
            redrawn = pending.rsplit("\r", 1)[-1]
            self.written = max(0, self.written - (len(pending) - len(redrawn)))
            pending = redrawn
        # a piece is cut once CONTEXT more characters have come (or at the end), so that its mask sees past the cut
        while len(pending) - self.written > MAX_LINE + CONTEXT:
            cut = self.written + MAX_LINE
            pieces += _pieces(pending, self.written, cut)
            keep = max(0, cut - CONTEXT)
            pending, self.written = pending[keep:], cut - keep
        if final and len(pending) > self.written:
            pieces += _pieces(pending, self.written, len(pending))
            pending, self.written = "", 0
        self.parts, self.size = [pending], len(pending)
        # a piece of control sequences alone (a bar's cursor moves) is no line of the log
        pieces = [p for p in pieces if not (p.strip() and not CONTROL_SEQUENCE.sub("", p).strip())]
        if pieces and self.fd >= 0:
            stamp = utc_now()
            shown = (plain(p) for p in pieces)
            try:
                append(self.fd, "".join(f"{stamp} {self.source}: {ln}\n" for ln in shown))
            except OSError as e:
                self.fd = -1
                if self.complain is not None:
                    self.complain(
                        f"gcc.train: {self.source}: train.log cannot be written ({e.strerror}); it gets "
                        f"no more of these lines in this launch\n"
                    )


def _pieces(line: str, start: int, end: int) -> list[str]:
    """`line[start:end]` in pieces of at most MAX_LINE characters (one, empty, for an empty line), each masked with up
    to CONTEXT characters of `line` on either side (`gcc.redact.redact_span`)."""
    if start >= end:
        return [""] if not line else []
    out = []
    for a in range(start, end, MAX_LINE):
        b = min(a + MAX_LINE, end)
        lo, hi = max(0, a - CONTEXT), min(len(line), b + CONTEXT)
        out.append(redact_span(line[lo:hi], a - lo, b - lo))
    return out


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


def _serve(rank: int, log_fd: int, control: int, ack: int, reads: dict[int, str]) -> None:
    """The writer's loop: each chunk read from a stream's pipe to the console (this process's own fd of that
    name) and to train.log; each byte on `control` answered on `ack` once every pipe is read empty. Returns when
    every pipe is closed on the far side."""
    lines = {
        r: LogLines(log_fd, f"rank {rank} {name}", lambda m: _to_console(2, m.encode())) for r, name in reads.items()
    }
    console = {r: (1 if name == "stdout" else 2) for r, name in reads.items()}
    open_ = set(reads)
    settle = any(os.isatty(r) for r in reads)
    for r in (*open_, control):
        os.set_blocking(r, False)
    poller = select.poll()
    for r in (*open_, control):
        poller.register(r, select.POLLIN)

    def pump(r: int) -> bool:
        """Read `r` until it is empty; False once closed."""
        while True:
            try:
                data = os.read(r, 65536)
            except BlockingIOError:
                return True
            except OSError as e:  # a pseudo-terminal's far side closed: EIO
                if e.errno != errno.EIO:
                    raise
                data = b""
            if not data:
                lines[r].feed(b"", final=True)
                poller.unregister(r)
                open_.discard(r)
                return False
            _to_console(console[r], data)
            try:
                lines[r].feed(data)
            except Exception as e:  # never: but the writer must outlive it, or the rank's next print fails
                lines[r].fd = -1
                _to_console(2, f"gcc.train: train.log gets no more of rank {rank}'s output: {e!r}\n".encode())

    while open_:
        for r, _ in poller.poll():
            if r == control:
                try:
                    asks = os.read(control, 4096)
                except BlockingIOError:
                    continue
                if not asks:
                    poller.unregister(control)
                    continue
                for s in list(open_):
                    pump(s)
                # a pseudo-terminal passes what the rank wrote on a moment later: until it has nothing more
                while settle and open_ and poller.poll(10):
                    for s in list(open_):
                        pump(s)
                with contextlib.suppress(OSError):
                    _write_all(ack, b"." * len(asks))
            elif r in open_:
                pump(r)


_console_gone: set[int] = set()


def _to_console(fd: int, data: bytes) -> None:
    """Pass `data` on to this process's fd 1 or 2 (the rank's console); a console that is gone (a closed terminal,
    a launcher that died) gets nothing more, train.log goes on."""
    if fd in _console_gone:
        return
    try:
        _write_all(fd, data)
    except OSError:
        _console_gone.add(fd)


@dataclass
class _Capture:
    pid: int  # the process that started it: a forked loader worker inherits the module, not the writer's answers
    writer: subprocess.Popen
    control: int
    ack: int
    console: dict[int, int]  # 1, 2 -> the console's fd as it was
    lock: threading.RLock = field(default_factory=threading.RLock)
    answering: bool = True


_capture: _Capture | None = None


def _channel(console_fd: int) -> tuple[int, int]:
    """(read end, write end) standing in for `console_fd`: a pseudo-terminal of the same size for a terminal, else a
    pipe (1 MiB where the kernel allows: a library writing while it holds the GIL is not stopped by a full pipe)."""
    if os.isatty(console_fd):
        import fcntl
        import termios
        import tty

        r, w = os.openpty()
        tty.setraw(w)  # bytes pass as written: the real terminal does its own line discipline
        with contextlib.suppress(OSError):
            fcntl.ioctl(w, termios.TIOCSWINSZ, fcntl.ioctl(console_fd, termios.TIOCGWINSZ, b"\0" * 8))
        os.set_inheritable(r, False)
        os.set_inheritable(w, False)
        return r, w
    r, w = os.pipe()
    with contextlib.suppress(OSError, AttributeError):
        import fcntl

        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1 << 20)
    return r, w


def start(log_fd: int, rank: int) -> None:
    """From now on, this process's fd 1 and fd 2 go through the writer (module docstring) into the console and
    `log_fd` (train.log, opened by gcc/training/console.py `open_run_log`); faulthandler dumps a native crash's
    stacks (every thread's) to fd 2, so that they reach both, each line naming the rank."""
    global _capture
    if _capture is not None:
        stop()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    console = {fd: os.dup(fd) for fd, _ in STREAMS}
    channels = {fd: _channel(console[fd]) for fd, _ in STREAMS}
    control_r, control_w = os.pipe()
    ack_r, ack_w = os.pipe()
    reads = [channels[fd][0] for fd, _ in STREAMS]
    root = str(Path(__file__).resolve().parents[2])  # the folder that holds gcc: the writer imports this module
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    # -P among the flags: `-m` would import from the working directory first (a folder `gcc/` there would run)
    argv = [sys.executable, *helper_flags(), "-m", "gcc.training.output_capture"]
    argv += [str(rank), str(log_fd), str(control_r), str(ack_w)]
    argv += [f"{r}:{name}" for r, (_, name) in zip(reads, STREAMS)]
    # blocked until the writer ignores them (a blocked signal stays blocked across exec): a Ctrl-C or SIGTERM that
    # comes while it starts does not kill it; the rank gets any that came meanwhile once they are unblocked
    old = signal.pthread_sigmask(signal.SIG_BLOCK, IGNORED)
    try:
        writer = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=console[1],
            stderr=console[2],
            pass_fds=(log_fd, control_r, ack_w, *reads),
            env=env,
        )
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    for fd in (control_r, ack_w, *reads):
        os.close(fd)
    for fd, _ in STREAMS:
        os.dup2(channels[fd][1], fd)
        os.close(channels[fd][1])
    _capture = _Capture(os.getpid(), writer, control_w, ack_r, console)
    faulthandler.enable(file=2, all_threads=True)  # SIGSEGV, SIGFPE, SIGABRT (std::terminate), SIGBUS, SIGILL


def console(fd: int) -> int:
    """The console's fd for this process's fd 1 or 2: where they went before `start`."""
    c = _capture
    return c.console[fd] if c is not None and c.pid == os.getpid() else fd


def drain(timeout_s: float = DRAIN_S) -> bool:
    """Wait (at most `timeout_s`) until the writer has passed on everything this process wrote to fd 1 and fd 2
    before (Python's buffers flushed first). False if it did not answer: it is not waited for again."""
    c = _capture
    if c is None or c.pid != os.getpid():
        return True
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    with c.lock:
        if not c.answering:
            return False
        try:
            _write_all(c.control, b".")
            ready, _, _ = select.select([c.ack], [], [], timeout_s)
            if ready and os.read(c.ack, 1):
                return True
        except OSError:
            pass
        c.answering = False
        return False


def stop() -> None:
    """Put fd 1 and fd 2 back as they were before `start`, and wait for the writer to finish (tests: a launch's
    process never stops it, it exits)."""
    global _capture
    c = _capture
    if c is None or c.pid != os.getpid():
        return
    drain()
    for fd, _ in STREAMS:
        os.dup2(c.console[fd], fd)
        os.close(c.console[fd])
    os.close(c.control)
    with contextlib.suppress(subprocess.TimeoutExpired):
        c.writer.wait(DRAIN_S)
    os.close(c.ack)
    _capture = None


def _main(argv: list[str]) -> None:
    for s in IGNORED:
        signal.signal(s, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, IGNORED)
    rank, log_fd, control, ack = (int(a) for a in argv[:4])
    reads = {int(r): name for r, name in (a.split(":", 1) for a in argv[4:])}
    _serve(rank, log_fd, control, ack, reads)
    os._exit(0)


if __name__ == "__main__":
    _main(sys.argv[1:])
