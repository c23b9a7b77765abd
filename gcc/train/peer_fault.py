"""A fault one rank met (damaged data, storage away, disk full), told to the other ranks.

The rank that meets it exits at once with its code (docs/training.md, exit codes), and its peers, waiting for
it in a collective, fail there with a bare transport error ("Connection closed by peer") or hang in it (NCCL)
until the launcher stops them. Composer's launcher reports the first non-zero exit *in rank order*, so rank 0's
code from that collateral failure would hide the real one. So the rank writes its fault into the process group's
store (a key-value server kept by rank 0, alive as long as rank 0 is) before it exits, and a peer whose collective
fails, or whose deadline passes, exits with the same code and says which rank stopped the run and why.
"""
from __future__ import annotations

import json
import logging

KEY = "gcc/fault"

logger = logging.getLogger(__name__)


def _store():
    import torch.distributed as tdist

    if not (tdist.is_available() and tdist.is_initialized()):
        return None
    from torch.distributed.distributed_c10d import _get_default_store

    return _get_default_store()


def announce(rank: int, code: int, message: str) -> None:
    """Record this rank's fault (the first one recorded stays)."""
    try:
        store = _store()
        if store is not None:
            store.compare_set(KEY, "", json.dumps([code, rank, message]))
    except Exception as e:  # the store's host (rank 0) may be gone already; the exit code still tells
        logger.debug(f"could not record the fault for the other ranks: {e}")


def peer_fault(rank: int) -> tuple[int, str] | None:
    """(exit code, message) of a fault another rank recorded, or None."""
    try:
        store = _store()
        if store is None or not store.check([KEY]):
            return None
        code, where, message = json.loads(store.get(KEY))
    except Exception:
        return None
    if where == rank:
        return None
    return int(code), f"stopped with rank {where}, which met a fault: {message}"
