"""The pooled-grid machinery of the UNKNOWN mask (gcc/data/mask_grid.py, docs/design.md §6), each piece against its
definition on random cameras (perspective and orthographic, any orientation, sky in view): the quantile rule, the
cell grid, the sure/ambiguous row runs of the hit and plane tests (sure cells are what `geometry.ground_points` says,
exactly), the closed-form projections within their error bound, and `frame_quantiles` equal to the quantile of the
exact projections. The whole mask against a plain reference is tests/data/test_mask.py."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gcc.data.mask_grid import (
    CELL,
    ClipGrid,
    MaskParams,
    cell_pixels,
    frame_quantiles,
    row_sum,
    runs_to_cells,
    weighted_quantile,
)
from gcc.geometry import Cameras, ground_points

try:
    from tests.mask_reference import random_cameras
except ImportError:  # tests/ itself on sys.path (pytest's rootdir-less import)
    from mask_reference import random_cameras

SEEDS = range(12)


def random_clip(seed: int, hw: tuple[int, int] | None = None):
    """(ClipGrid, cameras, ground z) of `random_cameras` (tests/mask_reference.py)."""
    cams, gz = random_cameras(seed, hw)
    return ClipGrid(cams, cams.dst_hw, gz), cams, gz


def exact_points(clip: ClipGrid, cams: Cameras, gz: float) -> np.ndarray:
    """ground_points of every cell [F, h4, w4, 2] (the definition; NaN where the ray misses)."""
    return ground_points(cams, cell_pixels(cams.dst_hw), gz).reshape(len(cams), clip.h4, clip.w4, 2)


def classes(clip: ClipGrid, iv) -> tuple[np.ndarray, np.ndarray]:
    """(sure-positive, sure-negative) cells [F, h4, w4] of intervals `iv`: the rest is ambiguous."""
    F = len(clip.cameras)
    pos = clip.positive_cells(iv, np.empty((F, clip.h4, clip.w4), dtype=bool))
    amb = np.zeros(F * clip.h4 * clip.w4, dtype=bool)
    amb[runs_to_cells(iv[2], iv[3], clip.w4)] = True
    amb = amb.reshape(pos.shape)
    return pos & ~amb, ~pos & ~amb


# ---- the parameters, the quantile rule, the grid -----------------------------------------------------------------
def test_mask_params_need_one_q_per_theta_each_in_0_1():
    assert MaskParams((0.1, 2.0), (0.2, 0.3)).n_planes == 2
    for thetas, qs in (((), ()), ((0.1,), (0.2, 0.3)), ((0.1,), (0.0,)), ((0.1,), (1.0,))):
        with pytest.raises(ValueError):
            MaskParams(thetas, qs)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("p", [0.0, 1.0, "on a cumulative weight", "random"])
def test_weighted_quantile_is_the_quantile_of_the_population_the_weights_count(seed, p):
    rng = np.random.default_rng(seed)
    values = rng.choice(rng.normal(size=20), size=int(rng.integers(1, 40)))  # ties on purpose
    weights = rng.integers(0, 4, size=values.size)
    if p == "random":
        p = float(rng.uniform())
    elif p == "on a cumulative weight":  # p·W exactly the weight up to some value: the quantile is that value
        W = int(weights.sum())
        p = float(np.cumsum(weights[np.argsort(values, kind="stable")])[rng.integers(values.size)] / max(W, 1))
    population = np.sort(np.repeat(values, weights))
    q = weighted_quantile(values, weights, p)
    if population.size == 0:
        assert q == math.inf
        return
    assert q == population[max(1, math.ceil(p * population.size)) - 1]  # 1-based position max(1, ceil(p·n))
    assert population[population > q].size <= (1 - p) * population.size + 1e-9  # at most (1 − p)·W beyond it


def test_cells_are_the_centres_of_4x4_blocks_row_major():
    px = cell_pixels((8, 12))
    assert px.shape == (2 * 3, 2)
    for i in range(2):
        for j in range(3):
            assert px[i * 3 + j].tolist() == [CELL * j + 2, CELL * i + 2]


# ---- the row runs: sure cells are exact --------------------------------------------------------------------------
@pytest.mark.parametrize("seed", SEEDS)
def test_sure_hit_and_sure_miss_cells_are_what_ground_points_says(seed):
    clip, cams, gz = random_clip(seed)
    hit = ~np.isnan(exact_points(clip, cams, gz)[..., 0])
    pos, neg = classes(clip, clip.intervals(*clip.hit_function()))
    assert not (pos & ~hit).any() and not (neg & hit).any()
    assert (pos | neg).mean() > 0.5  # the runs decide most cells: the exact path is for few


@pytest.mark.parametrize("seed", SEEDS)
def test_sure_beyond_and_sure_before_a_plane_are_exact_on_hit_cells(seed):
    clip, cams, gz = random_clip(seed)
    xy = exact_points(clip, cams, gz)
    theta = float(np.random.default_rng(seed).uniform(0, 2 * np.pi))
    proj = xy[..., 0] * math.cos(theta) + xy[..., 1] * math.sin(theta)
    hit = ~np.isnan(proj)
    # a threshold per frame inside its projections (a plane through the view); the last frame's +inf: none beyond
    tau = np.array([np.nanmedian(p) if np.isfinite(p).any() else 0.0 for p in proj])
    tau[-1] = math.inf
    pos, neg = classes(clip, clip.intervals(*clip.plane_function(theta, tau)))
    with np.errstate(invalid="ignore"):
        beyond = proj > tau[:, None, None]
    assert not (pos & hit & ~beyond).any() and not (neg & hit & beyond).any()
    assert not pos[-1].any()


@pytest.mark.parametrize("seed", SEEDS)
def test_closed_form_projections_are_within_their_bound_of_the_exact_ones(seed):
    clip, cams, gz = random_clip(seed)
    xy = exact_points(clip, cams, gz)
    theta = float(np.random.default_rng(seed + 100).uniform(0, 2 * np.pi))
    exact = (xy[..., 0] * math.cos(theta) + xy[..., 1] * math.sin(theta)).reshape(len(cams), -1)
    frames = np.arange(len(cams))
    fast = clip.fast_projections(frames, theta)
    n0, nb, na, d0, db, da = clip.projection_coefficients(frames, theta)
    a = clip.half_w[:, None, None] * clip.ndcx[None, None, :]
    b = clip.b[:, :, None]
    coef = (
        (n0[:, None, None] + nb[:, None, None] * b + na[:, None, None] * a)
        / (d0[:, None, None] + db[:, None, None] * b + da[:, None, None] * a)
    ).reshape(len(cams), -1)
    pos, _ = classes(clip, clip.intervals(*clip.hit_function()))
    for f in frames:
        sure = pos[f].ravel()
        band = clip.proj_band(int(f), 0.0)
        assert np.abs(fast[f, sure] - exact[f, sure]).max(initial=0.0) <= band
        assert np.abs(coef[f, sure] - exact[f, sure]).max(initial=0.0) <= band


# ---- the quantiles ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("big", [False, True])  # True: more than 2048 cells a frame (the bracketed selection)
def test_frame_quantiles_are_the_quantiles_of_the_exact_static_projections(seed, big):
    clip, cams, gz = random_clip(seed, (256, 192) if big else None)
    rng = np.random.default_rng(seed + 7)
    F, h4, w4 = len(cams), clip.h4, clip.w4
    weights = rng.integers(0, 17, size=(F, h4, w4))  # static pixels of each 4x4 cell
    weights[rng.random(weights.shape) < 0.2] = 0
    theta = float(rng.uniform(0, 2 * np.pi))
    xy = exact_points(clip, cams, gz)
    proj = xy[..., 0] * math.cos(theta) + xy[..., 1] * math.sin(theta)
    # p: random for odd seeds; for even ones p·W of frame 0 lands exactly on the weight up to one of its values
    p = float(rng.uniform(0.5, 0.95))
    seen = ~np.isnan(proj[0])
    if seed % 2 == 0 and weights[0][seen].sum() > 0:
        cum = np.cumsum(weights[0][seen][np.argsort(proj[0][seen], kind="stable")])
        p = float(cum[int(np.searchsorted(cum, 0.7 * cum[-1]))] / cum[-1])
    want = [weighted_quantile(proj[f][~np.isnan(proj[f])], weights[f][~np.isnan(proj[f])], p) for f in range(F)]
    hit_iv = clip.intervals(*clip.hit_function())
    frames = np.arange(F)
    assert frame_quantiles(clip, frames, theta, weights, hit_iv, p).tolist() == want
    # a lower bound below every quantile: the cells surely under it are counted, not sorted; the same values
    lower = min(want) - 1.0 if all(map(math.isfinite, want)) else -math.inf
    assert frame_quantiles(clip, frames, theta, weights, hit_iv, p, lower=lower).tolist() == want
    assert frame_quantiles(clip, frames[::-1], theta, weights, hit_iv, p).tolist() == want[::-1]


def test_a_frame_without_static_ground_has_an_infinite_quantile():
    clip, cams, _gz = random_clip(0)
    weights = np.zeros((len(cams), clip.h4, clip.w4), dtype=np.int64)
    got = frame_quantiles(clip, np.arange(len(cams)), 0.3, weights, clip.intervals(*clip.hit_function()), 0.5)
    assert np.isinf(got).all() and (got > 0).all()


# ---- the run helpers ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(5))
def test_runs_to_cells_and_row_sum_are_the_cells_and_weights_of_every_run(seed):
    rng = np.random.default_rng(seed)
    F, h4, w4 = 3, 4, 7
    a, b = rng.integers(0, w4 + 1, size=(2, F, h4))
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    cells = [(f * h4 + i) * w4 + j for f in range(F) for i in range(h4) for j in range(lo[f, i], hi[f, i])]
    assert runs_to_cells(lo, hi, w4).tolist() == cells
    w = rng.integers(0, 9, size=(F, h4, w4))
    cw = np.concatenate([np.zeros((F, h4, 1), dtype=np.int64), np.cumsum(w, 2)], 2)
    want = [sum(int(w[f, i, lo[f, i] : hi[f, i]].sum()) for i in range(h4)) for f in range(F)]
    assert row_sum(cw, lo, hi).tolist() == want
    assert row_sum(cw, hi, lo).tolist() == [0] * F  # an empty (reversed) run counts nothing
