"""The prepared layout (docs/design.md §4, docs/data_format.md), read and validated: `index/clips.jsonl`, per-clip
`latents/`, `sem/`, `meta/`, the text table and `READY`. The counterpart of `gcc.synth.world`'s writer; used by the
converter, `gcc.tools.sample` and the tests. Every error is a `BadInput` naming the file, clip and field."""

from __future__ import annotations

import math
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open

from gcc import inputs, storage
from gcc.data.shards import MAX_ELEMENTS, SPLITS, check_meta, encode_clip, meta_cap
from gcc.errors import BadInput
from gcc.geometry import Geometry
from gcc.names import UnsafeName, check_component, check_text_key
from gcc.vocab import NULL_PROMPT, invalid_values

INDEX_FIELDS = {
    "clip_id": str,
    "run": str,
    "subset": str,
    "scene": str,
    "split": str,
    "drop": bool,
    "context_keys": list,
}
NAME_FIELDS = ("clip_id", "run", "subset", "scene")  # each names files (latents/<clip_id>..., raw/<subset>/...)


# ---- reading and validating the prepared layout -------------------------------------------------------
def read_text(path: Path, what: str = "", kind: str = "text", cap: int | None = None) -> str:
    """A file's UTF-8 text, through `gcc.inputs` (a regular file of at most `cap` bytes, by default its kind's);
    BadInput naming the file (after `what`, e.g. "clip X: ") otherwise."""
    try:
        return inputs.read_text(path, kind, cap)
    except BadInput as e:
        raise BadInput(f"{what}{e}") from None


# a row of clips.jsonl: at most this long, its context keys at most this many (a clip has one per latent frame)
MAX_INDEX_LINE = 64 * 1024
MAX_CONTEXT_KEYS = 1024
# the errors of an index said at most: reading stops there (a file of a million bad lines is one message, in a moment)
MAX_ERRORS = 20


def read_index(src: Path) -> list[dict[str, Any]]:
    """The rows of `src/index/clips.jsonl`, each checked (fields, types, names, split), read line by line: what is
    held is the rows kept (their INDEX_FIELDS alone) and at most MAX_ERRORS messages, never the file. BadInput
    naming each bad line and field, all of them, or the first MAX_ERRORS (the file is not read further)."""
    path = src / "index" / "clips.jsonl"
    if not path.exists():
        raise BadInput(f"{path}: missing (expected one JSON row per clip)")
    rows: list[dict[str, Any]] = []
    errors: list[str] = []
    for n, line in inputs.read_lines(path, "jsonl", MAX_INDEX_LINE):
        if line.strip():
            row = _index_row(line, f"{path}:{n}", errors.append)
            if row is not None:
                rows.append(row)
        if len(errors) >= MAX_ERRORS:
            errors.append(f"(the first {len(errors)} errors: {path} was not read further)")
            break
    if errors:
        raise BadInput("\n".join(errors))
    return rows


def _index_row(line: str, where: str, error) -> dict[str, Any] | None:
    """One row of clips.jsonl checked, each problem said through `error`: its INDEX_FIELDS (context keys interned:
    clips share them), or None when it has a problem."""
    try:
        row = inputs.parse_json(line, where)
    except BadInput as e:
        error(str(e))
        return None
    if not isinstance(row, dict):
        error(f"{where}: expected a JSON object, got {type(row).__name__}")
        return None
    clip = inputs.shown(row.get("clip_id", "?"), 80)
    problems = 0

    def bad(message: str) -> None:
        nonlocal problems
        problems += 1
        error(message)

    for name, typ in INDEX_FIELDS.items():
        if name not in row:
            bad(f"{where} (clip {clip}): field '{name}' missing")
        elif not isinstance(row[name], typ):
            bad(f"{where} (clip {clip}): field '{name}' must be {typ.__name__}, got {type(row[name]).__name__}")
    if row.get("split") not in SPLITS and isinstance(row.get("split"), str):
        bad(f"{where} (clip {clip}): field 'split' must be one of {SPLITS}, got {inputs.shown(repr(row['split']), 40)}")
    keys = row.get("context_keys")
    if isinstance(keys, list) and not (len(keys) <= MAX_CONTEXT_KEYS and all(isinstance(k, str) for k in keys)):
        bad(f"{where} (clip {clip}): field 'context_keys' must be a list of at most {MAX_CONTEXT_KEYS} str")
    for name in NAME_FIELDS:
        if isinstance(row.get(name), str):
            try:
                check_component(row[name], f"field '{name}'")
            except UnsafeName as e:
                bad(f"{where}: {e}")
    if problems:
        return None
    kept = {name: row[name] for name in INDEX_FIELDS}
    kept["context_keys"] = [sys.intern(k) for k in keys]  # type: ignore[union-attr]  # checked above
    return kept


def check_splits(rows: list[dict[str, Any]]) -> None:
    """A clip or a run in both train and val would leak validation data into training."""
    by = {s: [r for r in rows if r["split"] == s] for s in SPLITS}
    clips = {s: [r["clip_id"] for r in by[s]] for s in SPLITS}
    shared_clips = sorted(set(clips["train"]) & set(clips["val"]))
    if shared_clips:
        raise BadInput(f"train/val overlap: clip(s) {shared_clips[:10]} are in both splits")
    for s in SPLITS:
        dups = sorted(c for c, n in Counter(clips[s]).items() if n > 1)
        if dups:
            raise BadInput(f"index: clip_id(s) {dups[:10]} appear more than once in split {s!r}")
    runs = {s: {r["run"] for r in by[s]} for s in SPLITS}
    shared_runs = sorted(runs["train"] & runs["val"])
    if shared_runs:
        raise BadInput(
            f"train/val overlap: run(s) {shared_runs[:10]} have clips in both splits "
            f"({len(shared_runs)} runs); a run must belong to one split"
        )


def read_text_table(src: Path) -> tuple[list[str], tuple[int, int], str]:
    path = src / "text" / "table.safetensors"
    if not path.is_file():
        raise BadInput(f"{path}: text table missing (expected a safetensors file)")
    try:
        header, _ = inputs.safetensors_header(path)
    except BadInput as e:
        raise BadInput(f"{path}: not a text table ({str(e).removeprefix(f'{path}: ')})") from None
    keys, shapes = list(header), {}
    for k, entry in header.items():
        if entry.dtype != "BF16":
            raise BadInput(f"{path}: key {inputs.shown(repr(k))} has dtype {entry.dtype}, expected BF16")
        shapes[k] = entry.shape
    if NULL_PROMPT not in keys:
        raise BadInput(f"{path}: key {NULL_PROMPT!r} missing (the empty-prompt embedding is required)")
    for k in keys:
        try:
            check_text_key(k)
        except UnsafeName as e:
            raise BadInput(f"{path}: {e}") from None
    ref = shapes[NULL_PROMPT]
    if len(ref) != 2 or 0 in ref or math.prod(ref) > MAX_ELEMENTS["text"]:
        raise BadInput(
            f"{path}: key {NULL_PROMPT!r} has shape {list(ref)}, expected [L, D] of at most "
            f"{MAX_ELEMENTS['text']} elements"
        )
    for k, s in shapes.items():
        if s != ref:
            raise BadInput(f"{path}: key {k!r} has shape {list(s)}, expected {list(ref)} like {NULL_PROMPT}")
    return sorted(keys), ref, storage.sha256_file(path)


def latents_shape(src: Path, clip_id: str) -> tuple[int, ...]:
    path = src / "latents" / f"{clip_id}.safetensors"
    try:
        header, _ = inputs.safetensors_header(path)
    except BadInput as e:
        raise BadInput(f"clip {clip_id}: {e}") from None
    if "input_latents" not in header:
        raise BadInput(f"clip {clip_id}: {path}: key 'input_latents' missing")
    shape = header["input_latents"].shape
    if math.prod(shape) > MAX_ELEMENTS["latents"]:
        raise BadInput(
            f"clip {clip_id}: {path}: 'input_latents' {list(shape)} is larger than latents may be "
            f"({MAX_ELEMENTS['latents']} elements)"
        )
    return shape


def validate_meta(meta: Any, clip_id: str, geo: Geometry, where: str) -> None:
    """`gcc.data.shards.check_meta` against the geometry's sem shape (the one rule for every reader of a meta)."""
    check_meta(meta, clip_id, geo.sem_shape, where)


def _read_member(cid: str, path: Path, key: str, want_dtype, want_shape: tuple, shape_note: str):
    """One tensor of a .safetensors file or one array of a .npz file. Its header is read first (`gcc.inputs`: the
    declared sizes inside the file, without reading or inflating data) and its dtype and shape checked against
    `want_dtype` and `want_shape` (the dataset's geometry) before a byte of it is read. Failures name clip, file
    and key."""
    try:
        if path.suffix == ".safetensors":
            declared = {
                k: (_TORCH_DTYPES.get(e.dtype, e.dtype), e.shape) for k, e in inputs.safetensors_header(path)[0].items()
            }
        else:
            declared = inputs.npy_members(path)
            declared = {k: (dtype, shape) for k, (shape, dtype) in declared.items()}
    except BadInput as e:
        raise BadInput(f"clip {cid}: {e}") from None
    if key not in declared:
        raise BadInput(f"clip {cid}: {path}: key '{key}' missing (has {[inputs.shown(k, 80) for k in declared][:5]})")
    _check_array(cid, path, key, *declared[key], want_dtype, want_shape, shape_note)
    try:
        if path.suffix == ".safetensors":
            with safe_open(str(path), "pt") as f:
                return f.get_tensor(key)
        with np.load(path, allow_pickle=False) as z:
            return z[key]
    except Exception as e:
        raise BadInput(f"clip {cid}: {path}: unreadable {path.suffix[1:]} file ({e})") from None


# safetensors' dtype names as torch's (the latents are compared with torch.bfloat16)
_TORCH_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64}


def _check_array(
    cid: str, path: Path, key: str, dtype, shape: tuple, want_dtype, want_shape: tuple, shape_note: str
) -> None:
    if dtype != want_dtype:
        name = str(want_dtype).replace("torch.", "").replace("<class 'numpy.", "").rstrip("'>")
        raise BadInput(f"clip {cid}: {path}: '{key}' dtype must be {name}, got {dtype}")
    if tuple(shape) != tuple(want_shape):
        raise BadInput(
            f"clip {cid}: {path}: '{key}' shape must be {list(want_shape)} ({shape_note}), got {list(shape)}"
        )


def load_clip(src: Path, row: dict[str, Any], geo: Geometry, ids_of: dict[str, int]) -> dict[str, Any]:
    """Read and validate one clip; returns it as an MDS sample (`shards.ClipRecord.from_sample` decodes it) or
    raises BadInput naming clip and field."""
    cid = row["clip_id"]
    paths = clip_files(src, cid)
    for kind, p in paths.items():
        if not p.exists():
            raise BadInput(f"clip {cid}: {kind} file {p} is missing")
    keys = row["context_keys"]
    if len(keys) != geo.T:
        raise BadInput(
            f"clip {cid}: index field 'context_keys' must hold {geo.T} keys (one per latent frame), got {len(keys)}"
        )
    unknown = sorted(set(keys) - set(ids_of))
    if unknown:
        raise BadInput(f"clip {cid}: index field 'context_keys' has keys not in the text table: {unknown[:5]}")
    lat = _read_member(cid, paths["latents"], "input_latents", torch.bfloat16, geo.latent_shape, "the dataset geometry")
    finite = torch.isfinite(lat)
    if not bool(finite.all()):
        raise BadInput(
            f"clip {cid}: {paths['latents']}: 'input_latents' must be finite, has {int((~finite).sum())} NaN/inf values"
        )
    sem = _read_member(cid, paths["sem"], "ids", np.uint8, geo.sem_shape, "F = 4·(T−1)+1, H, W = 16·latent h, w")
    bad_vals = invalid_values(sem, "parts")
    if bad_vals:
        raise BadInput(
            f"clip {cid}: {paths['sem']}: 'ids' holds values {bad_vals[:10]} outside the vocabulary (0..6, 10..21, 255)"
        )
    # meta
    meta_text = read_text(paths["meta"], f"clip {cid}: ", "json", meta_cap(geo.sem_shape))
    meta = inputs.parse_json(meta_text, f"clip {cid}: {paths['meta']}")
    validate_meta(meta, cid, geo, str(paths["meta"]))
    return encode_clip(row, np.array([ids_of[k] for k in keys], dtype=np.int64), lat, sem, meta_text)


def clip_files(src: Path, cid: str) -> dict[str, Path]:
    return {
        "latents": src / "latents" / f"{cid}.safetensors",
        "sem": src / "sem" / f"{cid}.npz",
        "meta": src / "meta" / f"{cid}.json",
    }


def geometry_of(src: Path, clip_id: str, text_shape: tuple[int, int]) -> Geometry:
    """The dataset's geometry, from one clip's latents and the text table (every clip is checked against it)."""
    first = latents_shape(src, clip_id)
    if len(first) != 4:
        raise BadInput(f"clip {clip_id}: 'input_latents' must be 4-D [C, T, h, w], got {list(first)}")
    return Geometry.from_shapes(first, text_shape)
