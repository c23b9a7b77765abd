"""A fault one rank met (damaged data, storage away, disk full, a missed deadline), told to the other ranks.

The rank that meets it exits with its code (docs/training.md, exit codes), and its peers, waiting for it in a
collective, fail there with a bare transport error ("Connection closed by peer") or hang in it (NCCL) until the
launcher stops them. Composer's launcher reports the first non-zero exit *in rank order*, so rank 0's code from
that collateral failure would hide the real one. So the rank writes its fault into the process group's store (a
key-value server kept by rank 0, alive as long as rank 0 is) before it exits, and a peer exits with the same
code and says which rank stopped the run and why: when its collective fails (`peer_fault` in the trainer's
error path) or sooner, from a thread that watches the store (`watch_peers`). After a missed deadline the peer
first writes its own stacks (a stall's cause may be on any rank), so the rank that missed it waits
`PEER_GRACE_S` before exiting.

The watching thread is stopped and joined before the launch ends (`stop_watching`, from gcc.training.ending's end
of a launch): a daemon thread still inside a store call when the interpreter shuts down is ended by CPython with
`pthread_exit`, whose unwinding through that call's C++ frames aborts the process ("terminate called without an
active exception", exit -6, docs/training.md "How a launch ends").
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable

import torch.distributed as tdist

from gcc.compat.torch import default_store

KEY = "gcc/fault"
PEER_GRACE_S = 3.0  # how long a rank that announced a missed deadline lives on, so that its peers see it

logger = logging.getLogger(__name__)


def _store():
    if not (tdist.is_available() and tdist.is_initialized()):
        return None
    return default_store()


def announce(rank: int, code: int, message: str) -> None:
    """Record this rank's fault (the first one recorded stays)."""
    try:
        store = _store()
        if store is not None:
            store.compare_set(KEY, "", json.dumps([code, rank, message]))
    except Exception as e:  # the store's host (rank 0) may be gone already; the exit code still tells
        logger.debug(f"could not record the fault for the other ranks: {e}")


def peer_fault(rank: int, include_own: bool = False) -> tuple[int, str] | None:
    """(exit code, message) of a fault another rank recorded (or this one, with `include_own`: this rank's
    deadline passed and its collective failed while the watchdog waited for the peers), or None."""
    try:
        store = _store()
        if store is None or not store.check([KEY]):
            return None
        code, where, message = json.loads(store.get(KEY))
    except Exception:
        return None
    if where == rank:
        return (int(code), message) if include_own else None
    return int(code), f"stopped with rank {where}, which met a fault: {message}"


class PeerWatch:
    """A daemon thread that calls `on_fault(code, message)` once another rank has recorded a fault. It has a
    thread of its own: a store that stops answering blocks only this thread, never the rank's deadlines."""

    def __init__(self, rank: int, on_fault: Callable[[int, str], None], poll_s: float = 1.0):
        self.rank, self.on_fault, self.poll_s = rank, on_fault, poll_s
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="gcc-peer-watch", daemon=True)
        self.thread.start()
        _WATCHES.append(self)

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            fault = peer_fault(self.rank)
            if fault is not None and not self._stop.is_set():
                self.on_fault(*fault)
                return

    def stop(self, timeout_s: float) -> bool:
        """Stop the thread and wait for it (it may be inside a store call); False if it is still running."""
        self._stop.set()
        if self.thread is not threading.current_thread():
            self.thread.join(timeout_s)
        if self in _WATCHES and not self.thread.is_alive():
            _WATCHES.remove(self)
        return not self.thread.is_alive()


_WATCHES: list[PeerWatch] = []


def watch_peers(rank: int, on_fault: Callable[[int, str], None], poll_s: float = 1.0) -> PeerWatch:
    return PeerWatch(rank, on_fault, poll_s)


def stop_watching(timeout_s: float = 10.0) -> bool:
    """Stop every PeerWatch of this process; False if one is still inside a store call after `timeout_s`."""
    return all([w.stop(timeout_s) for w in list(_WATCHES)])  # a list: each one is stopped, even after a failure
