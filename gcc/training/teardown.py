"""How a launch ends (docs/training.md, "How a launch ends"), on every rank: in order for a code every rank reaches
together (`end_launch`: loader workers, forkserver, this rank's threads, then all ranks wait for each other),
at once on a fault (`leave_on_fault`). Either way the process then exits past interpreter shutdown, without
destroying the process group (gcc/training/process_exit.py). Kept apart from the run (gcc/training/trainer.py): it
needs neither Composer nor the model."""

from __future__ import annotations

import logging
import signal
import sys
import time

import torch.distributed as tdist

from gcc.compat.torch import default_store
from gcc.training.console import ALL_RANKS
from gcc.training.peer_fault import PEER_GRACE_S, peer_fault, stop_watching
from gcc.training.process_exit import leave_now
from gcc.training.ranks import rank, world_size
from gcc.training.watchdog import stop_watchdogs
from gcc.workers import stop_forkserver

logger = logging.getLogger(__name__)


# The end of a launch (docs/training.md, "How a launch ends"): how long a rank's own threads get to stop, and
# how long a rank waits for the others before it ends without them. The ranks come from the
# same step and from Composer's closing barrier, so they arrive within moments of each other.
THREAD_STOP_S = 10.0
END_BARRIER_S = 60.0
END_ARRIVED, END_LEFT = "gcc/end/arrived", "gcc/end/left"


def stop_threads() -> bool:
    """Stop and join this rank's own threads: the peer-fault watch and the stall watchdog. Both are daemon threads,
    and the peer watch spends its time in store calls: one still inside such a call when the interpreter shuts
    down is ended by CPython with pthread_exit, whose unwinding through the call's C++ frames aborts the process
    ("terminate called without an active exception", exit -6). False if one did not stop in time."""
    watch, dog = stop_watching(THREAD_STOP_S), stop_watchdogs(THREAD_STOP_S)
    return watch and dog


def _end_barrier(store, rank: int, world: int, timeout_s: float) -> bool:
    """Wait until every rank has arrived here (at most `timeout_s`, then say so and go on: False). Rank 0, whose process
    keeps the store, leaves last: it waits for the others to have seen the count, so no rank queries a store that
    is gone. A fault that a peer records meanwhile ends this rank with that fault's code, as during the run."""
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
    process group is not destroyed: its threads end with the process (gcc/training/process_exit.py says why)."""
    if "torch.distributed" not in sys.modules:
        return
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


def leave_on_fault(code: int) -> None:
    """The end of a launch on a fault (5-8), the same on every rank (docs/training.md "How a launch ends")."""
    # The fault is in the store (rank 0 keeps it): stay a moment so that the other ranks read it and stop with
    # this code rather than on their collective's bare error. Then exit now, not through interpreter shutdown:
    # shutdown restores SIGTERM's default action, and the launcher's SIGTERM (sent to every rank once one has
    # failed) would turn this code into -15. Every rank ends a fault this way, the ones that learn of it from
    # their watch thread too (StallWatchdog.stop_for_peer), and so does a missed deadline: a peer may be stuck in
    # a collective, so there is no end barrier to wait for. The loader workers and the forkserver stop by
    # themselves when their rank is gone (gcc/workers.py).
    if world_size() > 1:
        for s in (signal.SIGTERM, signal.SIGUSR1):  # the launcher's SIGTERM then: nothing left to save
            signal.signal(s, signal.SIG_IGN)
        time.sleep(PEER_GRACE_S)
    leave_now(code)
