"""The text table (docs/design.md §2): prompt key -> T5 embedding [L, D] bf16, memory-mapped and gathered by id.

Clips store only the ids of their context cells; a v10 embedding is 4 MB, so copying 21 of them into every
sample would be 88 MB a clip. A sample carries each distinct prompt once (a clip has 1-2) and each cell's index
among them (`TextTable.prompts`). The table file is mapped once per process and rows are copied out on demand;
the OS page cache shares them between loader workers.
"""

from __future__ import annotations

import math
import os
import struct
from pathlib import Path

import numpy as np
import torch

from gcc import inputs
from gcc.data.shards import MAX_ELEMENTS
from gcc.errors import BadInput, DamagedData
from gcc.vocab import NULL_PROMPT, key_to_id


class TextTable:
    def __init__(self, path: str | Path, shape: tuple[int, int] | None = None):
        """Reads the safetensors header only (`gcc.inputs.safetensors_header`: every tensor's bytes inside the
        file); a file that is not a text table as written (docs/design.md §2), or whose rows are not `shape`
        [L, D] (the manifest's geometry, when given) or larger than a text cell may be, is `DamagedData` naming
        it, before a row is ever read."""
        self.path = Path(path)
        header, n = self._read_header(shape)
        self.keys = sorted(header)
        self.ids = key_to_id(self.keys)
        self.shape = header[NULL_PROMPT].shape
        self._data_offset = 8 + n
        # element offsets (uint16 units) of each id's row block, in id order
        self._starts = np.array([header[k].offsets[0] // 2 for k in self.keys], dtype=np.int64)
        self._mm: np.memmap | None = None

    def _read_header(self, want: tuple[int, int] | None) -> tuple[dict, int]:
        def damaged(what: str) -> DamagedData:
            return DamagedData(
                f"{self.path}: not a text table (a safetensors file of BF16 [L, D] prompt embeddings): {what}"
            )

        try:
            header, _ = inputs.safetensors_header(self.path)
            with inputs.open_regular(self.path, "safetensors_header", cap=1 << 62) as (fd, _):
                (n,) = struct.unpack("<Q", os.pread(fd, 8, 0))
        except BadInput as e:
            raise damaged(str(e).removeprefix(f"{self.path}: ")) from None
        if NULL_PROMPT not in header:
            raise damaged(f"key {NULL_PROMPT!r} missing (the empty-prompt embedding is required)")
        shapes = {h.shape for h in header.values()}
        dtypes = {h.dtype for h in header.values()}
        if len(shapes) != 1 or dtypes != {"BF16"} or len(next(iter(shapes))) != 2 or 0 in next(iter(shapes)):
            raise damaged(f"every key must be BF16 of one shape [L, D]; got {sorted(shapes)[:5]} {sorted(dtypes)}")
        shape = next(iter(shapes))
        if want is not None and tuple(shape) != tuple(want):
            raise damaged(f"rows are {list(shape)}, the manifest's geometry says {list(want)}")
        most = MAX_ELEMENTS["text"]
        if math.prod(shape) > most:
            raise damaged(f"rows of {list(shape)} are larger than a text cell may be ({most} elements)")
        return header, n

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def null_id(self) -> int:
        return self.ids[NULL_PROMPT]

    def _map(self) -> np.memmap:
        if self._mm is None:  # mapped lazily so the object pickles cheaply into loader workers
            self._mm = np.memmap(self.path, dtype=np.uint16, mode="r", offset=self._data_offset)
        return self._mm

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_mm"] = None
        return state

    def row(self, idx: int) -> torch.Tensor:
        n = int(np.prod(self.shape))
        start = int(self._starts[idx])
        block = np.array(self._map()[start : start + n], copy=True)
        return torch.from_numpy(block).view(torch.bfloat16).reshape(self.shape)

    def read_into(self, idx: int, out: torch.Tensor) -> torch.Tensor:
        """Copy row `idx` straight from the mapped file into `out` (bf16 [L, D], contiguous); returns out."""
        n = int(np.prod(self.shape))
        start = int(self._starts[idx])
        np.copyto(out.view(torch.uint16).numpy(), self._map()[start : start + n].reshape(self.shape))
        return out

    def prompts(self, ids, empty=None) -> tuple[torch.Tensor, torch.Tensor]:
        """A clip's text cells (table ids [T]) -> (its distinct prompts bf16 [P, L, D], in order of first
        appearance, each read once straight into the result; each cell's index among them, int64 [T]): what the
        model takes (`GcDiT.gc_forward`), expanded per latent frame on the device. `empty(shape, dtype)` allocates
        the storage (default torch.empty; the loader passes a shared-memory allocator inside DataLoader workers)."""
        distinct, index = distinct_in_order(ids)
        out = (empty or _empty)((len(distinct), *self.shape), torch.bfloat16)
        for p, i in enumerate(distinct):
            self.read_into(i, out[p])
        return out, torch.tensor(index, dtype=torch.int64)


def _empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype)


def distinct_in_order(ids) -> tuple[list[int], list[int]]:
    """Text cells (ids) -> (the distinct ids in order of first appearance, each cell's index among them)."""
    first: dict[int, int] = {}
    index = [first.setdefault(int(i), len(first)) for i in ids]
    return list(first), index


def stack_prompts(items, empty=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Samples' (prompts [P_i, L, D], index [T]) -> (context [B, max P_i, L, D], index [B, T]): the batch the model
    takes. A sample with fewer prompts is padded with zero rows that no index points at (`prompts_in` trims a
    micro-batch to its own). One sample: views, no copy."""
    if len(items) == 1:
        ctx, index = items[0]
        return ctx.unsqueeze(0), index.unsqueeze(0)
    P = max(c.shape[0] for c, _ in items)
    L, D = items[0][0].shape[1:]
    out = (empty or _empty)((len(items), P, L, D), items[0][0].dtype)
    for b, (c, _) in enumerate(items):
        out[b, : c.shape[0]].copy_(c)
        out[b, c.shape[0] :].zero_()
    return out, torch.stack([index for _, index in items])
