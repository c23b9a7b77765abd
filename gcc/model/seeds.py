"""Named seeds: every random draw of gcc comes from a generator seeded by a pure function of what it is for."""

from __future__ import annotations

import hashlib
from typing import Any


def stable_seed(*parts: Any) -> int:
    """A 63-bit seed from the parts' string forms (blake2b: stable across processes, unlike hash())."""
    digest = hashlib.blake2b("\x1f".join(str(p) for p in parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)
