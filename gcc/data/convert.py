"""Prepared clips -> MDS shards (docs/design.md §4). Entry points: `python -m convert_data` and the `convert_data` script.

How it stays correct when interrupted:
* Clips of each split are cut, in sorted clip_id order, into fixed chunks of `--chunk_clips`. A chunk is the
  unit of work and of resumption; the cut does not depend on `--workers`, so any worker count writes the
  same bytes.
* A chunk is written to a staging folder and becomes visible only complete: locally by an atomic rename, on
  S3 by uploading its `DONE.json` last. A chunk without a matching `DONE.json` is redone from scratch.
  (Streaming's MDSWriter writes `index.json` even when a write fails, so its presence proves nothing.)
* `manifest.json` is written last; without it the output is not a dataset (the loader refuses it).

What it writes over: only an empty folder (or prefix) or its own earlier output, which `OWNER` marks (written
before anything else); never a prepared dataset or another tool's folder. Every file goes through the one writer
(gcc/storage.py), which never writes through a symbolic link inside `--out` (docs/training.md, "Trust and
safety").

The dataset's `name` (`--name`, default `default_name`) is recorded in the manifest; training copies it into every
export's metadata as `data`. It is not part of the conversion's signature (the shards do not depend on it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from gcc import __version__, storage
from gcc.cli import ToolParser, folder_problem, run_tool
from gcc.data.layout import check_splits, clip_files, geometry_of, load_clip, read_index, read_text_table
from gcc.data.shards import COLUMNS, FORMAT_VERSION, MANIFEST, SHARD_HASHES, SPLITS, TEXT_TABLE
from gcc.errors import BadInput
from gcc.geometry import Geometry
from gcc.inputs import parse_json
from gcc.names import UnsafeName, check_component
from gcc.synth.world import is_synthetic
from gcc.vocab import key_to_id
from gcc.workers import pool_worker_init, worker_context

logger = logging.getLogger(__name__)

CONVERTER_VERSION = f"gcc-convert/{__version__}/format{FORMAT_VERSION}"
DONE = "DONE.json"
# the mark of convert_data's output: the only non-empty --out it writes into (`claim_output`)
OWNER = ".gcc-convert.json"
TOOL = "convert_data"


# ---- plan, chunks, output ------------------------------------------------------------------------------
@dataclass
class Plan:
    src: Path
    out: str
    chunk_clips: int
    size_limit: int
    compression: str | None  # None: uncompressed shards
    include_dropped: bool
    geometry: Geometry
    text_keys: list[str]
    signature: dict[str, Any]
    splits: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def chunks(self) -> list[tuple[str, int, list[dict[str, Any]]]]:
        out = []
        for split, rows in self.splits.items():
            for i in range(0, len(rows), self.chunk_clips):
                out.append((split, i // self.chunk_clips, rows[i : i + self.chunk_clips]))
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
    # heavy (streaming ~2 s over torch): keeps --help and argument errors fast
    from gcc.compat.streaming import MDSWriter

    final = storage.join(plan.out, split, chunk_name(idx))
    remote = storage.is_remote(plan.out)
    stage_root = tempfile.mkdtemp(prefix=f".{chunk_name(idx)}.", dir=None if remote else Path(final).parent)
    stage = os.path.join(stage_root, chunk_name(idx))
    ids_of = key_to_id(plan.text_keys)
    nbytes_src = 0
    try:
        with MDSWriter(
            out=stage,
            columns=COLUMNS,
            compression=plan.compression,
            hashes=list(SHARD_HASHES),
            size_limit=plan.size_limit,
            progress_bar=False,
        ) as writer:
            for row in rows:
                sample = load_clip(plan.src, row, plan.geometry, ids_of)
                nbytes_src += sum(p.stat().st_size for p in clip_files(plan.src, row["clip_id"]).values())
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
            if os.path.islink(final):  # rmtree refuses a link, and the rename would land beside its target
                raise storage.LinkRefused(f"{final}: a symbolic link inside {plan.out}; gcc never writes through one")
            shutil.rmtree(final, ignore_errors=True)  # a partial chunk from a killed run
            os.replace(stage, final)
        return {"split": split, "chunk": idx, "clips": len(rows), "src_bytes": nbytes_src, "out_bytes": nbytes_out}
    finally:
        shutil.rmtree(stage_root, ignore_errors=True)


def _chunk_job(args: tuple[Plan, str, int, list[dict[str, Any]]]) -> dict[str, Any]:
    plan, split, idx, rows = args
    try:
        return write_chunk(plan, split, idx, rows)
    except BadInput as e:
        return {"split": split, "chunk": idx, "error": str(e)}


# No shard compression by default: a local dataset is then read where it is, with no per-run copy (the loader
# links the shards into its cache, gcc.data.dataset); zstd makes shards ~23% smaller at full geometry (the sem ids
# are compressed per clip either way) but every run decompresses them into its own cache.
DEFAULT_COMPRESSION: str | None = None
COMPRESSIONS = {"none": None, "zstd": "zstd"}


def make_plan(
    src: Path,
    out: str,
    chunk_clips: int = 64,
    size_limit: int = 1 << 26,
    compression: str | None = DEFAULT_COMPRESSION,
    include_dropped: bool = False,
) -> Plan:
    if not src.is_dir():
        raise BadInput(f"{src}: {'not a folder' if src.exists() else 'no such folder'} (--data: the prepared root)")
    if not (src / "READY").exists():
        raise BadInput(f"{src}: no READY file — the prepared data is incomplete (prep writes READY last)")
    rows = read_index(src)
    check_splits(rows)
    text_keys, text_shape, text_sha = read_text_table(src)
    kept = [r for r in rows if include_dropped or not r["drop"]]
    if not kept:
        raise BadInput(f"{src}/index/clips.jsonl: no clips to convert (all rows have drop=true?)")
    kept.sort(key=lambda r: r["clip_id"])
    geo = geometry_of(src, kept[0]["clip_id"], text_shape)
    signature = {
        "converter_version": CONVERTER_VERSION,
        "source_index_sha256": storage.sha256_file(src / "index" / "clips.jsonl"),
        "text_table_sha256": text_sha,
        "include_dropped": include_dropped,
        "chunk_clips": chunk_clips,
        "size_limit": size_limit,
        "compression": compression,
    }
    plan = Plan(src, str(out), chunk_clips, size_limit, compression, include_dropped, geo, text_keys, signature)
    plan.splits = {s: [r for r in kept if r["split"] == s] for s in SPLITS}
    return plan


NAME_PREFIX, NAME_SUFFIX = "gc25d_", "_mds"


def default_name(src: str | os.PathLike) -> str:
    """The dataset's name when `--name` is not given: `synth` for data gcc-synth made (its root holds the synth
    marker), else the source folder's name without a leading `gc25d_` and a trailing `_mds` (`/data/gc25d_v10` ->
    `v10`)."""
    if is_synthetic(src):
        return "synth"
    folder = Path(src).resolve().name
    return folder.removeprefix(NAME_PREFIX).removesuffix(NAME_SUFFIX) or folder


def dataset_name(src: str | os.PathLike, name: str | None) -> str:
    """`name`, or the default derived from `src`, checked by the one rule for names (gcc/names.py)."""
    try:
        if name is not None:
            return check_component(name, "--name")
        return check_component(default_name(src), f"the name derived from --data {src} (pass --name)")
    except UnsafeName as e:
        raise BadInput(str(e)) from None


def _is_empty(out: str) -> bool:
    if storage.is_remote(out):
        return not storage.list_prefix(out)
    return not os.path.lexists(out) or (os.path.isdir(out) and not os.path.islink(out) and not os.listdir(out))


def claim_output(out: str) -> bool:
    """Whether `out` is convert_data's to write (True: it holds `OWNER`, or a manifest an earlier convert_data wrote
    before that mark existed; False: empty, the mark is still to write); anything else is refused (BadInput): a
    prepared dataset, another tool's folder, a file. Reads only."""
    if _is_empty(out):
        return False
    if not storage.is_remote(out) and (os.path.islink(out) or not os.path.isdir(out)):
        raise BadInput(f"--out {out}: not a folder")
    mark = storage.join(out, OWNER)
    if storage.exists(mark):
        doc = parse_json(storage.read_bytes(mark), mark, "convert_data's mark")
        if isinstance(doc, dict) and doc.get("tool") == TOOL:
            return True
        raise BadInput(f"{mark}: not the mark convert_data writes (expected an object with tool={TOOL!r})")
    old = _existing_manifest(out)
    if old is not None and str(old.get("converter_version", "")).startswith("gcc-convert/"):
        return True
    raise BadInput(
        f"--out {out}: not empty and not convert_data's output (no {OWNER}); it could be a prepared dataset or "
        f"another tool's folder, which convert_data never writes over: convert into a new or empty folder"
    )


def _existing_manifest(out: str) -> dict[str, Any] | None:
    url = storage.join(out, MANIFEST)
    if not storage.exists(url):
        return None
    try:
        old = json.loads(storage.read_bytes(url))
    except ValueError as e:  # not UTF-8, not JSON
        old = e
    if not isinstance(old, dict):
        raise BadInput(f"{url}: not a manifest that convert_data wrote ({old}); choose another --out or delete it")
    return old


def _check_finished_output(out: str, manifest: dict[str, Any]) -> None:
    """A finished local output is only "nothing to do" when its text table is still the one converted: a regular
    file (never a link to somewhere else) with the manifest's sha256."""
    if storage.is_remote(out):
        return
    table = Path(out, TEXT_TABLE)
    if table.is_symlink() or not table.is_file():
        raise BadInput(
            f"{table}: {'a symbolic link' if table.is_symlink() else 'missing or not a file'}, not the text table "
            f"convert_data wrote; remove {out} and convert again"
        )
    if storage.sha256_file(table) != manifest.get("text_table_sha256"):
        raise BadInput(
            f"{table}: not the text table this conversion wrote (sha256 differs); remove {out} and convert again"
        )


def convert(
    src: str | Path,
    out: str,
    workers: int = 1,
    chunk_clips: int = 64,
    size_limit: int = 1 << 26,
    compression: str | None = DEFAULT_COMPRESSION,
    include_dropped: bool = False,
    progress: bool = True,
    name: str | None = None,
) -> dict[str, Any]:
    """Convert (or finish converting) `src` into `out` as the dataset `name` (None: `default_name(src)`); returns
    the manifest. Raises BadInput."""
    # heavy (streaming ~2 s): keeps --help and argument errors fast
    from gcc.compat.streaming import merge_index

    t0 = time.time()
    src = Path(src)
    plan = make_plan(src, out, chunk_clips, size_limit, compression, include_dropped)
    name = dataset_name(src, name)
    owned = claim_output(out)
    old = _existing_manifest(out)
    if old is not None:
        return _finished_manifest(out, old, plan, name)
    _prepare_output(out, owned)
    chunks = plan.chunks()
    todo = [(plan, s, i, rows) for s, i, rows in chunks if not chunk_is_done(plan, s, i, rows)]
    n_clips = sum(len(r) for _, _, r in chunks)
    logger.info(
        f"converting {src} -> {out}: {n_clips} clips in {len(chunks)} chunks "
        f"({len(chunks) - len(todo)} already done), {workers} worker(s)"
    )
    results = _run_chunks(todo, workers, progress)
    _merge_indexes(out, chunks, merge_index)
    storage.upload_file(str(src / "text" / "table.safetensors"), storage.join(out, TEXT_TABLE), root=_root(out))
    manifest = _manifest(src, plan, name)
    storage.write_bytes(storage.join(out, MANIFEST), json.dumps(manifest, indent=1).encode(), root=_root(out))
    _log_done(out, plan, results, t0)
    return manifest


def _finished_manifest(out: str, old: dict[str, Any], plan: Plan, name: str) -> dict[str, Any]:
    """`out` already holds a manifest: it is returned when it is this conversion's (nothing to do); a different
    conversion or name is refused (BadInput)."""
    if old.get("signature") == plan.signature:
        if "name" not in old:  # a manifest of an earlier convert_data: kept as it is (its runs may use it)
            logger.info(
                f"{out}: already converted from this source ({MANIFEST} matches, written by an earlier "
                f"convert_data without a name: exports record the folder's name); nothing to do"
            )
            return old
        if old["name"] != name:
            raise BadInput(
                f"{out}: already converted from this source as {str(old['name'])[:80]!r}, not "
                f"{name!r}; the name is fixed once written (runs on it depend on the manifest): "
                f"pass --name {str(old['name'])[:80]}, or convert into another --out"
            )
        _check_finished_output(out, old)
        logger.info(f"{out}: already converted from this source ({MANIFEST} matches); nothing to do")
        return old
    diff = sorted(
        k
        for k in set(old.get("signature", {})) | set(plan.signature)
        if old.get("signature", {}).get(k) != plan.signature.get(k)
    )
    raise BadInput(
        f"{out}: holds a finished conversion of different input or settings (differs in: "
        f"{', '.join(diff)}); choose another --out or delete it"
    )


def _prepare_output(out: str, owned: bool) -> None:
    """Marks `out` as convert_data's (when not yet) and, locally, makes the split folders and clears staging
    left by a killed run."""
    if not owned:  # before anything else: what follows is convert_data's to redo
        storage.write_bytes(storage.join(out, OWNER), _mark(), root=_root(out))
    if not storage.is_remote(out):
        for split in SPLITS:
            os.close(storage.open_folder(out, split))  # a link or a file in the way is refused
            for stale in Path(out, split).glob(".chunk_*"):  # staging left by a killed run
                shutil.rmtree(stale, ignore_errors=True)


def _run_chunks(
    todo: list[tuple[Plan, str, int, list[dict[str, Any]]]], workers: int, progress: bool
) -> list[dict[str, Any]]:
    """Converts the chunks still to do (in a process pool when `workers` > 1) with a progress bar; returns their
    results in `todo`'s order. Raises BadInput when any chunk failed."""
    results, errors = [], []
    bar = tqdm(total=sum(len(t[3]) for t in todo), unit="clip", disable=not progress, file=sys.stderr)
    if workers > 1 and len(todo) > 1:
        # forkserver, not fork: tqdm's monitor thread and boto3's threads live in this process (gcc/workers.py)
        with ProcessPoolExecutor(
            max_workers=workers,
            mp_context=worker_context(),
            initializer=pool_worker_init,
            initargs=(os.getpid(), dict(os.environ)),
        ) as pool:
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
        raise BadInput(
            f"{len(errors)} chunk(s) failed; fix the input and rerun (finished chunks are kept):\n" + "\n".join(errors)
        )
    return results


def _merge_indexes(out: str, chunks: list[tuple[str, int, list[dict[str, Any]]]], merge_index) -> None:
    """Each split's `index.json` from its chunks' indexes (Streaming's `merge_index`, passed in: imported late)."""
    for split in SPLITS:  # Streaming's merge_index logs a warning per call about its temp folder: mute it
        split_url = storage.join(out, split)
        idx_urls = [storage.join(split_url, chunk_name(i), "index.json") for s, i, _ in chunks if s == split]
        with _quiet_logs(), tempfile.TemporaryDirectory() as tmp:
            if storage.is_remote(out):
                merge_index(idx_urls, (tmp, split_url))
            elif idx_urls:  # merged beside, then through the writer (Streaming's own would follow a link)
                merge_index(idx_urls, tmp)
                storage.atomic_copy(Path(tmp, "index.json"), Path(split_url, "index.json"), root=out)


def _manifest(src: Path, plan: Plan, name: str) -> dict[str, Any]:
    """The manifest of the finished conversion."""
    return {
        "name": name,
        "format_version": FORMAT_VERSION,
        "converter_version": CONVERTER_VERSION,
        "signature": plan.signature,
        "source": str(src.resolve()),
        # data gcc-synth made: the samples logged during training decode it with the synthetic world's decoder
        "synthetic": is_synthetic(src),
        "source_index_sha256": plan.signature["source_index_sha256"],
        "text_table": TEXT_TABLE,
        "text_table_sha256": plan.signature["text_table_sha256"],
        "text_keys": len(plan.text_keys),
        "geometry": plan.geometry.as_dict(),
        # clip_ids[i] / clip_runs[i] describe the split's sample id i (the shards hold clips in this order)
        "splits": {
            s: {
                "clips": len(rows),
                "runs": sorted({r["run"] for r in rows}),
                "clip_ids": [r["clip_id"] for r in rows],
                "clip_runs": [r["run"] for r in rows],
            }
            for s, rows in plan.splits.items()
        },
        "counts": {s: len(rows) for s, rows in plan.splits.items()},
    }


def _log_done(out: str, plan: Plan, results: list[dict[str, Any]], t0: float) -> None:
    """The closing summary (time, sizes, rate) and a warning per empty split."""
    secs = time.time() - t0
    done_clips = sum(r["clips"] for r in results)
    src_mb = sum(r["src_bytes"] for r in results) / 1e6
    out_mb = sum(r["out_bytes"] for r in results) / 1e6
    logger.info(
        f"done in {secs:.1f} s: "
        + ", ".join(f"{s} {len(r)} clips" for s, r in plan.splits.items())
        + f"; this run converted {done_clips} clips ({src_mb:.1f} MB -> {out_mb:.1f} MB"
        + (f", {done_clips / secs:.1f} clips/s" if secs > 0 else "")
        + f"); manifest {storage.join(out, MANIFEST)}"
    )
    for split, rows in plan.splits.items():
        if not rows:
            logger.warning(
                f"warning: the {split} split is empty (no kept clip of {plan.src}/index/clips.jsonl has "
                f"split {split!r}): {EMPTY_SPLIT[split]}"
            )


# what an empty split means for a run on the conversion (the trainer's check: gcc/training/run_start.py check_data)
EMPTY_SPLIT = {
    "train": "a run refuses this data (nothing to train on)",
    "val": "a run with validation on refuses this data; eval_interval: 0 turns validation off",
}


def _root(out: str) -> str | None:
    """The output root the local writer checks for links (None for S3)."""
    return None if storage.is_remote(out) else out


def _mark() -> bytes:
    return (json.dumps({"tool": TOOL, "converter_version": CONVERTER_VERSION}) + "\n").encode()


@contextlib.contextmanager
def _quiet_logs():
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def build_parser() -> argparse.ArgumentParser:
    p = ToolParser(
        "convert_data",
        "Prepared clips -> MDS shards (Streaming's format, which the trainer reads). Interrupted, it resumes: a rerun\n"
        "with the same --out redoes only the chunks of --chunk_clips clips that are not complete.",
        renamed={"--src": "--data"},
    )
    p.add_argument(
        "--data", required=True, help="prepared data root (holds index/, latents/, sem/, meta/, text/, READY)"
    )
    p.add_argument(
        "--out",
        required=True,
        help="output: a local folder or s3://bucket/prefix (S3_ENDPOINT_URL honoured), new or empty or an earlier "
        "convert_data output (never a prepared dataset or another tool's folder)",
    )
    p.add_argument(
        "--name",
        default=None,
        help="the dataset's name, recorded in manifest.json and in every export's metadata (`data`); "
        "default: synth for gcc-synth data, else the --data folder's name without a leading gc25d_ "
        "and a trailing _mds (/data/gc25d_v10 -> v10)",
    )
    p.add_argument("--workers", type=int, default=1, help="parallel processes (output is identical for any count)")
    p.add_argument("--include_dropped", action="store_true", help="also convert rows with drop=true")
    p.add_argument("--chunk_clips", type=int, default=64, help="clips per chunk, the unit of resumption")
    p.add_argument("--size_limit", type=int, default=1 << 26, help="MDS shard size limit in bytes")
    p.add_argument(
        "--compression",
        choices=sorted(COMPRESSIONS),
        default="none",
        help="shard compression: none (a local dataset is read in place by every run) or zstd "
        "(~23%% smaller; each run decompresses the shards into its own cache)",
    )
    p.add_argument("--no_progress", action="store_true", help="no progress bar")
    return p


def check_args(args: argparse.Namespace) -> None:
    """The flags' values and the output location, before anything is read or written (BadInput naming the flag)."""
    if args.workers < 1 or args.chunk_clips < 1:
        raise BadInput(f"--workers and --chunk_clips must be >= 1, got {args.workers} and {args.chunk_clips}")
    if not 0 < args.size_limit < 1 << 32:  # Streaming's MDSWriter stores sample offsets as uint32
        raise BadInput(f"--size_limit must be in [1, 2**32) bytes, got {args.size_limit}")
    if problem := storage.userinfo_problem(args.data):  # --out: bucket_problem and folder_problem ask it too
        raise BadInput(f"--data {args.data}: {problem}")
    if storage.is_remote(args.out):
        problem = storage.bucket_problem(args.out)
        if problem:
            raise BadInput(f"--out {args.out}: {problem}")
        return
    problem = folder_problem(args.out)
    if problem:
        raise BadInput(f"--out {args.out}: {problem}")
    if Path(args.out).resolve() == Path(args.data).resolve():
        raise BadInput(f"--out {args.out} is --data: the shards need a folder of their own")


def main(argv: Iterable[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(list(argv) if argv is not None else None)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)

    def body() -> int:
        check_args(args)
        convert(
            args.data,
            args.out,
            workers=args.workers,
            chunk_clips=args.chunk_clips,
            size_limit=args.size_limit,
            compression=COMPRESSIONS[args.compression],
            include_dropped=args.include_dropped,
            progress=not args.no_progress,
            name=args.name,
        )
        return 0

    return run_tool(p.prog, body)


if __name__ == "__main__":
    sys.exit(main())
