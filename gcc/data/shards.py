"""The MDS shard format written by `convert_data` and read by the training loader (docs/design.md §4).

Output of a conversion:
    <out>/manifest.json             written last; its presence means the conversion is complete
    <out>/text/table.safetensors    the text table, copied verbatim
    <out>/<split>/index.json        one MDS dataset per split (train, val), merged from chunk folders
    <out>/<split>/chunk_NNNNN/      zstd shards of a fixed group of clips (independent of --workers)

One sample (one clip) has the columns below. bf16 has no MDS dtype, so latents travel as their uint16 bit
pattern. The sem ids are zstd-compressed per clip so that a sample whose condition is dropped never
decompresses them, and so that the decompressed shard cache stays small.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import zstd

from gcc.data import storage
from gcc.data.errors import BadInput

FORMAT_VERSION = 2  # 2: manifest lists each clip's run
SPLITS = ("train", "val")
MANIFEST = "manifest.json"
TEXT_TABLE = "text/table.safetensors"
SEM_ZSTD_LEVEL = 3
SHARD_HASHES = ("sha1", "xxh64")  # recorded per shard file in index.json by the converter
SHARD_HASH = "xxh64"  # checked by the loader when a shard enters the cache (fast: GB/s)

COLUMNS = {
    "clip_id": "str",
    "run": "str",
    "subset": "str",
    "scene": "str",
    "drop": "int",
    "context_ids": "ndarray:int64",
    "input_latents": "ndarray:uint16",  # bf16 bit pattern, [C, T, h, w]
    "sem_shape": "ndarray:int64",  # [F, H, W]
    "sem_zst": "bytes",  # zstd(uint8 [F, H, W], C order)
    "meta": "str",  # the clip's meta json, verbatim
}


def bf16_to_bits(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.uint16).numpy()


def bits_to_bf16(a: np.ndarray, empty=None) -> torch.Tensor:
    """uint16 bit pattern -> a new bf16 tensor; `empty(shape, dtype)` allocates it (default torch.empty)."""
    a = np.asarray(a)
    if empty is None:
        return torch.from_numpy(np.array(a, dtype=np.uint16, copy=True)).view(torch.bfloat16)
    out = empty(a.shape, torch.bfloat16)
    np.copyto(out.view(torch.uint16).numpy(), a, casting="same_kind")
    return out


def encode_sem(ids: np.ndarray) -> bytes:
    return zstd.compress(np.ascontiguousarray(ids, dtype=np.uint8).tobytes(), SEM_ZSTD_LEVEL)


_LIBZSTD: list = []  # [ctypes library or None], loaded once per process


def _libzstd():
    """The system libzstd through ctypes (decompresses straight into a given buffer, without the module's
    intermediate bytes object and its copy: ~15 ms of a v10 sample), or None where there is none."""
    if not _LIBZSTD:
        lib = None
        try:
            lib = ctypes.CDLL(ctypes.util.find_library("zstd") or "libzstd.so.1")
            lib.ZSTD_decompress.restype = ctypes.c_size_t
            lib.ZSTD_decompress.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]
            lib.ZSTD_isError.restype = ctypes.c_uint
            lib.ZSTD_isError.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):
            lib = None
        _LIBZSTD.append(lib)
    return _LIBZSTD[0]


def decode_sem(blob: bytes, shape, out: np.ndarray | None = None) -> np.ndarray:
    """Decompress the sem column into a writable uint8 [F, H, W] array: `out` (C-contiguous, that shape) when
    given, else a new one."""
    shape = tuple(int(s) for s in shape)
    if out is not None:
        if out.shape != shape or out.dtype != np.uint8 or not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError(f"out must be a writable C-contiguous uint8 {shape} array, got {out.dtype} {out.shape}")
        lib = _libzstd() if isinstance(blob, bytes) else None
        if lib is not None:
            n = lib.ZSTD_decompress(out.ctypes.data, out.nbytes, blob, len(blob))
            if not lib.ZSTD_isError(n) and n == out.nbytes:
                return out
            # wrong size or corrupt: the zstd module below reports it
    raw = zstd.decompress(blob)
    if len(raw) != int(np.prod(shape)):
        raise ValueError(f"sem_zst holds {len(raw)} bytes, expected {shape} = {int(np.prod(shape))}")
    if out is None:
        return np.frombuffer(bytearray(raw), dtype=np.uint8).reshape(shape)
    np.copyto(out, np.frombuffer(raw, dtype=np.uint8).reshape(shape))
    return out


def encode_clip(row: dict[str, Any], context_ids: np.ndarray, latents: torch.Tensor, sem_ids: np.ndarray,
                meta_text: str) -> dict[str, Any]:
    """One MDS sample from a validated clip."""
    return {
        "clip_id": row["clip_id"], "run": row["run"], "subset": row["subset"], "scene": row["scene"],
        "drop": int(bool(row["drop"])),
        "context_ids": np.asarray(context_ids, dtype=np.int64),
        "input_latents": bf16_to_bits(latents),
        "sem_shape": np.asarray(sem_ids.shape, dtype=np.int64),
        "sem_zst": encode_sem(sem_ids),
        "meta": meta_text,
    }


@dataclass
class ClipRecord:
    """A decoded sample; `sem_ids()` decompresses on demand."""

    clip_id: str
    run: str
    subset: str
    scene: str
    drop: bool
    context_ids: np.ndarray
    input_latents: torch.Tensor
    sem_shape: tuple[int, ...]
    sem_zst: bytes
    meta_text: str

    @staticmethod
    def from_sample(s: dict[str, Any], empty=None) -> "ClipRecord":
        """`empty(shape, dtype)` allocates the latents tensor (default torch.empty)."""
        return ClipRecord(
            clip_id=s["clip_id"], run=s["run"], subset=s["subset"], scene=s["scene"], drop=bool(s["drop"]),
            context_ids=np.array(s["context_ids"], dtype=np.int64),
            input_latents=bits_to_bf16(s["input_latents"], empty),
            sem_shape=tuple(int(v) for v in s["sem_shape"]), sem_zst=s["sem_zst"], meta_text=s["meta"],
        )

    def sem_ids(self, out: np.ndarray | None = None) -> np.ndarray:
        return decode_sem(self.sem_zst, self.sem_shape, out)

    def meta(self) -> dict[str, Any]:
        return json.loads(self.meta_text)


def read_manifest(out: str) -> dict[str, Any]:
    """The manifest of a finished conversion, or a clear error when the conversion is missing or incomplete."""
    url = storage.join(out, MANIFEST)
    if not storage.exists(url):
        raise BadInput(f"{out}: no {MANIFEST} — not a finished conversion (run convert_data, or let a "
                       f"killed conversion finish by rerunning it)")
    return json.loads(storage.read_bytes(url))
