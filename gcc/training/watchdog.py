"""Deadlines for a rank: one that misses one writes every thread's Python stack into the run folder and exits
with code 5 (`exit_codes.STALLED`), so that a scheduler restarts it instead of waiting on it forever.

The deadlines are kept by a daemon thread, not by the main thread: a rank blocked waiting for data or inside a
collective runs no Python on its main thread, so a Python signal handler (and anything it would start) may
never run there. Signals still reach the thread: CPython's C-level handler writes each caught signal's number
to the wakeup fd (`signal.set_wakeup_fd`) at the moment it arrives, whatever the main thread is doing, and
the thread arms the deadline tied to that signal (preemption: the rank must have checkpointed within the
grace). `arm`/`disarm` set deadlines by name from Python code (a progress deadline moved at every step).

At the end of a launch the thread is stopped and joined (`stop_watchdogs`, from gcc.training.ending) before the
process group is closed: the end has its own bounded wait (docs/training.md "How a launch ends").
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from gcc import exit_codes
from gcc.storage import LinkRefused, open_in_place
from gcc.training import output_capture
from gcc.training.console import ALL_RANKS  # each rank's own line: on its console and in train.log
from gcc.workers import wait_readable

STACKS_DIR = "stacks"

log = logging.getLogger("gcc.train")


def stack_report() -> str:
    """Every Python thread's stack, named, innermost call last."""
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        out.append(f"--- thread {names.get(ident, '?')} (ident {ident})\n")
        out += traceback.format_stack(frame)
    return "".join(out)


def dump_stacks(run_dir: str | Path, rank: int, reason: str) -> Path:
    """Append this process's stacks to `<run_dir>/stacks/rank<R>.txt` (fsynced: the process exits next)."""
    path = Path(run_dir) / STACKS_DIR / f"rank{rank}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} rank {rank} pid {os.getpid()}: {reason}\n{stack_report()}\n"
    with open(open_in_place(path, os.O_WRONLY | os.O_APPEND), "a") as f:  # never through a link (gcc/storage.py)
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    return path


class StallWatchdog:
    """Named deadlines of one rank, checked by a daemon thread every `poll_s` seconds.

    `on_signal(signum, seconds, reason)` (main thread, once per signal) arms deadline `reason` when `signum`
    arrives, the first time only; `arm(name, seconds, reason)` sets or moves one; `disarm(name)` clears it.
    When any deadline passes: stacks to `<run_dir>/stacks/rank<R>.txt`, an error line (stderr, train.log), the stall recorded for
    the other ranks (`announce(code, reason)`, gcc.training.peer_fault), and after `grace_s` (for them to write
    their own stacks) `os._exit(exit_codes.STALLED)`. `stop_for_peer` ends the rank for a peer's fault. `stop` ends the
    thread (no deadline holds after it).
    """

    def __init__(
        self,
        run_dir: str | Path,
        rank: int,
        poll_s: float = 0.5,
        announce: Callable[[int, str], None] | None = None,
        grace_s: float = 0.0,
    ):
        self.run_dir, self.rank, self.poll_s = Path(run_dir), rank, poll_s
        self.announce, self.grace_s = announce, grace_s
        self._due: dict[str, tuple[float, str]] = {}
        self._on_signal: dict[int, tuple[float, str]] = {}
        self._on_repeat: dict[int, tuple[int, str]] = {}  # signal -> (exit code, reason) when it comes a second time
        self._seen: set[int] = set()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="gcc-stall-watchdog", daemon=True)
        self._thread.start()
        _RUNNING.append(self)

    def on_signal(self, signum: int, seconds: float, reason: str) -> None:
        """Call from the main thread after installing a Python handler for `signum` (without one, CPython does
        not catch the signal and nothing is written to the wakeup fd)."""
        self._on_signal[int(signum)] = (float(seconds), reason)
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)

    def exit_on_repeat(self, signum: int, code: int, reason: str) -> None:
        """When `signum` comes a second time, exit at once with `code` (after an error line naming `reason`),
        whatever the main thread is doing: a second Ctrl-C stops a rank that is still finishing its step or its
        save. Call after `on_signal` for `signum` (its handler and the wakeup fd)."""
        self._on_repeat[int(signum)] = (code, reason)

    def arm(self, name: str, seconds: float, reason: str) -> None:
        self._due[name] = (time.monotonic() + seconds, reason)

    def disarm(self, name: str) -> None:
        self._due.pop(name, None)

    def close(self) -> None:
        """Stop listening for signals (the deadlines already armed still hold)."""
        if self._on_signal:
            signal.set_wakeup_fd(-1)
            self._on_signal.clear()
            self._on_repeat.clear()

    def stop(self, timeout_s: float) -> bool:
        """End the thread and wait for it (call from the main thread); False if it is still running."""
        if self._stopping and not self._thread.is_alive():  # stopped already (its pipe may be closed)
            return True
        if threading.current_thread() is threading.main_thread():
            self.close()
        self._stopping = True
        try:
            os.write(self._wake_w, b"\0")  # wakes the select at once; 0 is no signal's number
        except OSError:  # the pipe is full: the select wakes anyway
            pass
        if self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        if self._thread.is_alive():
            return False
        if self in _RUNNING:
            _RUNNING.remove(self)
            if not self._on_signal:  # the wakeup fd no longer points at the pipe
                os.close(self._wake_r)
                os.close(self._wake_w)
        return True

    def _loop(self) -> None:
        while not self._stopping:
            ready = wait_readable(self._wake_r, self.poll_s)
            if self._stopping:
                return
            if ready:
                try:
                    caught = os.read(self._wake_r, 512)
                except BlockingIOError:
                    caught = b""
                for signum in caught:
                    if signum in self._on_repeat and signum in self._seen:
                        self._leave(*self._on_repeat[signum])
                    self._seen.add(signum)
                    key = f"signal {signum}"
                    if signum in self._on_signal and key not in self._due:
                        seconds, reason = self._on_signal[signum]
                        self._due[key] = (time.monotonic() + seconds, reason)
            now = time.monotonic()
            for due, reason in list(self._due.values()):
                if now > due:
                    self._fire(reason)

    def _fire(self, reason: str) -> None:
        where = self._stacks(reason)
        log.error(f"rank {self.rank}: {reason}; {where}; exiting with code {exit_codes.STALLED}", extra=ALL_RANKS)
        if self.announce is not None:
            self.announce(exit_codes.STALLED, reason)
            time.sleep(self.grace_s)
        os._exit(exit_codes.STALLED)

    def _leave(self, code: int, reason: str) -> None:
        log.error(f"rank {self.rank}: {reason}; exiting with code {code}", extra=ALL_RANKS)
        output_capture.drain()
        os._exit(code)

    def stop_for_peer(self, code: int, message: str) -> None:
        """Another rank stopped the run (gcc.training.peer_fault): its code; after a stall, this rank's stacks too."""
        where = f"; {self._stacks(message)}" if code == exit_codes.STALLED else ""
        log.error(f"rank {self.rank}: {message}{where}; exiting with code {code}", extra=ALL_RANKS)
        os._exit(code)

    def _stacks(self, reason: str) -> str:
        try:
            return f"every thread's stack is in {dump_stacks(self.run_dir, self.rank, reason)}"
        except (
            OSError,
            LinkRefused,
        ) as e:  # a full or gone run folder, or a planted link, must not keep the rank alive
            return f"could not write the stacks ({e})"


_RUNNING: list[StallWatchdog] = []


def stop_watchdogs(timeout_s: float = 10.0) -> bool:
    """Stop every StallWatchdog of this process; False if one did not stop within `timeout_s`."""
    return all([w.stop(timeout_s) for w in list(_RUNNING)])  # a list: each one is stopped, even after a failure
