"""Where the clips come from: the prepared layout or a local conversion (shards), the clip selection, and the
ground-truth frames. Both sources return clips as `gcc.data.shards.ClipRecord`; a clip's split comes from the
source's index rows (`rows_for`)."""

from __future__ import annotations

import io
import logging
import os
import shutil
import tarfile
import tempfile
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from gcc.data.layout import geometry_of, load_clip, read_index, read_text_table
from gcc.data.shards import (
    TEXT_TABLE,
    ClipRecord,
    SplitFormat,
    check_index,
    read_manifest,
)
from gcc.data.text_table import TextTable
from gcc.errors import BadInput
from gcc.inputs import inflate_shard, open_regular, read_bytes, read_shard_file, read_text
from gcc.names import check_component, inside
from gcc.storage import atomic_write
from gcc.tools.sample.errors import SampleError

logger = logging.getLogger(__name__)


class PreparedSource:
    """The prepared layout (docs/design.md §4): index/clips.jsonl + per-clip latents/sem/meta + text/table, read and
    validated by `gcc.data.layout`."""

    kind = "prepared"

    def __init__(self, root: Path):
        self.root = root
        try:
            self.rows = {r["clip_id"]: r for r in read_index(root)}
            _, self.text_shape, _ = read_text_table(root)
        except BadInput as e:
            raise SampleError(str(e)) from None
        try:
            self.table = TextTable(root / "text" / "table.safetensors", self.text_shape)
        except BadInput as e:
            raise SampleError(str(e)) from None
        self.default_raw = root / "raw"
        self.prepared_root = root

    def load(self, clip_id: str) -> ClipRecord:
        try:
            geo = geometry_of(self.root, clip_id, self.text_shape)
            sample = load_clip(self.root, self.rows[clip_id], geo, self.table.ids)
        except BadInput as e:
            raise SampleError(str(e)) from None
        return ClipRecord.from_sample(sample)

    def rows_for(self, clip_ids: Sequence[str] | None = None) -> dict[str, dict]:
        return self.rows


class ShardSource:
    """A local conversion (manifest.json + one MDS dataset per split), read with Streaming's LocalDataset.

    Only the splits that hold the wanted clips are opened (the manifest lists each split's clip ids). A split's
    index is checked first (`gcc.data.shards.check_index`: the converter's columns, so nothing pickled is ever
    decoded, and its shard names), and its shards are copied, or decompressed, into a temporary folder removed
    with this object; every sample is checked against the manifest (`SplitFormat`) as it is decoded.
    Object-store shards are not read: an offline eval of a few clips runs on the prepared root or a local copy.
    """

    kind = "shards"

    def __init__(self, root: Path):
        try:
            self.manifest = read_manifest(str(root))
        except BadInput as e:
            raise SampleError(str(e)) from None
        self.root = root
        try:
            self.table = TextTable(root / TEXT_TABLE, tuple(self.manifest["geometry"]["text"]))
        except BadInput as e:
            raise SampleError(str(e)) from None
        src = self.manifest.get("source")
        self.default_raw = Path(src) / "raw" if isinstance(src, str) and src else None
        self.prepared_root = Path(src) if isinstance(src, str) and src else None  # the converted root (may be gone)
        self.split_ids = {s: set(v["clip_ids"]) for s, v in self.manifest["splits"].items()}
        self._tmp = tempfile.mkdtemp(prefix="gcc_sample_shards_")
        weakref.finalize(self, shutil.rmtree, self._tmp, True)
        self._ds: dict[str, Any] = {}  # split -> its streaming LocalDataset
        self._pos: dict[str, tuple[str, int]] = {}  # clip id -> (split, sample index)
        self._rows: dict[str, dict] = {}
        self._fmt: dict[str, SplitFormat] = {}

    def _open(self, split: str) -> None:
        # heavy (streaming, ~2 s over torch): only for a shard source; keeps gcc-sample --help fast
        from streaming import LocalDataset

        if split in self._ds:
            return
        src, local = self.root / split, Path(self._tmp, split)
        try:
            index_bytes = read_bytes(src / "index.json", "json")
            index = check_index(index_bytes, self.manifest, split, str(src / "index.json"))
            for sh in index["shards"]:
                # each file read at the size the checked index declares, a compressed one inflated no further
                # than its declared raw size (gcc.data.shards: the loader's rule)
                raw_info, zip_info = sh["raw_data"], sh["zip_data"]
                raw = inside(local, raw_info["basename"], "shard")
                raw.parent.mkdir(parents=True, exist_ok=True)
                if sh["compression"]:
                    where = str(src / zip_info["basename"])
                    blob = read_shard_file(inside(src, zip_info["basename"], "shard"), zip_info["bytes"], where)
                    raw.write_bytes(inflate_shard(blob, sh["compression"], raw_info["bytes"], where))
                else:
                    where = str(src / raw_info["basename"])
                    path = inside(src, raw_info["basename"], "shard")
                    raw.write_bytes(read_shard_file(path, raw_info["bytes"], where))
            atomic_write(local / "index.json", index_bytes)  # the checked bytes, not the file read again
            ds = self._ds[split] = LocalDataset(local=str(local))
            self._fmt[split] = SplitFormat.of(self.manifest, split)
            for i in range(len(ds)):
                rec = self._decode(split, i)
                self._rows[rec.clip_id] = {
                    "clip_id": rec.clip_id,
                    "run": rec.run,
                    "subset": rec.subset,
                    "scene": rec.scene,
                    "split": split,
                    "drop": rec.drop,
                }
                self._pos[rec.clip_id] = (split, i)
        except SampleError:
            raise
        except (OSError, ValueError, BadInput) as e:  # DamagedData and UnsafeName included
            raise SampleError(str(e)) from None

    def _decode(self, split: str, i: int) -> ClipRecord:
        where = f"{self.root / split} sample {i}"
        try:
            rec = self._fmt[split].decode(self._ds[split][i], i, where)
            for field in ("run", "subset", "scene"):  # they name the ground-truth tar (read_gt)
                check_component(getattr(rec, field), f"{where}: {field}")
        except SampleError:
            raise
        except Exception as e:  # a damaged shard: Streaming's decoders raise anything
            raise SampleError(
                f"{where}: cannot be decoded ({type(e).__name__}: {e}); the shard is damaged or "
                f"not convert_data's — reconvert it"
            ) from None
        return rec

    def rows_for(self, clip_ids: Sequence[str] | None = None) -> dict[str, dict]:
        """Index rows of the splits holding `clip_ids` (None: the val split)."""
        splits = (
            [s for s, ids in self.split_ids.items() if ids & set(clip_ids)]
            if clip_ids is not None
            else [s for s in self.split_ids if s == "val"]
        )
        for s in splits:
            self._open(s)
        return self._rows

    def load(self, clip_id: str) -> ClipRecord:
        return self._decode(*self._pos[clip_id])


def open_source(data_root: str | os.PathLike):
    if str(data_root).startswith("s3://"):
        raise SampleError(
            f"--data {data_root}: object-store shards are not read by gcc.tools.sample; use the "
            f"prepared root or a local copy of the shards"
        )
    root = Path(data_root)
    if (root / "manifest.json").exists():  # whatever it is: read_manifest says what is wrong with it
        return ShardSource(root)
    if (root / "index" / "clips.jsonl").is_file():
        return PreparedSource(root)
    raise SampleError(
        f"--data {root}: neither a prepared root (index/clips.jsonl) nor a converted shards folder (manifest.json)"
    )


CLIP_IDS_FILE_MAX = 16 << 20


def parse_clip_ids(spec: str) -> list[str]:
    """'a,b' or '@file' (one id per line or comma-separated; blank lines and '#' comments ignored)."""
    if spec.startswith("@"):
        path = Path(spec[1:])
        try:
            text = read_text(path, "text", CLIP_IDS_FILE_MAX)
        except BadInput as e:
            raise SampleError(f"--clip_ids {spec}: {e}; expected a list of clip ids") from None
        text = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
        items = [s for line in text.splitlines() for s in line.split(",")]
    else:
        items = spec.split(",")
    ids = list(dict.fromkeys(s.strip() for s in items if s.strip()))
    if not ids:
        raise SampleError(f"--clip_ids {spec!r}: no clip ids")
    return ids


def select_clips(rows: dict[str, dict], clip_ids: Sequence[str] | None = None, val_n: int | None = None) -> list[str]:
    """Explicit ids (any split; every one must exist) or `val_n` val clips with drop=false, round-robin over runs
    (runs sorted by name, clips sorted within a run: the first clip of every run, then the second, ...)."""
    if clip_ids is not None:
        missing = [c for c in clip_ids if c not in rows]
        if missing:
            raise SampleError(f"clip id(s) not in the data: {', '.join(missing)}")
        return list(clip_ids)
    if val_n is None or val_n < 1:
        raise SampleError("give --clip_ids or --n N (N >= 1)")
    from gcc.data.dataset import round_robin_by_run  # heavy (streaming, ~2 s): keeps gcc-sample --help fast

    val = [(rows[c]["run"], c) for c in sorted(rows) if rows[c]["split"] == "val" and not rows[c]["drop"]]
    if not val:
        raise SampleError("no val clips with drop=false in the data")
    out = round_robin_by_run(val, val_n)
    if len(out) < val_n:
        logger.warning("gcc.tools.sample: only %d val clips available (asked for %d)", len(out), val_n)
    return out


# the largest JPEG of one ground-truth frame read from a tar (a 4K frame is a few MB)
GT_FRAME_MAX = 64 << 20


def read_gt(raw_root: Path, clip: ClipRecord, num_frames: int) -> np.ndarray:
    """Ground truth RGB uint8 [F, src_h, src_w, 3] from `<raw>/<subset>/<scene>/<run>.tar` members
    `<clip_id>/<f:03d>.jpg`. The tar is a regular file read as a plain tar (`gcc.inputs`), each member at most
    GT_FRAME_MAX bytes and each image the clip's meta src_hw, checked before it is decoded."""
    path = raw_root / clip.subset / clip.scene / f"{clip.run}.tar"
    if not path.exists():
        raise SampleError(f"clip {clip.clip_id}: ground-truth tar {path} not found (--raw_root)")
    src_h, src_w = clip.meta()["src_hw"]
    frames = []
    try:
        with open_regular(path, "tar", cap=1 << 62) as (fd, _), os.fdopen(os.dup(fd), "rb") as f:
            with tarfile.open(fileobj=f, mode="r:") as tf:
                for i in range(num_frames):
                    name = f"{clip.clip_id}/{i:03d}.jpg"
                    try:
                        member = tf.getmember(name)
                    except KeyError:
                        raise SampleError(f"clip {clip.clip_id}: {path} has no member {name}") from None
                    if not member.isfile() or member.size > GT_FRAME_MAX:
                        raise SampleError(
                            f"clip {clip.clip_id}: {path}: member {name} is not a JPEG file of at most "
                            f"{GT_FRAME_MAX >> 20} MB"
                        )
                    fh = tf.extractfile(member)
                    assert fh is not None  # a regular file (checked above)
                    with Image.open(io.BytesIO(fh.read())) as im:
                        if im.size != (src_w, src_h):  # read from the header: nothing decoded yet
                            raise SampleError(
                                f"clip {clip.clip_id}: {path}: member {name} is {im.size[0]}x{im.size[1]}, the "
                                f"clip's meta says src_hw {src_w}x{src_h}"
                            )
                        frames.append(np.asarray(im.convert("RGB")))
    except BadInput as e:
        raise SampleError(f"clip {clip.clip_id}: ground-truth tar: {e}") from None
    except (tarfile.TarError, OSError) as e:  # PIL's UnidentifiedImageError is an OSError
        raise SampleError(f"clip {clip.clip_id}: {path}: not a tar of JPEG frames ({e})") from None
    return np.stack(frames)


def resample_rgb(frames: np.ndarray, dst_hw: Sequence[int]) -> np.ndarray:
    """uint8 [F, h, w, 3] at src -> dst_hw: bilinear, pixel centres to pixel centres (docs/design.md §3), antialiased
    when shrinking."""
    H, W = (int(v) for v in dst_hw)
    if frames.shape[1:3] == (H, W):
        return frames
    x = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).float()
    y = torch.nn.functional.interpolate(x, size=(H, W), mode="bilinear", align_corners=False, antialias=True)
    return y.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()
