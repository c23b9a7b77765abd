"""Coverage statistics of the world-anchored UNKNOWN mask, `frame0` vs `cap` side by side (docs/design.md §6; the legacy
doc's "open issues" table), so the calibration can be decided with numbers.

    python -m gcc.tools.maskstats --data DIR --split train --n 100 [--seed 0] [--max_frame_coverage 0.4]
                            [--out out.json] [--preview out.png]

DIR is a finished conversion (manifest.json; local folder or s3://). The first n clips of the split (sample ids
0..n-1 in the stored order) are read with the loader's machinery (`GcStreamingDataset`, `ClipRecord`). The
mask is FORCED ON: every clip is masked with the mask parameters of its own draw
``draw_sample(seed, epoch=0, sample_id, p_text=0, p_cond=0, p_mask=1)`` — the (θ, q) that the loader draws for
that sample in epoch 0 whenever its mask applies — once with each calibration. Clips without a finite
ground_z get no mask in either calibration; they are counted and left out of the table.

Per clip and calibration ("static" = raw value ≤ 6 before masking; a frame's static fraction is its masked
static pixels over its static pixels, frames without static pixels are skipped):
  frame0_static     frame-0 static fraction masked
  clip_pixels       whole-clip pixel fraction (masked pixels / F·H·W = the loader's `dropped.mask`)
  last_static       last-frame static fraction masked
  frames_over_90    share of frames with > 90 % of their static pixels masked
  frames_under_1    share of frames with < 1 % of their static pixels masked (mask slid off screen)
  frame_max_ground  max over frames of the masked fraction of the static pixels whose 4×4 cell has a ground
                    point (sky rays are masked on top of the cap); `cap` bounds it by n_planes × cap
Aggregated over clips: mean, median, p90 (numpy's linear-interpolation percentile) and max.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import shutil
import sys
import tempfile
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from gcc.cli import ToolParser, file_problem, run_tool
from gcc.data.mask import CELL, apply_unknown_mask, cell_pixels, mask_ground_z
from gcc.data.sample_rng import draw_sample
from gcc.errors import BadInput
from gcc.geometry import Cameras, ground_points
from gcc.storage import atomic_path, atomic_write, bucket_problem, is_remote
from gcc.vocab import STATIC_MAX, colorize

logger = logging.getLogger(__name__)

MEASURES = {
    "frame0_static": "frame-0 static fraction masked",
    "clip_pixels": "whole-clip pixel fraction",
    "last_static": "last-frame static fraction",
    "frames_over_90": "share of frames > 90 % masked (static)",
    "frames_under_1": "share of frames < 1 % masked (static)",
    "frame_max_ground": "max per-frame fraction of static ground pixels",
}
STATS = ("mean", "median", "p90", "max")
CALIBRATIONS = ("frame0", "cap")
FORCED_NOTE = (
    "mask forced on: every clip uses its own draw_sample(seed, epoch 0, sample id) mask parameters "
    "(p_text=p_cond=0, p_mask=1)"
)

# contact sheet layout (pixels)
PREVIEW_FRAMES, PREVIEW_CLIPS = 6, 8
LABEL_W, HEADER_H, GAP = 150, 16, 2
CELL_TARGET_W = 192


# ---- per-clip measurement --------------------------------------------------------------------------------
def forced_mask_params(seed: int, sample_id: int):
    return draw_sample(seed, 0, sample_id, 0.0, 0.0, 1.0).mask


def ground_cells(cameras, ground_z: Sequence[float] | np.ndarray, hw: tuple[int, int]) -> np.ndarray | None:
    """bool [F, H/4, W/4]: the cell's ray meets the mask's ground plane (None: no finite ground_z)."""
    gz = mask_ground_z(ground_z)
    if gz is None:
        return None
    xy = ground_points(cameras, cell_pixels(hw), gz)
    return ~np.isnan(xy[..., 0]).reshape(len(cameras), hw[0] // CELL, hw[1] // CELL)


def clip_measures(raw: np.ndarray, masked: np.ndarray, frac: float, ground: np.ndarray) -> dict[str, float]:
    """The per-clip measures (see the module docstring) from the raw ids, the masked ids, the fraction the mask
    reported and the ground cells [F, H/4, W/4]."""
    static = raw <= STATIC_MAX
    changed = masked != raw
    n_static = static.sum(axis=(1, 2))
    n_masked = changed.sum(axis=(1, 2))
    with np.errstate(invalid="ignore", divide="ignore"):
        per_frame = np.where(n_static > 0, n_masked / np.maximum(n_static, 1), np.nan)
    g = np.repeat(np.repeat(ground, CELL, axis=1), CELL, axis=2)
    ng_static = (static & g).sum(axis=(1, 2))
    ng_masked = (changed & g).sum(axis=(1, 2))
    valid = per_frame[~np.isnan(per_frame)]
    gfrac = ng_masked[ng_static > 0] / ng_static[ng_static > 0]
    return {
        "frame0_static": float(per_frame[0]),
        "clip_pixels": float(frac),
        "last_static": float(per_frame[-1]),
        "frames_over_90": float(np.mean(valid > 0.9)) if valid.size else math.nan,
        "frames_under_1": float(np.mean(valid < 0.01)) if valid.size else math.nan,
        "frame_max_ground": float(gfrac.max()) if gfrac.size else math.nan,
    }


def aggregate(values: Sequence[float]) -> dict[str, float | None]:
    v = np.asarray([x for x in values if not math.isnan(x)], dtype=np.float64)
    if v.size == 0:
        return {s: None for s in STATS}
    return {
        "mean": float(v.mean()),
        "median": float(np.median(v)),
        "p90": float(np.percentile(v, 90)),
        "max": float(v.max()),
    }


# ---- reading ---------------------------------------------------------------------------------------------
class _Reader:
    """The first clips of a split through the loader's dataset (shuffle off: sample id i = the i-th stored
    clip). Its private cache folder is removed on close, or once the reader is gone (one whose data failed to open
    included), as gcc-sample's shard source does."""

    def __init__(self, data: str, split: str, seed: int):
        # heavy (streaming, torch ~3.5 s): keeps --help and argument errors fast
        from gcc.data.config import DataConfig
        from gcc.data.dataset import GcStreamingDataset

        self._tmp = tempfile.mkdtemp(prefix="gcc_maskstats_")
        self._remove = weakref.finalize(self, shutil.rmtree, self._tmp, True)
        self.ds = GcStreamingDataset(
            DataConfig(data).without_dropouts(),
            split,
            Path(self._tmp) / "cache",
            batch_size=1,
            seed=seed,
            shuffle=False,
        )

    def __len__(self) -> int:
        return len(self.ds)

    def record(self, i: int):
        return self.ds.record(i)

    def close(self):
        self._remove()


def measure(
    data: str,
    split: str = "train",
    n: int = 100,
    seed: int = 0,
    max_frame_coverage: float = 0.4,
    preview: str | Path | None = None,
) -> dict[str, Any]:
    """The coverage table (as written by --out); optionally also the PNG contact sheet."""
    reader = _Reader(data, split, seed)
    try:
        n = min(int(n), len(reader))
        per_clip: list[dict[str, Any]] = []
        sheet_rows: list[tuple[str, Any, dict[str, np.ndarray]]] = []  # (clip id, mask params, out per calibration)
        for i in range(n):
            rec = reader.record(i)
            meta = rec.meta()
            cams = Cameras.from_meta(meta)
            gz = np.asarray(meta["ground_z"], dtype=np.float64)
            params = forced_mask_params(seed, i)
            raw = rec.sem_ids()
            ground = ground_cells(cams, gz, raw.shape[1:])
            row: dict[str, Any] = {
                "sample_id": i,
                "clip_id": rec.clip_id,
                "thetas": list(params.thetas),
                "qs": list(params.qs),
                "n_planes": params.n_planes,
                "ground": ground is not None,
            }
            outs = {}
            for cal in CALIBRATIONS:
                out, frac = apply_unknown_mask(raw, cams, gz, params, cal, max_frame_coverage)
                outs[cal] = out
                if ground is not None:
                    row[cal] = clip_measures(raw, out, frac, ground)
            per_clip.append(row)
            if preview is not None and ground is not None and len(sheet_rows) < PREVIEW_CLIPS:
                sheet_rows.append((rec.clip_id, params, outs))
            logger.debug(f"[maskstats] {i + 1}/{n} {rec.clip_id}")
    finally:
        reader.close()
    measured = [r for r in per_clip if r["ground"]]
    table = {cal: {m: aggregate([r[cal][m] for r in measured]) for m in MEASURES} for cal in CALIBRATIONS}
    result = {
        "data": str(data),
        "split": split,
        "seed": int(seed),
        "epoch": 0,
        "mask_forced": True,
        "note": FORCED_NOTE,
        "max_frame_coverage": float(max_frame_coverage),
        "clips": n,
        "clips_without_ground": n - len(measured),
        "clips_measured": len(measured),
        "two_plane_clips": sum(r["n_planes"] == 2 for r in measured),
        "measures": MEASURES,
        "stats": list(STATS),
        "table": table,
        "per_clip": per_clip,
    }
    if preview is not None:
        write_preview(preview, sheet_rows)
    return result


# ---- output ----------------------------------------------------------------------------------------------
def format_table(res: dict[str, Any]) -> str:
    def cell(v):
        return "   -  " if v is None else f"{v:6.3f}"

    head = ["mean", "median", "p90", "max"]
    w = max(len(d) for d in MEASURES.values()) + 2
    lines = [
        f"UNKNOWN mask coverage: {res['data']} split={res['split']}, first {res['clips']} clips, seed {res['seed']}",
        f"{res['note']}",
        f"{res['clips_measured']} clips measured ({res['two_plane_clips']} with 2 planes), "
        f"{res['clips_without_ground']} without a finite ground_z (no mask, left out); "
        f"cap: max_frame_coverage {res['max_frame_coverage']}",
        "",
        " " * w + "| " + "frame0".center(4 * 7 - 1) + " | " + f"cap {res['max_frame_coverage']}".center(4 * 7 - 1),
        "measure".ljust(w) + "| " + " ".join(h.rjust(6) for h in head) + " | " + " ".join(h.rjust(6) for h in head),
        "-" * (w + 2 + 2 * (4 * 7) + 2),
    ]
    for m, desc in MEASURES.items():
        a = res["table"]["frame0"][m]
        b = res["table"]["cap"][m]
        lines.append(
            desc.ljust(w) + "| " + " ".join(cell(a[s]) for s in STATS) + " | " + " ".join(cell(b[s]) for s in STATS)
        )
    return "\n".join(lines)


def preview_frames(n_frames: int) -> list[int]:
    return sorted({int(round(x)) for x in np.linspace(0, n_frames - 1, min(PREVIEW_FRAMES, n_frames))})


def cell_scale(w: int) -> tuple[int, int]:
    """(upsample factor, subsample stride) that brings a frame of width w near CELL_TARGET_W."""
    if w >= CELL_TARGET_W:
        return 1, max(1, round(w / CELL_TARGET_W))
    return max(1, round(CELL_TARGET_W / w)), 1


def preview_size(n_clips: int, n_frames: int, hw: tuple[int, int]) -> tuple[int, int]:
    """(width, height) of the contact sheet for n_clips clips (two rows each: frame0, cap)."""
    up, stride = cell_scale(hw[1])
    ch, cw = -(-hw[0] // stride) * up, -(-hw[1] // stride) * up
    cols = len(preview_frames(n_frames))
    return LABEL_W + cols * (cw + GAP), HEADER_H + 2 * n_clips * (ch + GAP)


def write_preview(path: str | Path, rows) -> tuple[int, int]:
    """PNG contact sheet: frames across, per clip two rows (frame0 then cap), palette colours, 255 hatched."""
    if not rows:
        img = Image.new("RGB", (LABEL_W, HEADER_H), (255, 255, 255))
        ImageDraw.Draw(img).text((2, 2), "no masked clip", fill=(0, 0, 0))
        _save_png(img, path)
        return img.size
    f, h, w = rows[0][2]["frame0"].shape
    frames = preview_frames(f)
    up, stride = cell_scale(w)
    size = preview_size(len(rows), f, (h, w))
    img = Image.new("RGB", size, (255, 255, 255))
    draw = ImageDraw.Draw(img)
    ch, cw = -(-h // stride) * up, -(-w // stride) * up
    for c, fr in enumerate(frames):
        draw.text((LABEL_W + c * (cw + GAP) + 2, 2), f"frame {fr}", fill=(0, 0, 0))
    y = HEADER_H
    for clip_id, params, outs in rows:
        for cal in CALIBRATIONS:
            q = "+".join(f"{x:.2f}" for x in params.qs)
            draw.text((2, y + 2), clip_id, fill=(0, 0, 0))
            draw.text((2, y + 14), f"{cal}  q={q}", fill=(0, 0, 0))
            for c, fr in enumerate(frames):
                ids = outs[cal][fr][::stride, ::stride]
                if up > 1:
                    ids = np.repeat(np.repeat(ids, up, axis=0), up, axis=1)
                img.paste(Image.fromarray(colorize(ids)), (LABEL_W + c * (cw + GAP), y))
            y += ch + GAP
        draw.line([(0, y - 1), (size[0], y - 1)], fill=(0, 0, 0))
    _save_png(img, path)
    return size


def _save_png(img, path: str | Path) -> None:
    with atomic_path(path) as tmp:
        img.save(tmp, format="PNG")


def build_parser() -> argparse.ArgumentParser:
    ap = ToolParser(
        "gcc-maskstats",
        "How much of each clip the world-anchored UNKNOWN mask hides under its two calibrations, side by side\n"
        "(frame0: frame 0's threshold in every frame; cap: each frame's threshold raised so that at most\n"
        "--max_frame_coverage of its static pixels are masked). The first --n clips of a --split of converted data,\n"
        "each masked with the parameters the loader draws for it in epoch 0 of --seed; mean, median, p90, max.",
        epilog=__doc__[__doc__.index("Per clip and calibration") :].rstrip(),
        renamed={"--json": "--out"},
    )
    ap.add_argument("--data", required=True, help="a converted shards folder (manifest.json), local or s3://")
    ap.add_argument("--split", default="train", help="train or val")
    ap.add_argument("--n", type=int, default=100, help="the first n clips of the split")
    ap.add_argument("--seed", type=int, default=0, help="the loader seed whose epoch-0 draws give (θ, q)")
    ap.add_argument("--max_frame_coverage", type=float, default=0.4, help="the cap calibration's bound")
    ap.add_argument("--out", help="write the table (and per-clip values) as JSON to this file")
    ap.add_argument("--preview", help="write a PNG contact sheet of masked clips to this file")
    ap.add_argument("-v", "--verbose", action="store_true", help="print each clip as it is measured")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if a.verbose else logging.INFO, format="%(message)s", stream=sys.stderr)
    if a.n < 1 or not 0.0 < a.max_frame_coverage < 1.0:
        ap.error("--n must be >= 1 and --max_frame_coverage in (0, 1)")
    if not 0 <= a.seed < 2**32:  # the loader's (Streaming's) range
        ap.error(f"--seed must be in [0, 2**32), got {a.seed}")

    def body() -> int:
        for flag, path in (("--out", a.out), ("--preview", a.preview)):  # before the clips are read
            problem = path and file_problem(path)
            if problem:
                raise BadInput(f"{flag} {path}: {problem}")
        problem = is_remote(a.data) and bucket_problem(a.data)
        if problem:
            raise BadInput(f"--data {a.data}: {problem}")
        res = measure(a.data, a.split, a.n, a.seed, a.max_frame_coverage, a.preview)
        print(format_table(res))
        if a.out:
            atomic_write(a.out, json.dumps(res, indent=1) + "\n")
            print(f"wrote {a.out}")
        if a.preview:
            print(f"wrote {a.preview}")
        return 0

    return run_tool(ap.prog, body)


if __name__ == "__main__":
    sys.exit(main())
