"""The files of a sample (gcc/sampling/media.py): the side-by-side mp4, the contact sheet, the json files and the
GIF that TensorBoard shows, read back with other readers than the writers."""

from __future__ import annotations

import io
import json
import math

import imageio.v2 as imageio
import numpy as np
import pytest
from PIL import Image

from gcc.sampling.media import (
    gif_bytes,
    latent_frame_rows,
    png_size,
    sheet_rows,
    write_contact_sheet,
    write_json,
    write_panels_mp4,
)
from gcc.vocab import UNKNOWN, colorize


def frames(n: int, h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, size=(n, h, w, 3), dtype=np.uint8)


def test_the_mp4_holds_every_frame_gt_generated_and_cond_side_by_side(tmp_path):
    gt, gen, cond = (np.full((5, 16, 24, 3), v, np.uint8) for v in (40, 130, 220))
    write_panels_mp4(tmp_path / "clip.mp4", gt, gen, cond)
    r = imageio.get_reader(str(tmp_path / "clip.mp4"))
    try:
        got = np.stack([f for f in r])  # (list(r) asks the reader for a length it does not know)
    finally:
        r.close()
    assert got.shape == (5, 16, 72, 3)
    for k, v in enumerate((40, 130, 220)):  # h264 is lossy: each panel near its flat value
        assert abs(got[:, :, 24 * k + 4 : 24 * k + 20].astype(int).mean() - v) < 4
    assert [p.name for p in tmp_path.iterdir()] == ["clip.mp4"]  # no temporary left beside it


@pytest.mark.parametrize("hw, max_side, scale", [((16, 24), 512, 1), ((64, 96), 48, 2), ((64, 100), 48, 3)])
def test_the_gif_loops_over_every_frame_downscaled_by_an_integer_factor(hw, max_side, scale):
    video = frames(4, *hw)
    data, (h, w) = gif_bytes(video, fps=10, max_side=max_side)
    assert max(h, w) <= max_side and (h, w) == (-(-hw[0] // scale), -(-hw[1] // scale))
    im = Image.open(io.BytesIO(data))
    assert im.format == "GIF" and im.n_frames == 4 and im.size == (w, h)
    assert im.info["loop"] == 0 and im.info["duration"] == 100  # GIF delays are in 1/100 s


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 9, 81])
def test_sheet_rows_spread_from_the_first_frame_to_the_last(n):
    rows = sheet_rows(n)
    assert rows == sorted(set(rows)) and len(rows) == min(n, 4)
    assert rows[0] == 0 and rows[-1] == n - 1 and all(0 <= r < n for r in rows)


@pytest.mark.parametrize(
    "latent, shown",
    [(1, [(0, 0)]), (2, [(0, 0), (1, 4)]), (3, [(0, 0), (1, 4), (2, 8)]), (21, [(0, 0), (7, 28), (13, 52), (20, 80)])],
)
def test_contact_sheet_rows_are_latent_frames_each_at_its_last_pixel_frame(latent, shown):
    """One row per shown latent frame, never two rows of one latent frame (9 pixel frames were 4 rows for 3
    latent frames); the same labels for gcc-sample's sheets and the samples during training."""
    F = 4 * (latent - 1) + 1
    video = np.arange(F, dtype=np.uint8)[:, None, None, None] * np.ones((1, 2, 3, 3), np.uint8)  # value = frame
    rows, labels = latent_frame_rows([video, video + 100], {0: "given", 1: "agreement 0.50"})
    assert [(int(r[0][0, 0, 0]), int(r[1][0, 0, 0])) for r in rows] == [(p, p + 100) for _, p in shown]
    assert labels == [
        f"latent frame {k}\npixel frame {p}" + {0: "\ngiven", 1: "\nagreement 0.50"}.get(k, "") for k, p in shown
    ]


def test_the_contact_sheet_is_a_png_of_every_row_and_panel_and_png_size_reads_it(tmp_path):
    H, W = 8, 12
    shown = [0, 4]
    panels = [[frames(1, H, W, s)[0] for s in range(3)] for _ in shown]
    classes = np.array([0, 3, UNKNOWN], np.uint8)
    path = tmp_path / "sheet.png"
    write_contact_sheet(path, panels, ["GT", "sample", "cond"], ["f0", "f4"], "clip00001", classes, "parts")
    data = path.read_bytes()
    im = Image.open(path)
    assert im.format == "PNG" and png_size(data) == (im.height, im.width)
    s = 192 // W  # upscaled by an integer factor to at least min_width
    assert im.width >= 3 * W * s and im.height >= 2 * H * s
    # the first panel of the first row is there, upscaled (nearest): find its top-left pixel block
    pixels = np.asarray(im.convert("RGB"))
    block = np.repeat(np.repeat(panels[0][0], s, 0), s, 1)
    hits = np.argwhere((pixels[:, :, :] == block[0, 0]).all(-1))
    assert any(np.array_equal(pixels[y : y + H * s, x : x + W * s], block) for y, x in hits[:2000])
    # the legend shows the UNKNOWN swatch (hatched)
    swatch = colorize(np.full((12, 12), UNKNOWN, dtype=np.uint8), "parts", hatch_period=4)
    assert any(
        np.array_equal(pixels[y : y + 12, x : x + 12], swatch) for y, x in np.argwhere((pixels == swatch[0, 0]).all(-1))
    )


def test_json_files_are_indented_and_never_hold_nan(tmp_path):
    write_json(tmp_path / "m.json", {"psnr": None, "ssim": 0.5})
    assert json.loads((tmp_path / "m.json").read_text()) == {"psnr": None, "ssim": 0.5}
    with pytest.raises(ValueError):
        write_json(tmp_path / "bad.json", {"psnr": math.inf})
    assert not (tmp_path / "bad.json").exists()
