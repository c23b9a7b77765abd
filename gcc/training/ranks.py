"""This process's place in its launch, as the launcher's environment gives it (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
`LOCAL_WORLD_SIZE`, `NODE_RANK`; one process alone when unset): known before the process group exists, and without
loading torch (gcc/training/entry.py reads it before anything heavy is loaded).

Every variable is read by `gcc.inputs.env_int` (ASCII digits) in its range given the others (a rank below the
world size, ...): a value that is not, e.g. `WORLD_SIZE=0` or `RANK=²`, is a BadInput naming the variable (exit 2),
which `check` raises at the launch's first line, before torch or Composer read them."""

from __future__ import annotations

from gcc.errors import BadInput
from gcc.inputs import env_int

MAX_WORLD = 1 << 20  # processes in one launch: far beyond any cluster
MAX_PORT = 65535


def world_size() -> int:
    return env_int("WORLD_SIZE", 1, 1, MAX_WORLD)


def rank() -> int:
    return env_int("RANK", 0, 0, world_size() - 1)


def local_world_size() -> int:
    return env_int("LOCAL_WORLD_SIZE", 1, 1, world_size())


def local_rank() -> int:
    return env_int("LOCAL_RANK", 0, 0, local_world_size() - 1)


def node_rank() -> int:
    return env_int("NODE_RANK", 0, 0, world_size() - 1)


def check() -> None:
    """Every variable of the launcher's environment in its range (MASTER_PORT too, which torch reads); a BadInput
    naming the first that is not."""
    try:
        rank(), local_rank(), node_rank(), env_int("MASTER_PORT", 1, 1, MAX_PORT)
    except BadInput as e:
        raise BadInput(f"the launcher's environment: {e} (Composer's launcher sets it)") from None
