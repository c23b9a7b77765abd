"""The prepared layout (docs/design.md §4, docs/data_format.md), read and validated: `index/clips.jsonl`, per-clip
`latents/`, `sem/`, `meta/`, the text table and `READY`. The counterpart of `gcc.synth.world`'s writer; used by the
converter, `gcc.tools.sample` and the tests. Every error is a `BadInput` naming the file, clip and field."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open

from gcc import storage
from gcc.cli import os_error_message
from gcc.data.shards import SPLITS, encode_clip
from gcc.errors import BadInput
from gcc.geometry import ORTHOGRAPHIC, PROJECTIONS, Geometry
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
def read_text(path: Path, what: str = "") -> str:
    """A file's UTF-8 text; BadInput naming the file (after `what`, e.g. "clip X: ") when it cannot be read."""
    try:
        return path.read_bytes().decode("utf-8")
    except OSError as e:
        raise BadInput(f"{what}{os_error_message(e)}") from None
    except UnicodeDecodeError as e:
        raise BadInput(f"{what}{path}: not UTF-8 text (byte {e.start} is {e.object[e.start]:#04x})") from None


def read_index(src: Path) -> list[dict[str, Any]]:
    path = src / "index" / "clips.jsonl"
    if not path.exists():
        raise BadInput(f"{path}: missing (expected one JSON row per clip)")
    rows, errors = [], []
    for n, line in enumerate(read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            errors.append(f"{where}: not valid JSON ({e.msg})")
            continue
        if not isinstance(row, dict):
            errors.append(f"{where}: expected a JSON object, got {type(row).__name__}")
            continue
        for name, typ in INDEX_FIELDS.items():
            if name not in row:
                errors.append(f"{where} (clip {row.get('clip_id', '?')}): field '{name}' missing")
            elif not isinstance(row[name], typ):
                errors.append(
                    f"{where} (clip {row.get('clip_id', '?')}): field '{name}' must be "
                    f"{typ.__name__}, got {type(row[name]).__name__}"
                )
        if row.get("split") not in SPLITS and isinstance(row.get("split"), str):
            errors.append(
                f"{where} (clip {row.get('clip_id')}): field 'split' must be one of {SPLITS}, got {row['split']!r}"
            )
        if isinstance(row.get("context_keys"), list) and not all(isinstance(k, str) for k in row["context_keys"]):
            errors.append(f"{where} (clip {row.get('clip_id')}): field 'context_keys' must be a list of str")
        for name in NAME_FIELDS:
            if isinstance(row.get(name), str):
                try:
                    check_component(row[name], f"field '{name}'")
                except UnsafeName as e:
                    errors.append(f"{where}: {e}")
        rows.append(row)
    if errors:
        raise BadInput("\n".join(errors))
    return rows


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
        table = safe_open(str(path), "pt")
    except (SafetensorError, OSError) as e:
        raise BadInput(f"{path}: not a text table (cannot be read as safetensors: {e})") from None
    with table as f:
        keys = list(f.keys())
        shapes = {}
        for k in keys:
            sl = f.get_slice(k)
            if sl.get_dtype() != "BF16":
                raise BadInput(f"{path}: key {k!r} has dtype {sl.get_dtype()}, expected BF16")
            shapes[k] = tuple(sl.get_shape())
    if NULL_PROMPT not in keys:
        raise BadInput(f"{path}: key {NULL_PROMPT!r} missing (the empty-prompt embedding is required)")
    for k in keys:
        try:
            check_text_key(k)
        except UnsafeName as e:
            raise BadInput(f"{path}: {e}") from None
    ref = shapes[NULL_PROMPT]
    if len(ref) != 2:
        raise BadInput(f"{path}: key {NULL_PROMPT!r} has shape {list(ref)}, expected [L, D]")
    for k, s in shapes.items():
        if s != ref:
            raise BadInput(f"{path}: key {k!r} has shape {list(s)}, expected {list(ref)} like {NULL_PROMPT}")
    return sorted(keys), ref, storage.sha256_file(path)


def latents_shape(src: Path, clip_id: str) -> tuple[int, ...]:
    path = src / "latents" / f"{clip_id}.safetensors"
    try:
        with safe_open(str(path), "pt") as f:
            return tuple(f.get_slice("input_latents").get_shape())
    except Exception as e:
        raise BadInput(f"clip {clip_id}: {path}: cannot read 'input_latents' ({e})") from None


def _finite_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def validate_meta(meta: Any, clip_id: str, geo: Geometry, where: str) -> None:
    def bad(fld: str, expected: str, got: Any) -> BadInput:
        return BadInput(f"clip {clip_id}: {where}: field '{fld}' must be {expected}, got {got!r}"[:500])

    if not isinstance(meta, dict):
        raise bad("(root)", "a JSON object", type(meta).__name__)
    n_frames, hgt, wid = geo.sem_shape
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


def _read_member(cid: str, path: Path, key: str):
    """One tensor of a .safetensors file or one array of a .npz file; failures name clip, file and key."""
    try:
        if path.suffix == ".safetensors":
            with safe_open(str(path), "pt") as f:
                keys = list(f.keys())
                if key in keys:
                    return f.get_tensor(key)
        else:
            with np.load(path) as z:
                keys = list(z.files)
                if key in keys:
                    return z[key]
    except Exception as e:
        raise BadInput(f"clip {cid}: {path}: unreadable {path.suffix[1:]} file ({e})") from None
    raise BadInput(f"clip {cid}: {path}: key '{key}' missing (has {keys[:5]})")


def _check_array(
    cid: str, path: Path, key: str, dtype, shape: tuple, want_dtype, want_shape: tuple, shape_note: str
) -> None:
    if dtype != want_dtype:
        name = str(want_dtype).replace("torch.", "").replace("<class 'numpy.", "").rstrip("'>")
        raise BadInput(f"clip {cid}: {path}: '{key}' dtype must be {name}, got {dtype}")
    if shape != tuple(want_shape):
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
    lat = _read_member(cid, paths["latents"], "input_latents")
    _check_array(
        cid,
        paths["latents"],
        "input_latents",
        lat.dtype,
        tuple(lat.shape),
        torch.bfloat16,
        geo.latent_shape,
        "the dataset geometry",
    )
    finite = torch.isfinite(lat)
    if not bool(finite.all()):
        raise BadInput(
            f"clip {cid}: {paths['latents']}: 'input_latents' must be finite, has {int((~finite).sum())} NaN/inf values"
        )
    sem = _read_member(cid, paths["sem"], "ids")
    _check_array(
        cid,
        paths["sem"],
        "ids",
        sem.dtype,
        tuple(sem.shape),
        np.uint8,
        geo.sem_shape,
        "F = 4·(T−1)+1, H, W = 16·latent h, w",
    )
    bad_vals = invalid_values(sem, "parts")
    if bad_vals:
        raise BadInput(
            f"clip {cid}: {paths['sem']}: 'ids' holds values {bad_vals[:10]} outside the vocabulary (0..6, 10..21, 255)"
        )
    # meta
    meta_text = read_text(paths["meta"], f"clip {cid}: ")
    try:
        meta = json.loads(meta_text)
    except json.JSONDecodeError as e:
        raise BadInput(f"clip {cid}: {paths['meta']}: not valid JSON ({e.msg} at line {e.lineno})") from None
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
