"""This process's place in its launch, as the launcher's environment gives it (`RANK`, `WORLD_SIZE`; one process
alone when unset): known before the process group exists, and without loading torch (gcc/training/entry.py reads
it before anything heavy is loaded)."""

from __future__ import annotations

import os


def rank() -> int:
    return int(os.environ.get("RANK", 0))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", 1))


def node_rank() -> int:
    return int(os.environ.get("NODE_RANK", 0))
