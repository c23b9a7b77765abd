"""The `cap` calibration of the UNKNOWN mask (gcc/data/mask_cap.py, docs/design.md §6): per frame and plane,
τ_f = max(τ, the weighted quantile at 1 − max_frame_coverage of the frame's static finite projections), equal to
that definition computed from `geometry.ground_points` directly, on random cameras, small frames and frames large
enough for the bracketed path. The whole mask against a plain reference is tests/data/test_mask.py."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gcc.data.mask_cap import cap_taus
from gcc.data.mask_grid import ClipGrid, MaskParams, cell_pixels, weighted_quantile
from gcc.geometry import ground_points

try:
    from tests.mask_reference import random_cameras
except ImportError:  # tests/ itself on sys.path (pytest's rootdir-less import)
    from mask_reference import random_cameras


def cap_definition(cams, gz, weights, params, tau, max_cov):
    """τ_f per frame and plane [F, K] straight from the definition."""
    xy = ground_points(cams, cell_pixels(cams.dst_hw), gz)  # [F, P, 2]
    out = np.empty((len(cams), params.n_planes))
    for k, theta in enumerate(params.thetas):
        proj = xy[..., 0] * math.cos(theta) + xy[..., 1] * math.sin(theta)
        for f in range(len(cams)):
            seen = ~np.isnan(proj[f])
            q = weighted_quantile(proj[f][seen], weights[f].ravel()[seen], 1.0 - max_cov)
            out[f, k] = tau[k] if not math.isfinite(tau[k]) or not math.isfinite(q) else max(tau[k], q)
    return out


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("big", [False, True])  # True: 64x48 cells a frame, where the bracket is tried
def test_cap_taus_are_the_capped_quantiles_of_each_frame(seed, big):
    cams, gz = random_cameras(seed, (256, 192) if big else None)
    clip = ClipGrid(cams, cams.dst_hw, gz)
    rng = np.random.default_rng(seed + 3)
    weights = rng.integers(0, 17, size=(len(cams), clip.h4, clip.w4))
    weights[rng.random(weights.shape) < 0.2] = 0
    k = 1 + seed % 2
    params = MaskParams(tuple(rng.uniform(0, 2 * np.pi, k)), tuple(rng.uniform(0.05, 0.4, k)))
    max_cov = float(rng.uniform(0.05, 0.5))
    # τ: frame 0's quantile at 1 − q (what `frame0` calibration gives), or +inf for a plane with no population
    xy0 = ground_points(cams[0], cell_pixels(cams.dst_hw), gz)[0]
    tau = np.array(
        [
            weighted_quantile(
                (p := xy0[:, 0] * math.cos(t) + xy0[:, 1] * math.sin(t))[~np.isnan(p)],
                weights[0].ravel()[~np.isnan(p)],
                1.0 - q,
            )
            for t, q in zip(params.thetas, params.qs)
        ]
    )
    if seed == 4:
        tau[-1] = math.inf
    hit_iv = clip.intervals(*clip.hit_function())
    got = cap_taus(clip, params, weights, tau, hit_iv, max_cov)
    want = cap_definition(cams, gz, weights, params, tau, max_cov)
    assert got.tolist() == want.tolist()
    assert (got >= tau[None]).all()  # a cap only ever moves a plane outwards


def test_a_frame_within_the_cap_keeps_tau():
    cams, gz = random_cameras(2)
    clip = ClipGrid(cams, cams.dst_hw, gz)
    weights = np.ones((len(cams), clip.h4, clip.w4), dtype=np.int64)
    params = MaskParams((0.5,), (0.2,))
    tau = np.array([-1e9])  # everything beyond: every frame over any cap < 1
    hit_iv = clip.intervals(*clip.hit_function())
    assert (cap_taus(clip, params, weights, tau, hit_iv, 0.3) > -1e9).all()
    tau = np.array([1e9])  # nothing beyond: no frame needs its own quantile
    assert cap_taus(clip, params, weights, tau, hit_iv, 0.3).tolist() == [[1e9]] * len(cams)
