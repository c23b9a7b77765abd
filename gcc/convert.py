"""Prepared clips -> MDS shards (SPEC §4). Entry points: `python -m convert_data` and the `convert_data` script.

How it stays correct when interrupted:
* Clips of each split are cut, in sorted clip_id order, into fixed chunks of `--chunk-clips`. A chunk is the
  unit of work and of resumption; the cut does not depend on `--workers`, so any worker count writes the
  same bytes.
* A chunk is written to a staging folder and becomes visible only complete: locally by an atomic rename, on
  S3 by uploading its `DONE.json` last. A chunk without a matching `DONE.json` is redone from scratch.
  (Streaming's MDSWriter writes `index.json` even when a write fails, so its presence proves nothing.)
* `manifest.json` is written last; without it the output is not a dataset (the loader refuses it).
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import math
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import torch
from safetensors import safe_open

from gcc import __version__, storage
from gcc.geometry import ORTHOGRAPHIC, PROJECTIONS
from gcc.shards import COLUMNS, FORMAT_VERSION, MANIFEST, SPLITS, TEXT_TABLE, encode_clip
from gcc.vocab import NULL_PROMPT, invalid_values, key_to_id
from gcc.workers import pool_worker_init, worker_context

CONVERTER_VERSION = f"gcc-convert/{__version__}/format{FORMAT_VERSION}"
DONE = "DONE.json"
INDEX_FIELDS = {"clip_id": str, "run": str, "subset": str, "scene": str, "split": str, "drop": bool,
                "context_keys": list}
EXIT_BAD_INPUT = 2


class BadInput(Exception):
    """Input that cannot be converted; the message names the file/clip, the field and what was expected."""


@dataclass(frozen=True)
class Geometry:
    latents: tuple[int, int, int, int]  # C, T, h, w
    text: tuple[int, int]  # L, D

    @property
    def sem(self) -> tuple[int, int, int]:
        c, t, h, w = self.latents
        return (4 * (t - 1) + 1, 16 * h, 16 * w)

    def as_dict(self) -> dict[str, Any]:
        return {"latents": list(self.latents), "sem": list(self.sem), "text": list(self.text),
                "latent_frames": self.latents[1], "frames": self.sem[0]}


# ---- reading and validating the prepared layout -------------------------------------------------------
def read_index(src: Path) -> list[dict[str, Any]]:
    path = src / "index" / "clips.jsonl"
    if not path.exists():
        raise BadInput(f"{path}: missing (expected one JSON row per clip)")
    rows, errors = [], []
    for n, line in enumerate(path.read_text().splitlines(), 1):
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
                errors.append(f"{where} (clip {row.get('clip_id', '?')}): field '{name}' must be "
                              f"{typ.__name__}, got {type(row[name]).__name__}")
        if row.get("split") not in SPLITS and isinstance(row.get("split"), str):
            errors.append(f"{where} (clip {row.get('clip_id')}): field 'split' must be one of {SPLITS}, "
                          f"got {row['split']!r}")
        if isinstance(row.get("context_keys"), list) and not all(isinstance(k, str) for k in row["context_keys"]):
            errors.append(f"{where} (clip {row.get('clip_id')}): field 'context_keys' must be a list of str")
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
        raise BadInput(f"train/val overlap: run(s) {shared_runs[:10]} have clips in both splits "
                       f"({len(shared_runs)} runs); a run must belong to one split")


def read_text_table(src: Path) -> tuple[list[str], tuple[int, int], str]:
    path = src / "text" / "table.safetensors"
    if not path.exists():
        raise BadInput(f"{path}: text table missing")
    with safe_open(str(path), "pt") as f:
        keys = list(f.keys())
        shapes = {}
        for k in keys:
            sl = f.get_slice(k)
            if sl.get_dtype() != "BF16":
                raise BadInput(f"{path}: key {k!r} has dtype {sl.get_dtype()}, expected BF16")
            shapes[k] = tuple(sl.get_shape())
    if NULL_PROMPT not in keys:
        raise BadInput(f"{path}: key {NULL_PROMPT!r} missing (the empty-prompt embedding is required)")
    ref = shapes[NULL_PROMPT]
    if len(ref) != 2:
        raise BadInput(f"{path}: key {NULL_PROMPT!r} has shape {list(ref)}, expected [L, D]")
    for k, s in shapes.items():
        if s != ref:
            raise BadInput(f"{path}: key {k!r} has shape {list(s)}, expected {list(ref)} like {NULL_PROMPT}")
    return sorted(keys), ref, sha256_file(path)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


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
    n_frames, hgt, wid = geo.sem
    if meta.get("clip_id", clip_id) != clip_id:
        raise bad("clip_id", f"{clip_id!r}", meta.get("clip_id"))
    for key in ("src_hw", "dst_hw"):
        v = meta.get(key)
        if not (isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) and x > 0 for x in v)):
            raise bad(key, "[height, width] positive integers", v)
    if meta["dst_hw"] != [hgt, wid]:
        raise bad("dst_hw", f"{[hgt, wid]} (the sem ids' H, W)", meta["dst_hw"])
    gz = meta.get("ground_z")
    if not (isinstance(gz, list) and len(gz) == n_frames and
            all(isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isinf(v) for v in gz)):
        raise bad("ground_z", f"a list of {n_frames} numbers (NaN allowed)",
                  f"{type(gz).__name__} of length {len(gz) if isinstance(gz, list) else '-'}")
    cams = meta.get("cameras")
    if not (isinstance(cams, list) and len(cams) == n_frames):
        raise bad("cameras", f"a list of {n_frames} cameras",
                  f"{type(cams).__name__} of length {len(cams) if isinstance(cams, list) else '-'}")
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


def _check_array(cid: str, path: Path, key: str, dtype, shape: tuple, want_dtype, want_shape: tuple,
                 shape_note: str) -> None:
    if dtype != want_dtype:
        name = str(want_dtype).replace("torch.", "").replace("<class 'numpy.", "").rstrip("'>")
        raise BadInput(f"clip {cid}: {path}: '{key}' dtype must be {name}, got {dtype}")
    if shape != tuple(want_shape):
        raise BadInput(f"clip {cid}: {path}: '{key}' shape must be {list(want_shape)} ({shape_note}), "
                       f"got {list(shape)}")


def load_clip(src: Path, row: dict[str, Any], geo: Geometry, ids_of: dict[str, int]) -> dict[str, Any]:
    """Read and validate one clip; returns its MDS sample or raises BadInput naming clip and field."""
    cid = row["clip_id"]
    paths = {"latents": src / "latents" / f"{cid}.safetensors", "sem": src / "sem" / f"{cid}.npz",
             "meta": src / "meta" / f"{cid}.json"}
    for kind, p in paths.items():
        if not p.exists():
            raise BadInput(f"clip {cid}: {kind} file {p} is missing")
    keys = row["context_keys"]
    if len(keys) != geo.latents[1]:
        raise BadInput(f"clip {cid}: index field 'context_keys' must hold {geo.latents[1]} keys (one per "
                       f"latent frame), got {len(keys)}")
    unknown = sorted(set(keys) - set(ids_of))
    if unknown:
        raise BadInput(f"clip {cid}: index field 'context_keys' has keys not in the text table: {unknown[:5]}")
    lat = _read_member(cid, paths["latents"], "input_latents")
    _check_array(cid, paths["latents"], "input_latents", lat.dtype, tuple(lat.shape), torch.bfloat16, geo.latents,
                 "the dataset geometry")
    finite = torch.isfinite(lat)
    if not bool(finite.all()):
        raise BadInput(f"clip {cid}: {paths['latents']}: 'input_latents' must be finite, has "
                       f"{int((~finite).sum())} NaN/inf values")
    sem = _read_member(cid, paths["sem"], "ids")
    _check_array(cid, paths["sem"], "ids", sem.dtype, tuple(sem.shape), np.uint8, geo.sem,
                 "F = 4·(T−1)+1, H, W = 16·latent h, w")
    bad_vals = invalid_values(sem, "parts")
    if bad_vals:
        raise BadInput(f"clip {cid}: {paths['sem']}: 'ids' holds values {bad_vals[:10]} outside the "
                       f"vocabulary (0..6, 10..21, 255)")
    # meta
    meta_text = paths["meta"].read_text()
    try:
        meta = json.loads(meta_text)
    except json.JSONDecodeError as e:
        raise BadInput(f"clip {cid}: {paths['meta']}: not valid JSON ({e.msg} at line {e.lineno})") from None
    validate_meta(meta, cid, geo, str(paths["meta"]))
    return encode_clip(row, np.array([ids_of[k] for k in keys], dtype=np.int64), lat, sem, meta_text)


# ---- plan, chunks, output ------------------------------------------------------------------------------
@dataclass
class Plan:
    src: Path
    out: str
    chunk_clips: int
    size_limit: int
    compression: str
    include_dropped: bool
    geometry: Geometry
    text_keys: list[str]
    signature: dict[str, Any]
    splits: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def chunks(self) -> list[tuple[str, int, list[dict[str, Any]]]]:
        out = []
        for split, rows in self.splits.items():
            for i in range(0, len(rows), self.chunk_clips):
                out.append((split, i // self.chunk_clips, rows[i:i + self.chunk_clips]))
        return out


def chunk_name(idx: int) -> str:
    return f"chunk_{idx:05d}"


def _done_record(plan: Plan, rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"signature": plan.signature, "clip_ids": [r["clip_id"] for r in rows]}


def chunk_is_done(plan: Plan, split: str, idx: int, rows: list[dict[str, Any]]) -> bool:
    url = storage.join(plan.out, split, chunk_name(idx), DONE)
    if not storage.exists(url):
        return False
    try:
        return json.loads(storage.read_bytes(url)) == _done_record(plan, rows)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False


def write_chunk(plan: Plan, split: str, idx: int, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Convert one chunk; returns its stats. Nothing becomes visible unless the whole chunk succeeded."""
    from streaming import MDSWriter

    final = storage.join(plan.out, split, chunk_name(idx))
    remote = storage.is_remote(plan.out)
    stage_root = tempfile.mkdtemp(prefix=f".{chunk_name(idx)}.", dir=None if remote else Path(final).parent)
    stage = os.path.join(stage_root, chunk_name(idx))
    ids_of = key_to_id(plan.text_keys)
    nbytes_src = 0
    try:
        with MDSWriter(out=stage, columns=COLUMNS, compression=plan.compression, hashes=["sha1", "xxh64"],
                       size_limit=plan.size_limit, progress_bar=False) as writer:
            for row in rows:
                sample = load_clip(plan.src, row, plan.geometry, ids_of)
                nbytes_src += sum(p.stat().st_size for p in _clip_files(plan.src, row["clip_id"]))
                writer.write(sample)
        storage.write_bytes(os.path.join(stage, DONE), json.dumps(_done_record(plan, rows)).encode())
        nbytes_out = sum(p.stat().st_size for p in Path(stage).iterdir())
        if remote:
            storage.remove_tree(final)
            files = sorted(p for p in Path(stage).iterdir() if p.name != DONE)
            for p in files:
                storage.upload_file(str(p), storage.join(final, p.name))
            storage.upload_file(os.path.join(stage, DONE), storage.join(final, DONE))  # last: marks complete
        else:
            shutil.rmtree(final, ignore_errors=True)  # a partial chunk from a killed run
            os.replace(stage, final)
        return {"split": split, "chunk": idx, "clips": len(rows), "src_bytes": nbytes_src, "out_bytes": nbytes_out}
    finally:
        shutil.rmtree(stage_root, ignore_errors=True)


def _clip_files(src: Path, cid: str) -> list[Path]:
    return [src / "latents" / f"{cid}.safetensors", src / "sem" / f"{cid}.npz", src / "meta" / f"{cid}.json"]


def _chunk_job(args: tuple[Plan, str, int, list[dict[str, Any]]]) -> dict[str, Any]:
    plan, split, idx, rows = args
    try:
        return write_chunk(plan, split, idx, rows)
    except BadInput as e:
        return {"split": split, "chunk": idx, "error": str(e)}


def make_plan(src: Path, out: str, chunk_clips: int = 64, size_limit: int = 1 << 26,
              compression: str = "zstd", include_dropped: bool = False) -> Plan:
    if not (src / "READY").exists():
        raise BadInput(f"{src}: no READY file — the prepared data is incomplete (prep writes READY last)")
    rows = read_index(src)
    check_splits(rows)
    text_keys, text_shape, text_sha = read_text_table(src)
    kept = [r for r in rows if include_dropped or not r["drop"]]
    if not kept:
        raise BadInput(f"{src}/index/clips.jsonl: no clips to convert (all rows have drop=true?)")
    kept.sort(key=lambda r: r["clip_id"])
    first = latents_shape(src, kept[0]["clip_id"])
    if len(first) != 4:
        raise BadInput(f"clip {kept[0]['clip_id']}: 'input_latents' must be 4-D [C, T, h, w], got {list(first)}")
    geo = Geometry(tuple(int(v) for v in first), tuple(int(v) for v in text_shape))
    signature = {
        "converter_version": CONVERTER_VERSION,
        "source_index_sha256": sha256_file(src / "index" / "clips.jsonl"),
        "text_table_sha256": text_sha,
        "include_dropped": include_dropped, "chunk_clips": chunk_clips, "size_limit": size_limit,
        "compression": compression,
    }
    plan = Plan(src, str(out), chunk_clips, size_limit, compression, include_dropped, geo, text_keys, signature)
    plan.splits = {s: [r for r in kept if r["split"] == s] for s in SPLITS}
    return plan


def _existing_manifest(out: str) -> dict[str, Any] | None:
    url = storage.join(out, MANIFEST)
    return json.loads(storage.read_bytes(url)) if storage.exists(url) else None


def convert(src: str | Path, out: str, workers: int = 1, chunk_clips: int = 64, size_limit: int = 1 << 26,
            compression: str = "zstd", include_dropped: bool = False, progress: bool = True,
            log=print) -> dict[str, Any]:
    """Convert (or finish converting) `src` into `out`; returns the manifest. Raises BadInput."""
    from streaming.base.util import merge_index
    from tqdm import tqdm

    t0 = time.time()
    src = Path(src)
    plan = make_plan(src, out, chunk_clips, size_limit, compression, include_dropped)
    old = _existing_manifest(out)
    if old is not None:
        if old.get("signature") == plan.signature:
            log(f"{out}: already converted from this source ({MANIFEST} matches); nothing to do")
            return old
        diff = sorted(k for k in set(old.get("signature", {})) | set(plan.signature)
                      if old.get("signature", {}).get(k) != plan.signature.get(k))
        raise BadInput(f"{out}: holds a finished conversion of different input or settings (differs in: "
                       f"{', '.join(diff)}); choose another --out or delete it")
    if not storage.is_remote(out):
        for split in SPLITS:
            Path(out, split).mkdir(parents=True, exist_ok=True)
            for stale in Path(out, split).glob(".chunk_*"):  # staging left by a killed run
                shutil.rmtree(stale, ignore_errors=True)
    chunks = plan.chunks()
    todo = [(plan, s, i, rows) for s, i, rows in chunks if not chunk_is_done(plan, s, i, rows)]
    n_clips = sum(len(r) for _, _, r in chunks)
    log(f"converting {src} -> {out}: {n_clips} clips in {len(chunks)} chunks "
        f"({len(chunks) - len(todo)} already done), {workers} worker(s)")
    results, errors = [], []
    bar = tqdm(total=sum(len(t[3]) for t in todo), unit="clip", disable=not progress, file=sys.stderr)
    if workers > 1 and len(todo) > 1:
        # forkserver, not fork: tqdm's monitor thread and boto3's threads live in this process (gcc/workers.py)
        with ProcessPoolExecutor(max_workers=workers, mp_context=worker_context(),
                                 initializer=pool_worker_init, initargs=(os.getpid(), dict(os.environ))) as pool:
            for res in pool.map(_chunk_job, todo):
                results.append(res)
                bar.update(len(todo[len(results) - 1][3]))
    else:
        for job in todo:
            results.append(_chunk_job(job))
            bar.update(len(job[3]))
    bar.close()
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        raise BadInput(f"{len(errors)} chunk(s) failed; fix the input and rerun (finished chunks are kept):\n"
                       + "\n".join(errors))
    for split in SPLITS:  # Streaming's merge_index logs a warning per call about its temp folder: mute it
        split_url = storage.join(out, split)
        idx_urls = [storage.join(split_url, chunk_name(i), "index.json") for s, i, _ in chunks if s == split]
        with _quiet_logs():
            if storage.is_remote(out):
                with tempfile.TemporaryDirectory() as tmp:
                    merge_index(idx_urls, (tmp, split_url))
            elif idx_urls:
                Path(split_url, "index.json").unlink(missing_ok=True)
                merge_index(idx_urls, split_url)
    storage.upload_file(str(src / "text" / "table.safetensors"), storage.join(out, TEXT_TABLE))
    manifest = {
        "format_version": FORMAT_VERSION,
        "converter_version": CONVERTER_VERSION,
        "signature": plan.signature,
        "source": str(src.resolve()),
        "source_index_sha256": plan.signature["source_index_sha256"],
        "text_table": TEXT_TABLE, "text_table_sha256": plan.signature["text_table_sha256"],
        "text_keys": len(plan.text_keys),
        "geometry": plan.geometry.as_dict(),
        # clip_ids[i] / clip_runs[i] describe the split's sample id i (the shards hold clips in this order)
        "splits": {s: {"clips": len(rows), "runs": sorted({r["run"] for r in rows}),
                       "clip_ids": [r["clip_id"] for r in rows], "clip_runs": [r["run"] for r in rows]}
                   for s, rows in plan.splits.items()},
        "counts": {s: len(rows) for s, rows in plan.splits.items()},
    }
    storage.write_bytes(storage.join(out, MANIFEST), json.dumps(manifest, indent=1).encode())
    secs = time.time() - t0
    done_clips = sum(r["clips"] for r in results)
    src_mb = sum(r["src_bytes"] for r in results) / 1e6
    out_mb = sum(r["out_bytes"] for r in results) / 1e6
    log(f"done in {secs:.1f} s: " + ", ".join(f"{s} {len(r)} clips" for s, r in plan.splits.items())
        + f"; this run converted {done_clips} clips ({src_mb:.1f} MB -> {out_mb:.1f} MB"
        + (f", {done_clips / secs:.1f} clips/s" if secs > 0 else "") + f"); manifest {storage.join(out, MANIFEST)}")
    return manifest


@contextlib.contextmanager
def _quiet_logs():
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def read_manifest(out: str) -> dict[str, Any]:
    """The manifest of a finished conversion, or a clear error when the conversion is missing or incomplete."""
    url = storage.join(out, MANIFEST)
    if not storage.exists(url):
        raise BadInput(f"{out}: no {MANIFEST} — not a finished conversion (run convert_data, or let a "
                       f"killed conversion finish by rerunning it)")
    return json.loads(storage.read_bytes(url))


def main(argv: Iterable[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="convert_data", description=__doc__.split("\n")[0])
    p.add_argument("--src", required=True, help="prepared data root (holds index/, latents/, sem/, meta/, text/, READY)")
    p.add_argument("--out", required=True, help="output: a local folder or s3://bucket/prefix (S3_ENDPOINT_URL honoured)")
    p.add_argument("--workers", type=int, default=1, help="parallel processes (output is identical for any count)")
    p.add_argument("--include-dropped", action="store_true", help="also convert rows with drop=true")
    p.add_argument("--chunk-clips", type=int, default=64, help="clips per chunk, the unit of resumption")
    p.add_argument("--size-limit", type=int, default=1 << 26, help="MDS shard size limit in bytes")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(list(argv) if argv is not None else None)
    if args.workers < 1 or args.chunk_clips < 1:
        p.error("--workers and --chunk-clips must be >= 1")
    try:
        convert(args.src, args.out, workers=args.workers, chunk_clips=args.chunk_clips,
                size_limit=args.size_limit, include_dropped=args.include_dropped, progress=not args.no_progress)
    except BadInput as e:
        print(f"convert_data: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0


if __name__ == "__main__":
    sys.exit(main())
