"""A plain reference implementation of the world-anchored UNKNOWN mask (docs/training.md, "Dropouts and the UNKNOWN
mask"), for tests and the bench.

It follows that definition (and gcc/data/mask.py's docstring) line by line with per-frame, per-pixel Python loops
and shares nothing with the fast
mask (`gcc/data/mask.py`, `gcc/data/mask_grid.py`, `gcc/data/mask_cap.py`) except the docs/design.md §3 geometry
(`gcc.geometry.ground_points`, called for one pixel at a time) and the vocabulary. The quantile is the per-pixel
inverted-CDF quantile (`gcc.data.mask_grid.weighted_quantile` documents the same definition over weighted
cells): sort the n pixel values, t = p·n, take the value at 1-based position max(1, ceil(t)). Slow on purpose
(≈1 s per full-geometry frame).
"""

from __future__ import annotations

import math

import numpy as np

from gcc.geometry import Cameras, ground_points
from gcc.vocab import STATIC_MAX, UNKNOWN


def quantile(values: list[float], p: float) -> float:
    """Inverted-CDF quantile of a list of pixel values; +inf for an empty list."""
    if not values:
        return math.inf
    values = sorted(values)
    t = p * float(len(values))
    k = max(1, math.ceil(t))
    return values[k - 1]


def reference_mask(ids, cameras, ground_z, thetas, qs, calibration="frame0", max_frame_coverage=0.4, frames=None):
    """Returns (masked ids of `frames` [len(frames), H, W], number of pixels set to 255 in those frames,
    thresholds {frame: [τ_f per plane]}). `frames` defaults to all frames."""
    n_frames, height, width = ids.shape
    frames = list(range(n_frames)) if frames is None else list(frames)
    out = np.array(ids[frames], dtype=np.uint8, copy=True)

    # "Ground plane Z = ground_z[0]; if NaN, the nanmedian of ground_z; if none is finite, no mask."
    if math.isfinite(float(ground_z[0])):
        plane_z = float(ground_z[0])
    else:
        finite = [float(z) for z in ground_z if math.isfinite(float(z))]
        if not finite:
            return out, 0, {}
        plane_z = float(np.median(finite))

    # "Ground points are computed on the 4x4 pooled grid (cell (i, j) uses dst pixel (4j+2, 4i+2)) and
    # nearest-upsampled x4": a pixel (v, u) takes the ground point of cell (v // 4, u // 4).
    cache = {}

    def ground_point(f, v, u):
        i, j = v // 4, u // 4
        if (f, i, j) not in cache:
            pixel = np.array([[4 * j + 2, 4 * i + 2]])
            x, y = ground_points(cameras[f], pixel, plane_z)[0, 0]
            cache[(f, i, j)] = (float(x), float(y))
        return cache[(f, i, j)]

    def projection(point, theta):
        x, y = point
        if math.isnan(x) or math.isnan(y):
            return math.nan
        return x * math.cos(theta) + y * math.sin(theta)

    def static_projections(f, theta):
        values = []
        for v in range(height):
            for u in range(width):
                if ids[f, v, u] <= STATIC_MAX:
                    p = projection(ground_point(f, v, u), theta)
                    if not math.isnan(p):
                        values.append(p)
        return values

    # "τ = the (1−q) quantile of frame 0's static pixels' projections onto θ, weighted per pixel."
    taus = [quantile(static_projections(0, theta), 1.0 - q) for theta, q in zip(thetas, qs)]

    count = 0
    thresholds = {}
    for n, f in enumerate(frames):
        frame_taus = list(taus)
        if calibration == "cap":
            # "τ_f = max(τ, the (1 − max_frame_coverage) quantile of frame f's static projections)"
            for k, theta in enumerate(thetas):
                values = static_projections(f, theta)
                if values:  # nothing to cap in a frame without static ground pixels
                    frame_taus[k] = max(taus[k], quantile(values, 1.0 - max_frame_coverage))
        elif calibration != "frame0":
            raise ValueError(calibration)
        thresholds[f] = frame_taus
        # "Every frame: a static pixel becomes 255 when its ground point lies beyond any plane or is NaN.
        # Characters (10..21) are never touched."
        for v in range(height):
            for u in range(width):
                if ids[f, v, u] > STATIC_MAX:
                    continue
                point = ground_point(f, v, u)
                beyond = math.isnan(point[0]) or any(
                    projection(point, theta) > frame_taus[k] for k, theta in enumerate(thetas)
                )
                if beyond:
                    out[n, v, u] = UNKNOWN
                    count += 1
    return out, count, thresholds


def random_cameras(seed: int, hw: tuple[int, int] | None = None) -> tuple[Cameras, float]:
    """(cameras, ground z): 2 to 4 frames of one random camera moving and turning over dst size `hw` (random when
    None), orthographic for odd seeds and perspective for even ones, looking down at any heading; a shallow
    perspective shows the horizon (sky cells)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 5))
    hw = hw or (int(rng.choice([16, 24, 32])), int(rng.choice([32, 48])))
    ortho = bool(seed % 2)
    pitch = rng.uniform(-90, -50) if ortho else rng.uniform(-80, -2)
    t = np.arange(n, dtype=np.float64)[:, None]
    loc0 = np.array([rng.uniform(-1e3, 1e3), rng.uniform(-1e3, 1e3), rng.uniform(100, 1200)])
    loc = loc0 + t * rng.uniform(-60, 60, 3)
    rot = np.array([pitch, rng.uniform(0, 360), rng.uniform(-20, 20)]) + t * rng.uniform(-2, 2, 3)
    src = (hw[0] * 3 // 2, hw[1] * 3 // 2)
    fov, width = rng.uniform(40, 110), rng.uniform(300, 3000)
    cams = Cameras(loc, rot, np.full(n, ortho), np.full(n, fov), np.full(n, width), src, hw)
    return cams, float(rng.uniform(-100, 100))
