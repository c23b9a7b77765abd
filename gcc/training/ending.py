"""How a launch ends (docs/training.md, "How a launch ends"), on every rank.

`end` runs the launch on this rank (gcc/training/trainer.py `launch`) and ends it as its code says: in order for a
code every rank reaches together (`end_launch`: loader workers, forkserver, this rank's threads, then all ranks wait
for each other), at once on a fault (`leave_on_fault`), and after an unexpected error with this rank's threads
stopped. On 2-4 the ranks other than 0 then let rank 0 exit first (`wait_for_rank0`). The process always exits past
interpreter shutdown, through `os._exit` (`exit_process`, `leave_now`), without destroying the process group.

Interpreter shutdown would destroy the process group, which joins gloo's worker threads while holding the GIL. A
worker that is still dropping the tensors of a collective the rank has already left behind (the temporaries of
`broadcast_object_list`, for one) needs the GIL to do so: the process hangs for ever. No drain before the join
can rule that out, so the process group is never destroyed; its threads end with the process.

The entry (gcc/training/entry.py) uses this module before torch is loaded (a bad config is answered in about a
second), so what needs torch is imported where it is used, once the run has loaded it.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import NoReturn

from gcc import exit_codes
from gcc.compat.composer_launcher import let_rank0_exit_first
from gcc.compat.python import run_exit_handlers
from gcc.errors import BadInput
from gcc.redact import redact_text
from gcc.training import output_capture
from gcc.training.console import ALL_RANKS, RUN_LOG_ONLY
from gcc.training.ranks import rank, world_size
from gcc.training.watchdog import stop_watchdogs
from gcc.workers import PREEMPTION_SIGNALS, stop_forkserver

logger = logging.getLogger(__name__)


# How long a rank's own threads get to stop, and how long a rank waits for the others before it ends without them.
# The ranks come from the same step and from Composer's closing barrier, so they arrive within moments of each other.
THREAD_STOP_S = 10.0
END_BARRIER_S = 60.0
END_ARRIVED, END_LEFT = "gcc/end/arrived", "gcc/end/left"


# set in the ranks' environment by gcc-launch (gcc/launcher.py): the launcher names a rank that crashed on its
# console itself, so a peer's own words about it go to train.log alone
LAUNCHER_NAMES_CRASHES = "GCC_LAUNCHER_NAMES_CRASHES"


class PeerGone(Exception):
    """This rank's collective failed because another rank's process is gone (it crashed or was killed): not this
    rank's error, so one line and `exit_codes.PEER_LOST`, no traceback (the crashed rank's own output says why)."""

    exit_code = exit_codes.PEER_LOST


def end(run: Callable[[], int]) -> int:
    """Run `run` (the launch on this rank, returning its exit code) and end the launch: at once on a fault (5-8,
    `leave_on_fault`), else in order (`end_launch`). Returns the code for the process's exit (gcc/training/entry.py).
    An error, or the SystemExit of Composer's SIGTERM handler, is raised again once this rank's threads have stopped:
    the rank then ends through its exit handlers (gcc/training/entry.py `run`), and waits for no end barrier, which
    the other ranks may never reach."""
    try:
        code = run()
        if code in exit_codes.FAULTS:
            leave_on_fault(code)
        return end_launch(code)
    except PeerGone as e:  # no end barrier: the peer never gets there
        where = {**ALL_RANKS, **RUN_LOG_ONLY} if os.environ.get(LAUNCHER_NAMES_CRASHES) else ALL_RANKS
        logger.error(f"rank {rank()}: {e}", extra=where)
        stop_threads()
        return e.exit_code
    except BaseException:  # Python's own traceback follows, on the console and in train.log (its stderr)
        stop_threads()
        raise


def stop_threads() -> bool:
    """Stop and join this rank's own threads: the peer-fault watch and the stall watchdog. Both are daemon threads,
    and the peer watch spends its time in store calls: one still inside such a call when the interpreter shuts
    down is ended by CPython with pthread_exit, whose unwinding through the call's C++ frames aborts the process
    ("terminate called without an active exception", exit -6). False if one did not stop in time."""
    from gcc.training.peer_fault import stop_watching  # heavy (torch): loaded by the run

    watch, dog = stop_watching(THREAD_STOP_S), stop_watchdogs(THREAD_STOP_S)
    return watch and dog


def _end_barrier(store, rank: int, world: int, timeout_s: float) -> bool:
    """Wait until every rank has arrived here (at most `timeout_s`, then say so and go on: False). Rank 0, whose process
    keeps the store, leaves last: it waits for the others to have seen the count, so no rank queries a store that
    is gone. A fault that a peer records meanwhile ends this rank with that fault's code, as during the run."""
    from gcc.training.peer_fault import peer_fault  # heavy (torch): loaded by the run

    deadline = time.monotonic() + timeout_s
    arrived = store.add(END_ARRIVED, 1)
    while True:
        left = store.add(END_LEFT, 0) if rank == 0 else 0
        if arrived >= world and (rank != 0 or left >= world - 1):
            if rank != 0:
                store.add(END_LEFT, 1)
            return True
        fault = peer_fault(rank)
        if fault is not None:
            logger.error(f"rank {rank}: {fault[1]}", extra=ALL_RANKS)
            leave_now(fault[0])
        if time.monotonic() > deadline:
            logger.warning(
                f"rank {rank}: {min(arrived, world)} of {world} ranks reached the end of the launch within "
                f"{timeout_s:g} s; ending without the others",
                extra=ALL_RANKS,
            )
            return False
        time.sleep(0.05)
        arrived = store.add(END_ARRIVED, 0)


def wait_for_all_ranks() -> None:
    """All ranks together (`_end_barrier`), so that rank 0, whose process keeps the store, leaves last. The
    process group is not destroyed: its threads end with the process (this module's docstring says why)."""
    if "torch.distributed" not in sys.modules:
        return
    import torch.distributed as tdist

    from gcc.compat.torch import default_store

    if not (tdist.is_available() and tdist.is_initialized()) or tdist.get_world_size() < 2:
        return
    rank = tdist.get_rank()
    try:
        _end_barrier(default_store(), rank, tdist.get_world_size(), END_BARRIER_S)
    except Exception as e:  # the store's host, rank 0, is gone: it left on its own (its deadline passed)
        logger.warning(
            f"rank {rank}: the other ranks are gone ({type(e).__name__}: {e}); ending without them", extra=ALL_RANKS
        )


def end_launch(code: int) -> int:
    """The orderly end of a launch, for a code that every rank reaches together (0 finished, preempted or nothing
    to do; 2 bad config; 3 refused; 4 non-finite loss): the loader workers, then the forkserver, then this rank's
    threads stop; then all ranks wait for each other (`wait_for_all_ranks`). Loggers (TensorBoard's writer thread) and
    the checkpoint uploads were closed by the trainer's close()."""
    took: dict[str, float] = {}
    t0 = time.monotonic()
    dataset = sys.modules.get("gcc.data.dataset")  # none loaded: no loader, no workers
    if dataset is not None:
        dataset.stop_loader_workers()
    stop_forkserver()
    took["workers and forkserver"] = time.monotonic() - t0
    t0 = time.monotonic()
    if not stop_threads():
        # still inside a store call after THREAD_STOP_S (a store that does not answer): the exit handlers could
        # wait on it, so leave as a fault does
        logger.warning(f"rank {rank()}: a watch thread did not stop within {THREAD_STOP_S:g} s; exiting at once")
        leave_now(code)
    took["threads"] = time.monotonic() - t0
    t0 = time.monotonic()
    wait_for_all_ranks()
    took["end barrier"] = time.monotonic() - t0
    logger.debug(
        f"rank {rank()}: end of the launch (exit {code}): " + ", ".join(f"{k} {v:.2f} s" for k, v in took.items())
    )
    return code


def leave_on_fault(code: int) -> NoReturn:
    """The end of a launch on a fault (5-8), the same on every rank (docs/training.md "How a launch ends")."""
    from gcc.training.peer_fault import PEER_GRACE_S  # heavy (torch): loaded by the run

    # The fault is in the store (rank 0 keeps it): stay a moment so that the other ranks read it and stop with
    # this code rather than on their collective's bare error. Then exit now, not through interpreter shutdown:
    # shutdown restores SIGTERM's default action, and the launcher's SIGTERM (sent to every rank once one has
    # failed: gcc/compat/composer_launcher.py) would turn this code into -15. Every rank ends a fault this way, the ones that learn of it from
    # their watch thread too (StallWatchdog.stop_for_peer), and so does a missed deadline: a peer may be stuck in
    # a collective, so there is no end barrier to wait for. The loader workers and the forkserver stop by
    # themselves when their rank is gone (gcc/workers.py).
    if world_size() > 1:
        for s in (signal.SIGTERM, signal.SIGUSR1):  # the launcher's SIGTERM then: nothing left to save
            signal.signal(s, signal.SIG_IGN)
        time.sleep(PEER_GRACE_S)
    leave_now(code)


def wait_for_rank0(code: int) -> None:
    """On 2-4, which every rank reaches together, a rank other than 0 lets rank 0 exit first, so that the launcher
    reports the run's code rather than rank 0's -15 (gcc/compat/composer_launcher.py). Nothing is left to save: the
    launcher's SIGTERM ends this rank at once (the handlers a run installed would only note it, and the launcher
    would wait out its 30 s before its SIGKILL), through the orderly exit (`exit_process`), so that the finalizers
    release this rank's semaphores and shared memory."""
    try:
        others = rank() != 0 and world_size() > 1
    except BadInput:  # not a launcher's environment (the launch's verdict named it): no rank 0 to wait for
        return
    if code in exit_codes.TOGETHER and others:
        let_rank0_exit_first(code, PREEMPTION_SIGNALS)


def leave_now(code: int) -> NoReturn:
    """Exit at once with `code` (the fault paths): the log and the streams flushed, and passed on to the console
    and train.log by the writer of gcc/training/output_capture.py, nothing else run."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing more can reach it
            pass
    output_capture.drain()
    os._exit(code)


def exit_process(code: int) -> NoReturn:
    """The orderly exit: the exit handlers (multiprocessing's finalizers, which release this rank's semaphores;
    Streaming's shared memory; the loader workers), then `leave_now`. Everything else that needs closing (loggers,
    uploads, this rank's threads) was closed before."""
    run_exit_handlers()
    leave_now(code)


def code_of(e: SystemExit) -> int:
    """The exit status CPython gives a `SystemExit`: None is 0, an int itself, anything else printed and 1."""
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(redact_text(str(e.code)), file=sys.stderr)
    return 1
