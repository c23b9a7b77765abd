"""What the tool writes: the GT | generated | cond mp4 and the json files, each atomically."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from gcc.data.storage import atomic_path, atomic_write

FPS = 16


def write_panels_mp4(path: Path, gt: np.ndarray, gen: np.ndarray, cond_rgb: np.ndarray, fps: int = FPS) -> None:
    """GT | generated | cond side by side, h264 (yuv420p)."""
    import imageio.v2 as imageio

    frames = np.concatenate([gt, gen, cond_rgb], axis=2)
    with atomic_path(path, suffix=".mp4") as tmp:  # ffmpeg picks the container by the extension
        w = imageio.get_writer(str(tmp), format="FFMPEG", fps=fps, codec="libx264", quality=9,
                               macro_block_size=1, pixelformat="yuv420p", ffmpeg_log_level="error")
        try:
            for f in frames:
                w.append_data(f)
        finally:
            w.close()


def write_json(path: Path, obj: Any) -> None:
    """`obj` as indented json; NaN/inf are an error (PSNR infinite is written as null by the caller)."""
    atomic_write(path, json.dumps(obj, indent=1, allow_nan=False) + "\n")
