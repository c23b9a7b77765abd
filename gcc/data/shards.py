"""The MDS shard format written by `convert_data` and read by the training loader (docs/design.md §4).

Output of a conversion:
    <out>/manifest.json             written last; its presence means the conversion is complete
    <out>/text/table.safetensors    the text table, copied verbatim
    <out>/<split>/index.json        one MDS dataset per split (train, val), merged from chunk folders
    <out>/<split>/chunk_NNNNN/      the shards of a fixed group of clips (independent of --workers)

One sample (one clip) has the columns below. bf16 has no MDS dtype, so latents travel as their uint16 bit
pattern. The sem ids are zstd-compressed per clip so that a sample whose condition is dropped never
decompresses them, and so that the decompressed shard cache stays small.

Shards are data, never code: every reader (the loader, gcc-sample, gcc-maskstats) takes a split's `index.json`
through `check_index` before Streaming sees it (the columns and encodings must be exactly `COLUMNS`, so no
pickled column is ever decoded; shard names must be the converter's; the sample counts must be the manifest's)
and decodes each sample through `SplitFormat.decode` (shapes and ids checked against the manifest before
anything is allocated from them). The manifest itself is checked by `check_manifest` when it is read.

Sizes declared inside the data are bounded by the manifest's geometry (docs/training.md, "Trust and safety"):
`check_index` bounds each shard's declared bytes by what its samples can take (`max_shard_bytes`), a shard file
is read only at its declared size (`gcc.inputs.read_shard_file`), a compressed one inflated at most to its
declared raw size (`gcc.inputs.inflate_shard`, which the loader's Streaming uses too:
gcc.compat.streaming.BoundedStream), a sample's sem ids at most F·H·W (`decode_sem`), and its meta is checked once (`check_meta`) when the sample is decoded.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import zstd

from gcc import inputs, storage
from gcc.errors import BadInput, DamagedData
from gcc.geometry import ORTHOGRAPHIC, PROJECTIONS
from gcc.names import UnsafeName, check_component, check_shard_basename
from gcc.vocab import has_invalid, invalid_values

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


def decode_sem(blob: bytes, shape, out: np.ndarray | None = None, where: str = "sem_zst") -> np.ndarray:
    """Decompress the sem column into a writable uint8 [F, H, W] array: `out` (C-contiguous, that shape) when
    given, else a new one. The frame never inflates past F·H·W bytes (`gcc.inputs.decompress_zstd`): a sample
    that declares more is refused (BadInput naming `where`) before it costs more memory than its geometry. Ids
    outside the raw vocabulary (docs/design.md §2) are refused here, the one place every reader of them passes:
    the model counts such a value as no class, and does not read its input back to look."""
    return _checked(_decompress_sem(blob, shape, out, where), where)


def _checked(ids: np.ndarray, where: str) -> np.ndarray:
    if has_invalid(ids):
        raise BadInput(f"{where}: sem ids hold values outside the vocabulary: {invalid_values(ids)[:10]}")
    return ids


def _decompress_sem(blob: bytes, shape, out: np.ndarray | None, where: str) -> np.ndarray:
    shape = tuple(int(s) for s in shape)
    if out is not None:
        if out.shape != shape or out.dtype != np.uint8 or not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError(f"out must be a writable C-contiguous uint8 {shape} array, got {out.dtype} {out.shape}")
        lib = _libzstd() if isinstance(blob, bytes) else None
        if lib is not None:
            n = lib.ZSTD_decompress(out.ctypes.data, out.nbytes, blob, len(blob))
            if not lib.ZSTD_isError(n) and n == out.nbytes:
                return out
            # wrong size or corrupt: the bounded decompression below says which
    want = math.prod(shape)
    raw = inputs.decompress_zstd(bytes(blob), want, where)
    if len(raw) != want:
        raise BadInput(f"{where}: holds {len(raw)} bytes, expected {list(shape)} = {want}")
    if out is None:
        return np.frombuffer(bytearray(raw), dtype=np.uint8).reshape(shape)
    np.copyto(out, np.frombuffer(raw, dtype=np.uint8).reshape(shape))
    return out


def encode_clip(
    row: dict[str, Any], context_ids: np.ndarray, latents: torch.Tensor, sem_ids: np.ndarray, meta_text: str
) -> dict[str, Any]:
    """One MDS sample from a validated clip."""
    return {
        "clip_id": row["clip_id"],
        "run": row["run"],
        "subset": row["subset"],
        "scene": row["scene"],
        "drop": int(bool(row["drop"])),
        "context_ids": np.asarray(context_ids, dtype=np.int64),
        "input_latents": bf16_to_bits(latents),
        "sem_shape": np.asarray(sem_ids.shape, dtype=np.int64),
        "sem_zst": encode_sem(sem_ids),
        "meta": meta_text,
    }


@dataclass
class ClipRecord:
    """A decoded sample; `sem_ids()` decompresses on demand, `meta()` parses and checks the meta once."""

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
    _meta: dict[str, Any] | None = field(default=None, repr=False, compare=False)

    @staticmethod
    def from_sample(s: dict[str, Any], empty=None) -> ClipRecord:
        """`empty(shape, dtype)` allocates the latents tensor (default torch.empty)."""
        return ClipRecord(
            clip_id=s["clip_id"],
            run=s["run"],
            subset=s["subset"],
            scene=s["scene"],
            drop=bool(s["drop"]),
            context_ids=np.array(s["context_ids"], dtype=np.int64),
            input_latents=bits_to_bf16(s["input_latents"], empty),
            sem_shape=tuple(int(v) for v in s["sem_shape"]),
            sem_zst=s["sem_zst"],
            meta_text=s["meta"],
        )

    def sem_ids(self, out: np.ndarray | None = None) -> np.ndarray:
        return decode_sem(self.sem_zst, self.sem_shape, out, f"clip {self.clip_id}: sem_zst")

    def meta(self) -> dict[str, Any]:
        """The clip's meta, checked (`check_meta`) against its sem shape: every field a reader uses is there, of
        the type it expects (BadInput naming the clip and the field otherwise)."""
        if self._meta is None:
            where = f"clip {self.clip_id}: meta"
            if len(self.meta_text) > meta_cap(self.sem_shape):
                raise BadInput(f"{where}: {len(self.meta_text)} characters, more than its frames allow")
            meta = inputs.parse_json(self.meta_text, where, "a clip's meta")
            check_meta(meta, self.clip_id, self.sem_shape, "meta")
            self._meta = meta
        return self._meta


def meta_cap(sem_shape: tuple[int, ...]) -> int:
    """The most bytes a clip's meta may hold: its fixed fields and one camera and ground height per frame, with a
    wide margin (a synthetic clip's meta is about 250 bytes a frame)."""
    return 64 * 1024 + 4096 * int(sem_shape[0])


def _finite_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_meta(meta: Any, clip_id: str, sem_shape: tuple[int, ...], where: str) -> None:
    """A clip's meta (docs/data_format.md): src/dst size, ground height and a camera per frame of its sem ids
    [F, H, W]. Raises BadInput naming the clip, `where` and the field. The converter checks it when it reads the
    prepared clip, and every reader of shards when it decodes the sample."""

    def bad(fld: str, expected: str, got: Any) -> BadInput:
        return BadInput(
            f"clip {clip_id}: {where}: field '{fld}' must be {expected}, got {inputs.shown(repr(got), 300)}"
        )

    if not isinstance(meta, dict):
        raise bad("(root)", "a JSON object", type(meta).__name__)
    n_frames, hgt, wid = sem_shape
    if meta.get("clip_id", clip_id) != clip_id:
        raise bad("clip_id", f"{clip_id!r}", meta.get("clip_id"))
    for key in ("src_hw", "dst_hw"):
        v = meta.get(key)
        if not (isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) and x > 0 for x in v)):
            raise bad(key, "[height, width] positive integers", v)
    if meta["dst_hw"] != [hgt, wid]:
        raise bad("dst_hw", f"{[hgt, wid]} (the sem ids' H, W)", meta["dst_hw"])
    gz = meta.get("ground_z")
    if not (
        isinstance(gz, list)
        and len(gz) == n_frames
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isinf(v) for v in gz)
    ):
        raise bad(
            "ground_z",
            f"a list of {n_frames} numbers (NaN allowed)",
            f"{type(gz).__name__} of length {len(gz) if isinstance(gz, list) else '-'}",
        )
    cams = meta.get("cameras")
    if not (isinstance(cams, list) and len(cams) == n_frames):
        raise bad(
            "cameras",
            f"a list of {n_frames} cameras",
            f"{type(cams).__name__} of length {len(cams) if isinstance(cams, list) else '-'}",
        )
    for i, cam in enumerate(cams):
        f = f"cameras[{i}]"
        if not isinstance(cam, dict):
            raise bad(f, "an object", cam)
        for key in ("location", "rotation"):
            v = cam.get(key)
            if not (isinstance(v, list) and len(v) == 3 and all(_finite_number(x) for x in v)):
                raise bad(f"{f}.{key}", "3 finite numbers", v)
        proj = cam.get("projection")
        if proj not in PROJECTIONS:
            raise bad(f"{f}.projection", f"one of {PROJECTIONS}", proj)
        if proj == ORTHOGRAPHIC:
            if not (_finite_number(cam.get("ortho_width")) and cam["ortho_width"] > 0):
                raise bad(f"{f}.ortho_width", "a positive number", cam.get("ortho_width"))
        elif not (_finite_number(cam.get("fov_deg")) and 0 < cam["fov_deg"] < 180):
            raise bad(f"{f}.fov_deg", "a number in (0, 180)", cam.get("fov_deg"))


# Bounds on what a manifest may declare (elements of one clip's arrays). v10: latents 1.6 M, sem ids 32 M, a text
# cell 2 M; far above any real geometry, far below what would exhaust a machine's memory.
MAX_ELEMENTS = {"latents": 1 << 28, "sem": 1 << 31, "text": 1 << 26}


def _positive_ints(v: Any, n: int) -> bool:
    return (
        isinstance(v, list) and len(v) == n and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in v)
    )


def check_manifest(m: Any, where: str) -> dict[str, Any]:
    """A manifest as convert_data writes it: the fields every reader relies on, with sane types, sizes and names
    (clip ids and runs are names from outside: gcc.names). Raises BadInput naming `where` and the field."""

    def bad(field: str, expected: str) -> BadInput:
        return BadInput(
            f"{where}: field {field!r} must be {expected}; not a manifest that convert_data wrote (reconvert the data)"
        )

    if not isinstance(m, dict):
        raise bad("(root)", "a JSON object")
    if m.get("format_version") != FORMAT_VERSION:
        raise bad("format_version", f"{FORMAT_VERSION} (got {str(m.get('format_version'))[:40]!r})")
    geo = m.get("geometry")
    if not isinstance(geo, dict):
        raise bad("geometry", "an object")
    for key, dims in (("latents", 4), ("sem", 3), ("text", 2)):
        if not _positive_ints(geo.get(key), dims) or int(np.prod(geo[key], dtype=np.float64)) > MAX_ELEMENTS[key]:
            raise bad(f"geometry.{key}", f"{dims} positive integers, at most {MAX_ELEMENTS[key]} elements")
    if "name" in m:  # absent in a manifest of an earlier convert_data (exports then record the folder's name)
        try:
            check_component(m["name"], "name")
        except UnsafeName as e:
            raise BadInput(f"{where}: {e}") from None
    if not isinstance(m.get("synthetic", False), bool):  # absent in a manifest of an earlier convert_data
        raise bad("synthetic", "true or false")
    if not isinstance(m.get("text_keys"), int) or m["text_keys"] < 1:
        raise bad("text_keys", "a positive integer")
    splits, counts = m.get("splits"), m.get("counts")
    if not isinstance(splits, dict) or set(splits) != set(SPLITS):
        raise bad("splits", f"an object with exactly {list(SPLITS)}")
    if not isinstance(counts, dict):
        raise bad("counts", "an object")
    for split, v in splits.items():
        if not isinstance(v, dict):
            raise bad(f"splits.{split}", "an object")
        ids, runs = v.get("clip_ids"), v.get("clip_runs")
        if not isinstance(ids, list) or not isinstance(runs, list) or len(ids) != len(runs):
            raise bad(f"splits.{split}.clip_ids", "a list as long as clip_runs")
        if counts.get(split) != len(ids) or v.get("clips") != len(ids):
            raise bad(f"counts.{split}", f"the number of clip_ids ({len(ids)})")
        try:  # the names first: only strings may be compared as sets
            for i, (c, r) in enumerate(zip(ids, runs)):
                check_component(c, f"splits.{split}.clip_ids[{i}]")
                check_component(r, f"splits.{split}.clip_runs[{i}]")
        except UnsafeName as e:
            raise BadInput(f"{where}: {e}") from None
        named = v.get("runs")
        if not isinstance(named, list) or not all(isinstance(r, str) for r in named) or set(named) != set(runs):
            raise bad(f"splits.{split}.runs", "the set of clip_runs")
    return m


def read_manifest(out: str) -> dict[str, Any]:
    """The manifest of a finished conversion, checked (`check_manifest`), or a clear error when the conversion is
    missing, incomplete or not one of convert_data's."""
    url = storage.join(out, MANIFEST)
    if not storage.exists(url):
        raise BadInput(
            f"{out}: no {MANIFEST} — not a finished conversion (run convert_data, or let a "
            f"killed conversion finish by rerunning it)"
        )
    return parse_manifest(storage.read_bytes(url), url)


def parse_manifest(data: bytes, where: str) -> dict[str, Any]:
    try:
        m = inputs.parse_json(inputs.decode_text(data, where, "valid JSON"), where)
    except BadInput as e:
        raise BadInput(f"{e}; not a manifest that convert_data wrote") from None
    return check_manifest(m, where)


# MDS writes a shard's sample offsets as uint32: no shard is larger
MDS_SHARD_MAX = (1 << 32) - 1
# a sample's bytes besides its arrays: the five strings' lengths and names (at most 200 characters each: gcc.names),
# each column's size field, each array's shape header
SAMPLE_OVERHEAD = 4096


def zstd_bound(n: int) -> int:
    """The most bytes zstd's compressor writes for `n` bytes of input (ZSTD_COMPRESSBOUND, with room)."""
    return n + (n >> 7) + (1 << 16)


def max_sample_bytes(geometry: dict[str, Any]) -> int:
    """The most bytes one stored sample of this geometry can take: latents (bf16), context ids (int64 per latent
    frame), the sem shape, the compressed sem ids and the meta (`meta_cap`)."""
    c, t, h, w = geometry["latents"]
    sem = tuple(geometry["sem"])
    return 2 * c * t * h * w + 8 * t + 8 * 3 + zstd_bound(math.prod(sem)) + 4 * meta_cap(sem) + SAMPLE_OVERHEAD


def max_shard_bytes(geometry: dict[str, Any], samples: int) -> int:
    """The most bytes an uncompressed shard of `samples` samples of this geometry can take (MDS: a count, one
    offset per sample and one more, then the samples), never more than MDS's own limit."""
    return min(4 + 4 * (samples + 1) + samples * max_sample_bytes(geometry), MDS_SHARD_MAX)


SHARD_FIELDS = {"format": "mds", "version": 2}
COMPRESSIONS = (None, "zstd")


def check_index(data: bytes, manifest: dict[str, Any], split: str, where: str) -> dict[str, Any]:
    """A split's index.json, checked before any reader acts on it: the format is the converter's (MDS version 2,
    exactly `COLUMNS`: nothing pickled is ever decoded), every shard name is the converter's (gcc.names), every
    shard carries the hash the loader verifies, and the sample counts add up to the manifest's. Raises
    DamagedData naming `where`."""

    def bad(what: str) -> DamagedData:
        return DamagedData(
            f"{where}: {what}; not the index convert_data wrote (split {split}) — restore or reconvert it"
        )

    try:
        index = inputs.parse_json(data, where)
    except BadInput as e:
        raise bad(str(e).removeprefix(f"{where}: ")) from None
    if not isinstance(index, dict) or index.get("version") != 2 or not isinstance(index.get("shards"), list):
        raise bad("expected {'version': 2, 'shards': [...]}")
    total = 0
    for n, sh in enumerate(index["shards"]):
        if not isinstance(sh, dict):
            raise bad(f"shard {n} is not an object")
        for k, v in SHARD_FIELDS.items():
            if sh.get(k) != v:
                raise bad(f"shard {n}: {k!r} must be {v!r}, got {str(sh.get(k))[:40]!r}")
        names, encodings = sh.get("column_names"), sh.get("column_encodings")
        if (
            not isinstance(names, list)
            or not isinstance(encodings, list)
            or len(names) != len(encodings)
            or dict(zip(names, encodings)) != COLUMNS
            or len(names) != len(COLUMNS)
        ):
            raise bad(
                f"shard {n}: columns must be exactly {COLUMNS} (got {str(dict(zip(names or [], encodings or [])))[:300]})"
            )
        if "compression" not in sh or sh["compression"] not in COMPRESSIONS:  # null is none, a missing key is not
            raise bad(f"shard {n}: compression must be one of {COMPRESSIONS}, got {str(sh.get('compression'))[:40]!r}")
        raw, zipped = sh.get("raw_data"), sh.get("zip_data")
        if (
            not isinstance(raw, dict)
            or (zipped is not None and not isinstance(zipped, dict))
            or (zipped is None) != (sh.get("compression") is None)
        ):
            raise bad(f"shard {n}: raw_data/zip_data do not match its compression")
        samples = sh.get("samples")
        if not isinstance(samples, int) or isinstance(samples, bool) or samples < 1:
            raise bad(f"shard {n}: 'samples' must be a positive integer")
        # the bytes a reader allocates or inflates for this shard: bounded by what its samples can hold
        raw_cap = max_shard_bytes(manifest["geometry"], samples)
        for info, suffix, cap in ((raw, ".mds", raw_cap), (zipped, ".mds.zstd", zstd_bound(raw_cap))):
            if info is None:
                continue
            try:
                name = check_shard_basename(info.get("basename"), f"shard {n} basename")
            except UnsafeName as e:
                raise bad(str(e)) from None
            if not name.endswith(suffix):
                raise bad(f"shard {n} basename {name!r}: expected a name ending in {suffix}")
            if not isinstance(info.get("hashes"), dict) or not isinstance(info["hashes"].get(SHARD_HASH), str):
                raise bad(f"shard {n} ({name}): no {SHARD_HASH} hash")
            size = info.get("bytes")
            if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= cap:
                raise bad(
                    f"shard {n} ({name}): 'bytes' must be an integer from 0 to {cap} (what {samples} samples of "
                    f"the manifest's geometry can take), got {str(size)[:40]}"
                )
        total += samples
        if total > manifest["counts"][split]:
            break
    if total != manifest["counts"][split]:
        raise bad(
            f"its shards hold {total if total <= manifest['counts'][split] else 'more than ' + str(total)} "
            f"samples, the manifest {manifest['counts'][split]}"
        )
    return index


@dataclass(frozen=True)
class SplitFormat:
    """What every sample of a split must be, from its manifest: its clip id (sample id i is the split's clip i),
    latents and sem shapes, and text ids below the table's size. `decode` checks a sample against it before it
    allocates anything from the sample's declared sizes."""

    split: str
    clip_ids: tuple[str, ...]
    latents: tuple[int, ...]
    sem: tuple[int, ...]
    text_keys: int

    @classmethod
    def of(cls, manifest: dict[str, Any], split: str) -> SplitFormat:
        g = manifest["geometry"]
        return cls(
            split,
            tuple(manifest["splits"][split]["clip_ids"]),
            tuple(g["latents"]),
            tuple(g["sem"]),
            int(manifest["text_keys"]),
        )

    def decode(self, s: dict[str, Any], sample_id: int, where: str, empty=None) -> ClipRecord:
        """The sample as a ClipRecord, or ValueError (BadInput for its meta: `check_meta`) naming the field and
        what the manifest expects."""
        want = self.clip_ids[sample_id] if 0 <= sample_id < len(self.clip_ids) else None
        if s.get("clip_id") != want:
            raise ValueError(
                f"{where}: sample {sample_id} holds clip {str(s.get('clip_id'))[:80]!r}, the manifest says {want!r}"
            )
        checks = (
            ("input_latents", np.shape(s["input_latents"]), self.latents),
            ("sem_shape", tuple(int(v) for v in np.ravel(s["sem_shape"])), self.sem),
            ("context_ids", np.shape(s["context_ids"]), self.latents[1:2]),
        )
        for name, got, expected in checks:
            if tuple(got) != tuple(expected):
                raise ValueError(
                    f"{where}: clip {want}: {name} is {list(got)}, the manifest's geometry says {list(expected)}"
                )
        ids = np.asarray(s["context_ids"])
        if ids.size and (ids.min() < 0 or ids.max() >= self.text_keys):
            raise ValueError(
                f"{where}: clip {want}: context_ids must be in [0, {self.text_keys}), got "
                f"{int(ids.min())}..{int(ids.max())}"
            )
        rec = ClipRecord.from_sample(s, empty)
        rec.meta()  # parsed and checked once, here: no reader meets a meta without the fields it uses
        return rec
