"""The files of a sample, each written atomically: the side-by-side mp4, the PNG contact sheet and the json files;
and the animated GIF that TensorBoard shows for a video."""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from gcc.geometry import VAE_STRIDE_T, latent_frame_spans
from gcc.storage import atomic_path, atomic_write
from gcc.vocab import VALUE_NAMES, colorize

FPS = 16


def write_panels_mp4(path: Path, gt: np.ndarray, gen: np.ndarray, cond_rgb: np.ndarray, fps: int = FPS) -> None:
    """GT | generated | cond side by side, h264 (yuv420p)."""
    import imageio.v2 as imageio  # heavy/optional: ffmpeg video writing, only when a video is written

    frames = np.concatenate([gt, gen, cond_rgb], axis=2)
    with atomic_path(path, suffix=".mp4") as tmp:  # ffmpeg picks the container by the extension
        w = imageio.get_writer(
            str(tmp),
            format="FFMPEG",
            fps=fps,
            codec="libx264",
            quality=9,
            macro_block_size=1,
            pixelformat="yuv420p",
            ffmpeg_log_level="error",
        )
        try:
            for f in frames:
                w.append_data(f)
        finally:
            w.close()


def gif_bytes(frames: np.ndarray, fps: int = FPS, max_side: int = 512) -> tuple[bytes, tuple[int, int]]:
    """uint8 [F, H, W, 3] -> (an animated GIF looping forever, (height, width)), downscaled by an integer factor
    until its longer side is at most `max_side` (a full-size clip would be hundreds of MB in an event file)."""
    H, W = frames.shape[1:3]
    k = max(1, -(-max(H, W) // max_side))
    small = frames[:, ::k, ::k]
    images = [Image.fromarray(np.ascontiguousarray(f)) for f in small]
    buf = io.BytesIO()
    images[0].save(buf, format="GIF", save_all=True, append_images=images[1:], duration=round(1000 / fps), loop=0)
    return buf.getvalue(), (int(small.shape[1]), int(small.shape[2]))


def png_size(data: bytes) -> tuple[int, int]:
    """(height, width) of a PNG, from its IHDR chunk."""
    return int.from_bytes(data[20:24], "big"), int.from_bytes(data[16:20], "big")


def sheet_rows(n: int, most: int = 4) -> list[int]:
    """Up to `most` of the frames 0..n-1 for a contact sheet, evenly spread from the first to the last."""
    return sorted({int(round(x)) for x in np.linspace(0, n - 1, min(n, most))})


def latent_frame_rows(
    panels: Sequence[np.ndarray], notes: Mapping[int, str]
) -> tuple[list[list[np.ndarray]], list[str]]:
    """A contact sheet's rows and row labels (`write_contact_sheet`) for the pixel-frame videos `panels` (each
    [F, H, W, 3], F = 4(T-1)+1 for T latent frames): one row per shown latent frame (up to 4, `sheet_rows`), each
    panel at the last pixel frame of that latent frame (the condition as the model saw it there), labelled with the
    latent frame, that pixel frame and `notes` of that latent frame if any. gcc-sample's sheets and the samples
    during training both use it."""
    latent_frames = (panels[0].shape[0] - 1) // VAE_STRIDE_T + 1  # the inverse of geometry.pixel_frames
    spans = latent_frame_spans(latent_frames)
    rows, labels = [], []
    for k in sheet_rows(latent_frames):
        last = spans[k][1] - 1
        rows.append([p[last] for p in panels])
        labels.append(f"latent frame {k}\npixel frame {last}" + (f"\n{notes[k]}" if k in notes else ""))
    return rows, labels


def write_json(path: Path, obj: Any) -> None:
    """`obj` as indented json; NaN/inf are an error (PSNR infinite is written as null by the caller)."""
    atomic_write(path, json.dumps(obj, indent=1, allow_nan=False) + "\n")


def _font(size: int):
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: the fixed bitmap font
        return ImageFont.load_default()


def write_contact_sheet(
    path: Path,
    rows: list[list[np.ndarray]],
    titles: list[str],
    row_labels: list[str],
    caption: str,
    classes: np.ndarray,
    vocab: str,
    min_width: int = 192,
) -> None:
    """A PNG grid: one row per shown frame (`rows[r]` = its panels, uint8 [H, W, 3] each, upscaled by an integer
    factor so a tiny clip stays readable), column `titles` on top, `row_labels` on the left, a legend of the
    `classes` present (palette colour + name) below."""
    H, W = rows[0][0].shape[:2]
    s = max(1, -(-min_width // W))
    font, gap, left, top, line = _font(13), 6, 130, 44, 16
    cols = len(titles)
    swatch_w = 150
    per_line = max(1, (left + cols * (W * s + gap)) // swatch_w)
    legend_h = line * -(-len(classes) // per_line) + gap
    img = Image.new(
        "RGB", (left + cols * (W * s + gap), top + len(rows) * (H * s + gap) + legend_h + gap), (32, 32, 32)
    )
    d = ImageDraw.Draw(img)
    d.text((gap, 4), caption, fill=(235, 235, 235), font=font)
    for c, t in enumerate(titles):
        d.text((left + c * (W * s + gap), top - line - 4), t, fill=(235, 235, 235), font=font)
    for r, (panels, label) in enumerate(zip(rows, row_labels)):
        y = top + r * (H * s + gap)
        d.multiline_text((gap, y + 2), label, fill=(235, 235, 235), font=font, spacing=3)
        for c, p in enumerate(panels):
            img.paste(
                Image.fromarray(p).resize((W * s, H * s), Image.Resampling.NEAREST), (left + c * (W * s + gap), y)
            )
    y0 = top + len(rows) * (H * s + gap) + gap
    names = VALUE_NAMES[vocab]
    for n, v in enumerate(classes):
        x, y = gap + (n % per_line) * swatch_w, y0 + (n // per_line) * line
        swatch = colorize(np.full((12, 12), v, dtype=np.uint8), vocab, hatch_period=4)  # UNKNOWN hatched too
        img.paste(Image.fromarray(swatch), (x, y + 2))
        d.text((x + 16, y), f"{int(v)} {names.get(int(v), '?')}", fill=(235, 235, 235), font=font)
    with atomic_path(path, suffix=".png") as tmp:
        img.save(str(tmp), format="PNG")
