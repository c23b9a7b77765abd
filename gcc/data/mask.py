"""The world-anchored UNKNOWN mask (docs/design.md §6), exact and fast.

This module holds the mask's entry points: :func:`apply_unknown_mask` (raw ids in, masked ids out),
:func:`unknown_cells` (the mask on the pooled grid), :func:`mask_ground_z`, :func:`static_cell_counts` and the
pixel pass. The pooled-grid machinery they run on (``ClipGrid``, ``frame_quantiles``, ...) is in
gcc/data/mask_grid.py and the `cap` calibration in gcc/data/mask_cap.py; ``MaskParams``, ``CELL``,
``cell_pixels``, ``weighted_quantile`` and ``STATS`` are defined there and re-exported here.

What it computes (docs/design.md §6, with the definitions this module fixes):

* Ground plane Z = ``ground_z[0]``; if that is not finite, the median of the finite entries of ``ground_z``
  (= nanmedian); if none is finite there is no mask (fraction 0). See :func:`mask_ground_z`.
* Cell (i, j) of the 4×4 pooled grid owns the dst pixels (v, u) with v // 4 == i, u // 4 == j; its ground
  point is ``geometry.ground_points`` at dst pixel (u, v) = (4j+2, 4i+2) (nearest upsampling ×4). A pixel's
  *projection* onto plane direction θ is x·cos θ + y·sin θ of its cell's ground point (``math.cos/sin``),
  NaN where the ray misses the ground.
* τ of a plane = :func:`weighted_quantile` at p = 1 − q of frame 0's static pixels (raw ≤ 6) with a finite
  projection, each pixel counting once (= cells weighted by their number of static pixels); +inf (nothing
  beyond the plane) when frame 0 has no such pixel.
* Every frame f: a static pixel becomes 255 when its projection is NaN or > τ_f of any plane. Other values
  (characters 10..21, 255) never change. ``frame0``: τ_f = τ. ``cap``: τ_f = max(τ, weighted_quantile at
  p = 1 − max_frame_coverage of frame f's static finite projections; τ_f = τ when frame f has none). With
  the inverted-CDF quantile this bounds, per plane and per frame, the static finite pixels beyond the plane
  by max_frame_coverage × their number, exactly; NaN (sky) static pixels are masked on top of that, and
  with two planes the union can reach 2 × max_frame_coverage (the design's formula is per plane).

Loader use (one sample; `draw` from :func:`gcc.data.sample_rng.draw_sample`)::

    if draw.mask is not None:          # never when cond was dropped
        ids, frac = apply_unknown_mask(ids, Cameras.from_meta(meta), meta["ground_z"], draw.mask,
                                       calibration, max_frame_coverage, inplace=True)

How it is fast (≈20 ms for `frame0` at 81×480×832 on one core, instead of 270–370 ms): in a frame, a cell's
ray is D = fwd + a·right + b·up (a, b: its offsets on the image plane, a per column, b per row). "Hits the
ground" and "projection > τ" are each the sign of an affine function of (a, b) (the ratio
proj − τ = h·(D_θ − k·D_z)/D_z has a fixed-sign denominator on the hit cells), so along every row of cells
each test is a sure-negative run, a sure-positive run and an ambiguous run where the affine value is within
a rigorous float error bound (×1e4 margin) of 0. The ambiguous run is almost always empty; its cells and the
near-horizon rays (|D_z| < 1e-4·|D|) are decided with ``geometry.ground_points`` itself. Quantiles use the
closed-form projections to find a candidate, then recompute with ``geometry.ground_points`` every cell
within twice the error bound of it. So every decision and every τ is the one the per-pixel definition
(tests/mask_reference.py) takes with the same float64 arithmetic: fast == reference exactly, ties included
(the row runs and the quantiles: ``ClipGrid`` and ``frame_quantiles`` in gcc/data/mask_grid.py). The pixel pass is one compare, one multiply, one count and one OR over uint8, a few frames at a time.
`cap` costs more (≈30–60 ms): every frame whose coverage at τ exceeds the cap needs its own quantile
(gcc/data/mask_cap.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from gcc.data.mask_cap import cap_taus
from gcc.data.mask_grid import (
    CELL,
    STATS,
    ClipGrid,
    MaskParams,
    cell_pixels,
    frame_quantiles,
    runs_to_cells,
    weighted_quantile,
)
from gcc.geometry import Cameras
from gcc.vocab import STATIC_MAX, UNKNOWN

__all__ = [
    "CALIBRATIONS",
    "CELL",
    "DEFAULT_MAX_FRAME_COVERAGE",
    "STATS",
    "MaskParams",
    "apply_unknown_mask",
    "cell_pixels",
    "mask_ground_z",
    "static_cell_counts",
    "unknown_cells",
    "weighted_quantile",
]

assert UNKNOWN == 0xFF  # the pixel pass ORs 0xFF bytes into masked static pixels
CALIBRATIONS = ("frame0", "cap")
DEFAULT_MAX_FRAME_COVERAGE = 0.4


def mask_ground_z(ground_z: Sequence[float] | np.ndarray) -> float | None:
    """The plane Z of the mask: ground_z[0] if finite, else the median of the finite entries, else None."""
    gz = np.asarray(ground_z, dtype=np.float64).ravel()
    if gz.size and np.isfinite(gz[0]):
        return float(gz[0])
    fin = gz[np.isfinite(gz)]
    return float(np.median(fin)) if fin.size else None


def static_cell_counts(ids: np.ndarray, chunk: int = 8) -> np.ndarray:
    """ids uint8 [F, H, W] -> number of static pixels per 4×4 cell, int32 [F, H/4, W/4]."""
    f, h, w = ids.shape
    out = np.empty((f, h // CELL, w // CELL), dtype=np.int32)
    for a in range(0, f, chunk):
        part = ids[a : a + chunk]
        s = np.less_equal(part, STATIC_MAX).view(np.uint8)  # 0/1 bytes
        # 4 horizontal bytes of a cell-row = one uint32: add the 4 rows, then sum the 4 bytes (each <= 4)
        rows = s.reshape(len(part), h // CELL, CELL, w).view(np.uint32)  # [k, h4, 4, w4]
        acc = rows.sum(axis=2, dtype=np.uint32)
        out[a : a + chunk] = (acc * np.uint32(0x01010101)) >> np.uint32(24)
    return out


def _exact_decide(xy: np.ndarray, thetas, tau_rows: np.ndarray) -> np.ndarray:
    """Masked cells from exact ground points [n, 2] and per-cell thresholds [n, K]."""
    masked = np.isnan(xy[:, 0])
    for k, th in enumerate(thetas):
        proj = xy[:, 0] * math.cos(th) + xy[:, 1] * math.sin(th)
        masked |= proj > tau_rows[:, k]
    return masked


def unknown_cells(
    cameras: Cameras,
    gz: float,
    hw: tuple[int, int],
    params: MaskParams,
    weights: np.ndarray,
    calibration: str = "frame0",
    max_frame_coverage: float = DEFAULT_MAX_FRAME_COVERAGE,
) -> tuple[np.ndarray, np.ndarray]:
    """The mask on the pooled grid: masked cells bool [F, h4, w4] (a static pixel is masked iff its cell is)
    and the thresholds τ_f per frame and plane [F, K]. `weights`: static pixels per cell, [F, h4, w4]
    (for ``frame0`` only weights[0] is read, so [1, h4, w4] is enough)."""
    if calibration not in CALIBRATIONS:
        raise ValueError(f"calibration must be one of {CALIBRATIONS}, got {calibration!r}")
    nf = len(cameras)
    clip = ClipGrid(cameras, hw, gz)
    h4, w4, P = clip.h4, clip.w4, clip.h4 * clip.w4
    thetas, qs = params.thetas, params.qs
    K = len(thetas)

    hit_iv = clip.intervals(*clip.hit_function())
    # τ per plane: the exact weighted quantile of frame 0's static finite projections
    tau = np.array(
        [
            frame_quantiles(clip, np.zeros(1, dtype=np.int64), thetas[k], weights, hit_iv, 1.0 - qs[k])[0]
            for k in range(K)
        ]
    )
    taus = np.broadcast_to(tau, (nf, K)).copy()
    if calibration == "cap":
        taus = cap_taus(clip, params, weights, tau, hit_iv, max_frame_coverage)

    # every cell: sure decisions from the row runs, then the ambiguous cells exactly
    masked = clip.positive_cells(hit_iv, np.empty((nf, h4, w4), dtype=bool), negate=True)  # sure miss or amb
    tmp = np.empty_like(masked)
    amb = [runs_to_cells(hit_iv[2], hit_iv[3], w4)]
    for k in range(K):
        iv = clip.intervals(*clip.plane_function(thetas[k], taus[:, k]))
        np.logical_or(masked, clip.positive_cells(iv, tmp), out=masked)
        amb.append(runs_to_cells(iv[2], iv[3], w4))
    amb = np.unique(np.concatenate(amb))
    if amb.size:
        fr, cell = amb // P, amb % P
        masked.reshape(-1)[amb] = _exact_decide(clip.exact_xy(fr, cell), thetas, taus[fr])
    return masked, taus


def apply_unknown_mask(
    ids: np.ndarray,
    cameras: Cameras,
    ground_z: Sequence[float] | np.ndarray,
    params: MaskParams,
    calibration: str = "frame0",
    max_frame_coverage: float = DEFAULT_MAX_FRAME_COVERAGE,
    inplace: bool = False,
) -> tuple[np.ndarray, float]:
    """Apply the world-anchored UNKNOWN mask (docs/design.md §6) to raw parts ids uint8 [F, H, W] (H, W multiples of 4).

    cameras: one per frame (``Cameras.from_meta(meta)``), dst_hw == (H, W); ground_z: [F], NaN allowed.
    Returns (masked ids, fraction of all F·H·W pixels set to 255). With ``inplace=True`` `ids` (writable,
    C-contiguous) is modified and returned; otherwise a new array is returned and `ids` is untouched.
    No finite ground_z: the ids unchanged (a copy unless inplace) and fraction 0.0."""
    ids = np.asarray(ids)
    if ids.dtype != np.uint8 or ids.ndim != 3:
        raise ValueError(f"ids must be uint8 [F, H, W], got {ids.dtype} {ids.shape}")
    nf, h, w = ids.shape
    if h % CELL or w % CELL:
        raise ValueError(f"H, W must be multiples of {CELL}, got {h}x{w}")
    if len(cameras) != nf or tuple(cameras.dst_hw) != (h, w) or len(ground_z) != nf:
        raise ValueError(
            f"cameras ({len(cameras)}, dst_hw {cameras.dst_hw}) and ground_z ({len(ground_z)}) "
            f"must match ids {ids.shape}"
        )
    out = ids if inplace else ids.copy()
    if not out.flags.c_contiguous:
        raise ValueError("ids must be C-contiguous")
    gz = mask_ground_z(ground_z)
    if gz is None:
        return out, 0.0
    if calibration == "cap":
        weights = static_cell_counts(out)
    else:
        weights = static_cell_counts(out[:1])
    cells, _ = unknown_cells(cameras, gz, (h, w), params, weights, calibration, max_frame_coverage)
    return out, _apply_cells(out, cells)


def _apply_cells(out: np.ndarray, cells: np.ndarray, chunk: int = 4) -> float:
    """Set static pixels of masked cells to 255 in place, `chunk` frames at a time (small temporaries);
    returns the fraction of pixels set."""
    nf, h, w = out.shape
    h4 = h // CELL
    # cell mask -> 0xFF bytes repeated over the 4 columns of the cell (one uint32 per cell-row)
    up = (cells.astype(np.uint32) * np.uint32(0xFFFFFFFF)).view(np.uint8).reshape(nf, h4, 1, w)
    m = np.empty((min(chunk, nf), h, w), dtype=bool)
    n = 0
    for a in range(0, nf, chunk):
        o = out[a : a + chunk]
        mm = m[: len(o)]
        np.less_equal(o, STATIC_MAX, out=mm)
        mu = mm.view(np.uint8)  # 0/1
        m4 = mu.reshape(len(o), h4, CELL, w)
        np.multiply(m4, up[a : a + chunk], out=m4)  # 0/255: static pixel of a masked cell
        n += np.count_nonzero(mu)
        np.bitwise_or(o, mu, out=o)
    return n / out.size
