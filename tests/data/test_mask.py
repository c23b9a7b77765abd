"""The world-anchored UNKNOWN mask (docs/design.md §6). CPU only, < 1 min. The per-sample draws that decide it:
tests/data/test_sample_rng.py."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gcc.data.mask import (
    STATS,
    MaskParams,
    apply_unknown_mask,
    cell_pixels,
    mask_ground_z,
    static_cell_counts,
    unknown_cells,
    weighted_quantile,
)
from gcc.geometry import Cameras, ground_points
from gcc.vocab import STATIC_MAX, UNKNOWN

try:
    from tests.mask_reference import quantile as ref_quantile
    from tests.mask_reference import reference_mask
except ImportError:  # tests/ itself on sys.path (pytest's rootdir-less import)
    from mask_reference import quantile as ref_quantile
    from mask_reference import reference_mask

STATICS = np.arange(7, dtype=np.uint8)
CHARS = np.arange(10, 22, dtype=np.uint8)


# ---- helpers -------------------------------------------------------------------------------------------
def cameras(
    n,
    hw,
    *,
    ortho,
    loc0=(0.0, 0.0, 600.0),
    vel=(8.0, 3.0, 0.0),
    rot=(-60.0, 30.0, 0.0),
    rot_vel=(0.0, 0.0, 0.0),
    fov=70.0,
    ortho_width=1000.0,
    src_hw=None,
):
    """UE cameras translating (and optionally turning) linearly over the clip."""
    t = np.arange(n, dtype=np.float64)[:, None]
    loc = np.asarray(loc0, dtype=np.float64) + t * np.asarray(vel, dtype=np.float64)
    rotation = np.asarray(rot, dtype=np.float64) + t * np.asarray(rot_vel, dtype=np.float64)
    src = src_hw or (hw[0] * 3 // 2, hw[1] * 3 // 2)
    return Cameras(loc, rotation, np.full(n, ortho), np.full(n, fov), np.full(n, ortho_width), src, hw)


def layout(rng, n, hw, *, char_frac=0.1, unknown_frac=0.03):
    """Blocky static classes with character blobs and some UNKNOWN pixels, different in every frame."""
    h, w = hw
    coarse = rng.choice(STATICS[:6], size=(n, h // 8 + 1, w // 8 + 1))
    ids = np.repeat(np.repeat(coarse, 8, 1), 8, 2)[:, :h, :w].copy()
    noise = rng.random((n, h, w))
    ids[noise < char_frac] = rng.choice(CHARS, size=int((noise < char_frac).sum()))
    ids[(noise >= char_frac) & (noise < char_frac + unknown_frac)] = UNKNOWN
    for f in range(n):  # a character blob that moves
        v0, u0 = rng.integers(0, h // 2), rng.integers(0, w // 2)
        ids[f, v0 : v0 + h // 4, u0 : u0 + w // 6] = rng.choice(CHARS)
    return ids.astype(np.uint8)


def random_case(seed):
    """A small random clip for fast == reference: ortho or perspective, any orientation, sky, NaN ground_z."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 6))
    hw = (int(rng.choice([16, 24, 32])), int(rng.choice([32, 48])))
    ortho = bool(rng.random() < 0.5)
    pitch = rng.uniform(-90, -50) if ortho else rng.uniform(-80, -5)  # shallow perspective shows sky
    cams = cameras(
        n,
        hw,
        ortho=ortho,
        loc0=(rng.uniform(-1e3, 1e3), rng.uniform(-1e3, 1e3), rng.uniform(100, 1200)),
        vel=rng.uniform(-60, 60, 3),
        rot=(pitch, rng.uniform(0, 360), rng.uniform(-20, 20)),
        rot_vel=rng.uniform(-2, 2, 3),
        fov=rng.uniform(40, 110),
        ortho_width=rng.uniform(300, 3000),
    )
    ids = layout(rng, n, hw, char_frac=rng.uniform(0, 0.3))
    gz = np.full(n, rng.uniform(-100, 100))
    r = rng.random()
    if r < 0.2:
        gz[0] = np.nan
        gz[rng.random(n) < 0.3] = np.nan
    elif r < 0.25:
        gz[:] = np.nan
    k = 1 if rng.random() < 0.6 else 2
    params = MaskParams(tuple(rng.uniform(0, 2 * np.pi, k)), tuple(rng.uniform(0.05, 0.4, k)))
    return ids, cams, gz, params, float(rng.uniform(0.05, 0.5))


def static_coverage(before, after):
    """Per frame: the fraction of static pixels that the mask set to 255."""
    st = before <= STATIC_MAX
    return ((after == UNKNOWN) & st).sum((1, 2)) / np.maximum(st.sum((1, 2)), 1)


# ---- fast == reference ---------------------------------------------------------------------------------
@pytest.mark.parametrize("calibration", ["frame0", "cap"])
def test_fast_equals_reference_on_many_seeds(calibration):
    kinds = set()
    for seed in range(40):
        ids, cams, gz, params, cap = random_case(seed)
        fast, frac = apply_unknown_mask(ids, cams, gz, params, calibration, cap)
        ref, count, thresholds = reference_mask(ids, cams, gz, params.thetas, params.qs, calibration, cap)
        assert np.array_equal(fast, ref), f"seed {seed}: {(fast != ref).sum()} pixels differ"
        assert frac == count / ids.size
        gzv = mask_ground_z(gz)
        if gzv is not None:
            _, taus = unknown_cells(cams, gzv, ids.shape[1:], params, static_cell_counts(ids), calibration, cap)
            assert np.array_equal(taus, np.array([thresholds[f] for f in range(len(ids))]))
        kinds.add((bool(cams.orthographic[0]), gzv is None, bool(np.isnan(gz[0])), 0 < frac))
    # the seeds cover: ortho and perspective, no-mask (all NaN) and NaN ground_z[0] fallbacks, real masks
    assert {k[0] for k in kinds} == {True, False} and any(k[1] for k in kinds) and any(k[2] and not k[1] for k in kinds)


def test_fast_equals_reference_on_exact_world_ties():
    """An orthographic camera moving by exactly one cell per frame sees the same world points again in later
    frames (exact ties with frame 0's τ cell, up to rounding): the decisions must still equal the reference."""
    hw = (32, 48)
    n = 5
    cell_cm = 4 * 960.0 / hw[1]  # ortho width 960 cm over 48 px: 80 cm per cell
    for seed, theta in enumerate([0.0, math.pi / 2, math.pi, 0.3, 1.9, 4.4]):
        rng = np.random.default_rng(100 + seed)
        cams = cameras(
            n,
            hw,
            ortho=True,
            loc0=(0.0, 0.0, 500.0),
            vel=(cell_cm, 0.0, 0.0),
            rot=(-90.0, 0.0, 0.0),
            ortho_width=960.0,
            src_hw=hw,
        )
        ids = layout(rng, n, hw, char_frac=0.05)
        params = MaskParams((theta,), (float(rng.uniform(0.05, 0.4)),))
        for cal in ("frame0", "cap"):
            fast, frac = apply_unknown_mask(ids, cams, np.zeros(n), params, cal, 0.2)
            ref, count, _ = reference_mask(ids, cams, np.zeros(n), params.thetas, params.qs, cal, 0.2)
            assert np.array_equal(fast, ref) and frac == count / ids.size


EDGE_CASES = [
    dict(hw=(4, 4), ortho=False, rot=(-40.0, 10.0, 0.0)),  # one cell per frame
    dict(hw=(4, 8), ortho=True, rot=(-70.0, 10.0, 0.0)),
    dict(hw=(16, 24), ortho=True, rot=(0.0, 30.0, 0.0)),  # horizontal orthographic view: all rays miss
    dict(hw=(16, 24), ortho=True, rot=(-0.001, 30.0, 0.0)),  # nearly horizontal: evaluated exactly
    dict(hw=(16, 24), ortho=False, rot=(0.0, 30.0, 0.0)),  # horizon across the middle
    dict(hw=(16, 24), ortho=False, rot=(-30.0, 30.0, 90.0)),  # rolled
    dict(hw=(16, 24), ortho=False, rot=(30.0, 30.0, 0.0), loc0=(0.0, 0.0, -200.0)),  # below, looking up
    dict(hw=(16, 24), ortho=False, rot=(-30.0, 30.0, 0.0), loc0=(0.0, 0.0, 0.0)),  # camera on the plane
    dict(hw=(16, 24), ortho=False, rot=(-89.999, 0.0, 0.0)),
]


@pytest.mark.parametrize("case", range(len(EDGE_CASES)))
def test_fast_equals_reference_on_edge_geometries(case):
    kw = dict(EDGE_CASES[case])
    hw = kw.pop("hw")
    n = 4
    cams = cameras(n, hw, **kw)
    for seed in range(3):
        rng = np.random.default_rng(10 * case + seed)
        ids = layout(rng, n, hw)
        k = 1 + seed % 2
        params = MaskParams(tuple(rng.uniform(0, 2 * np.pi, k)), tuple(rng.uniform(0.05, 0.4, k)))
        gz = np.full(n, 37.0 if seed == 0 else 0.0)
        for cal in ("frame0", "cap"):
            fast, frac = apply_unknown_mask(ids, cams, gz, params, cal, 0.2)
            ref, count, _ = reference_mask(ids, cams, gz, params.thetas, params.qs, cal, 0.2)
            assert np.array_equal(fast, ref) and frac == count / ids.size


@pytest.mark.parametrize("ortho", [True, False])
def test_cap_bracketed_quantiles_equal_reference(ortho):
    """`cap` on a clip big enough for the bracketed quantile path (coarse estimate, exact counts, sort of
    the bracket only): still equal to the reference, and the path is really taken."""
    n, hw = 10, (64, 128)
    cams = cameras(
        n,
        hw,
        ortho=ortho,
        loc0=(0.0, 0.0, 500.0),
        vel=(40.0, 10.0, 0.0),
        rot=(-70.0, 5.0, 0.0),
        ortho_width=1000.0,
        fov=70.0,
    )
    rng = np.random.default_rng(31 + ortho)
    ids = layout(rng, n, hw)
    params = MaskParams((0.1, 5.8), (0.3, 0.2))
    before = STATS["cap_bracketed"]
    fast, frac = apply_unknown_mask(ids, cams, np.zeros(n), params, "cap", 0.25)
    assert STATS["cap_bracketed"] > before
    ref, count, _ = reference_mask(ids, cams, np.zeros(n), params.thetas, params.qs, "cap", 0.25)
    assert np.array_equal(fast, ref) and frac == count / ids.size


def test_error_bounds_hold_no_fallback():
    """The closed-form quantile never needs its whole-frame fallback on varied clips (the float error
    bounds hold), and only a small share of cells is decided by geometry.ground_points."""
    before = dict(STATS)
    cells = 0
    for seed in range(20):
        ids, cams, gz, params, cap = random_case(500 + seed)
        gz[:] = 0.0
        apply_unknown_mask(ids, cams, gz, params, "cap", cap)
        cells += ids.size // 16
    assert STATS["fallback_frames"] == before["fallback_frames"]
    assert STATS["exact_cells"] - before["exact_cells"] < 0.2 * cells


def test_single_pixel_ground_points_equal_batched():
    """The exactness argument relies on geometry.ground_points giving bitwise the same point for a pixel
    whatever the batch it is computed in (the reference calls it one pixel at a time)."""
    rng = np.random.default_rng(5)
    for ortho in (False, True):
        cams = cameras(3, (32, 48), ortho=ortho, rot=(-40.0, 70.0, 5.0))
        pix = cell_pixels((32, 48))
        batch = ground_points(cams, pix, 12.5)
        for f, p in zip(rng.integers(0, 3, 30), rng.integers(0, len(pix), 30)):
            one = ground_points(cams[int(f)], pix[p : p + 1], 12.5)[0, 0]
            assert np.array_equal(one, batch[f, p], equal_nan=True)


# ---- world anchoring -----------------------------------------------------------------------------------
@pytest.mark.parametrize("ortho", [True, False])
def test_world_anchored_half_planes(ortho):
    """At static pixels, mask == the world half-plane test for ground points > 60 cm from every boundary."""
    n, hw = 21, (96, 160)
    if ortho:  # 5 cm per pixel, 20 cm cells
        cams = cameras(
            n, hw, ortho=True, loc0=(0.0, 0.0, 800.0), vel=(9.0, 4.0, 0.0), rot=(-75.0, 20.0, 0.0), ortho_width=800.0
        )
    else:  # reversed-Z perspective, steep enough that a cell's footprint stays < 30 cm
        cams = cameras(
            n, hw, ortho=False, loc0=(0.0, 0.0, 400.0), vel=(7.0, -3.0, 0.0), rot=(-65.0, 10.0, 0.0), fov=60.0
        )
    rng = np.random.default_rng(7 + ortho)
    ids = layout(rng, n, hw, char_frac=0.05)
    gz = np.full(n, 15.0)
    params = MaskParams((0.4, 2.6), (0.25, 0.2))
    out, _ = apply_unknown_mask(ids, cams, gz, params)
    _, taus = unknown_cells(cams, 15.0, hw, params, static_cell_counts(ids[:1]))
    # world ground points over the swept area
    xy0 = ground_points(cams, cell_pixels(hw), 15.0).reshape(-1, 2)
    lo, hi = np.nanmin(xy0, 0), np.nanmax(xy0, 0)
    pts = rng.uniform(lo, hi, size=(30000, 2))
    proj = np.stack([pts @ [math.cos(t), math.sin(t)] for t in params.thetas], 1)  # [P, K]
    far = (np.abs(proj - taus[0]) > 60.0).all(1)
    pts, beyond = pts[far], (proj[far] > taus[0]).any(1)
    world = np.c_[pts, np.full(len(pts), 15.0)]
    uv, fwd, _ = cams.project(world)
    seen = np.zeros(len(pts), dtype=int)
    checked = 0
    for f in range(n):
        ok = np.isfinite(uv[f]).all(1) & (fwd[f] > 0)
        u, v = np.floor(uv[f, :, 0]), np.floor(uv[f, :, 1])
        ok &= (u >= 0) & (u < hw[1]) & (v >= 0) & (v < hw[0])
        iu, iv = u[ok].astype(int), v[ok].astype(int)
        static = ids[f, iv, iu] <= STATIC_MAX
        masked = out[f, iv, iu] == UNKNOWN
        assert np.array_equal(masked[static], beyond[ok][static]), f"frame {f}"
        seen[np.flatnonzero(ok)[static]] += 1
        checked += int(static.sum())
    multi = seen >= 3
    assert multi.sum() > 500
    assert beyond[multi].sum() > 50 and (~beyond[multi]).sum() > 50  # both sides are exercised
    # the clip moves: pixels change class over time, yet the same world points keep their decision
    assert checked > 5000


# ---- invariants ----------------------------------------------------------------------------------------
def test_characters_untouched_and_only_statics_become_unknown():
    for seed in range(6):
        ids, cams, gz, params, cap = random_case(200 + seed)
        gz[:] = 0.0
        before = ids.copy()
        out, frac = apply_unknown_mask(ids, cams, gz, params, "cap" if seed % 2 else "frame0", cap)
        assert np.array_equal(ids, before)  # inplace=False leaves the input alone
        changed = out != ids
        assert changed.any()
        assert np.array_equal(out[ids > STATIC_MAX], ids[ids > STATIC_MAX])  # characters and 255 kept
        assert (ids[changed] <= STATIC_MAX).all() and (out[changed] == UNKNOWN).all()
        assert frac == changed.sum() / ids.size


def test_inplace_modifies_and_returns_the_input():
    ids, cams, gz, params, _ = random_case(3)
    gz[:] = 0.0
    copy_out, frac = apply_unknown_mask(ids, cams, gz, params)
    buf = ids.copy()
    same, frac2 = apply_unknown_mask(buf, cams, gz, params, inplace=True)
    assert same is buf and np.array_equal(buf, copy_out) and frac == frac2


@pytest.mark.parametrize("seed", range(4))
def test_coverage_one_and_two_planes(seed):
    """Top-down camera, no NaN: frame-0 static coverage is within 0.01 of q (one plane) and in
    [max q, Σq] (two planes). Quantisation: a cell's static pixels share one decision, so the coverage can
    fall short of q by < 16 / (number of static pixels) (the inverted-CDF quantile never exceeds q)."""
    rng = np.random.default_rng(300 + seed)
    n, hw = 3, (96, 160)
    cams = cameras(n, hw, ortho=bool(seed % 2), loc0=(0.0, 0.0, 700.0), rot=(-88.0, rng.uniform(0, 360), 0.0))
    ids = layout(rng, n, hw)
    gz = np.zeros(n)
    quantum = 16 / (ids[0] <= STATIC_MAX).sum()
    q1 = float(rng.uniform(0.05, 0.4))
    one = MaskParams((float(rng.uniform(0, 2 * np.pi)),), (q1,))
    out, _ = apply_unknown_mask(ids, cams, gz, one)
    cov = static_coverage(ids, out)[0]
    assert abs(cov - q1) <= 0.01 and q1 - quantum < cov <= q1 + 1e-12
    qs = tuple(float(q) for q in rng.uniform(0.05, 0.4, 2))
    two = MaskParams(tuple(float(t) for t in rng.uniform(0, 2 * np.pi, 2)), qs)
    out2, _ = apply_unknown_mask(ids, cams, gz, two)
    cov2 = static_coverage(ids, out2)[0]
    assert max(qs) - quantum < cov2 <= sum(qs) + 1e-12


def test_nan_ground_points_are_masked():
    """A shallow perspective camera sees sky: static pixels whose cell ray misses the ground are 255."""
    n, hw = 4, (48, 80)
    cams = cameras(n, hw, ortho=False, loc0=(0.0, 0.0, 300.0), rot=(-8.0, 45.0, 0.0), fov=90.0)
    rng = np.random.default_rng(11)
    ids = layout(rng, n, hw, char_frac=0.1)
    out, _ = apply_unknown_mask(ids, cams, np.zeros(n), MaskParams((1.0,), (0.1,)))
    _, dirs = cams.rays(cell_pixels(hw))
    miss = (dirs[..., 2] >= 0).reshape(n, hw[0] // 4, hw[1] // 4)
    miss_px = np.repeat(np.repeat(miss, 4, 1), 4, 2)
    assert miss_px.mean() > 0.2
    st = ids <= STATIC_MAX
    assert (out[miss_px & st] == UNKNOWN).all()
    assert np.array_equal(out[miss_px & ~st], ids[miss_px & ~st])


def test_ground_z_fallbacks():
    ids, cams, _, params, _ = random_case(8)
    n = len(ids)
    assert n >= 3
    # ground_z[0] NaN -> the nanmedian of ground_z (NaN entries ignored)
    gz = np.full(n, np.nan)
    gz[1:3] = (10.0, 70.0)
    gz[3:] = 40.0
    med = float(np.median(gz[1:]))
    a, fa = apply_unknown_mask(ids, cams, gz, params)
    b, fb = apply_unknown_mask(ids, cams, np.full(n, med), params)
    assert fa > 0 and np.array_equal(a, b) and fa == fb
    assert mask_ground_z(gz) == med and mask_ground_z([5.0, np.nan]) == 5.0
    # no finite ground_z -> no mask, the ids unchanged (a copy, or the same array with inplace)
    bad = np.full(n, np.nan)
    out, frac = apply_unknown_mask(ids, cams, bad, params)
    assert frac == 0.0 and np.array_equal(out, ids) and out is not ids
    buf = ids.copy()
    out2, frac2 = apply_unknown_mask(buf, cams, bad, params, inplace=True)
    assert out2 is buf and frac2 == 0.0 and np.array_equal(buf, ids)


@pytest.mark.parametrize("ortho", [True, False])
def test_cap_bounds_every_frame(ortho):
    """`cap`: per plane, every frame's static coverage <= max_frame_coverage (exactly: the inverted-CDF
    quantile leaves at most that share beyond τ_f; no NaN here, so no extra tolerance); frames where
    `frame0` stays within the cap are identical; `frame0` does exceed it somewhere (the cap acts)."""
    n, hw = 25, (64, 96)
    cams = cameras(
        n,
        hw,
        ortho=ortho,
        loc0=(0.0, 0.0, 500.0),
        vel=(25.0, 0.0, 0.0),
        rot=(-80.0, 0.0, 0.0),
        ortho_width=900.0,
        fov=70.0,
    )
    rng = np.random.default_rng(21 + ortho)
    ids = layout(rng, n, hw)
    gz = np.zeros(n)
    cap = 0.3
    for theta in (0.0, 0.5, 5.9):  # planes facing the direction of travel: coverage grows under frame0
        params = MaskParams((theta,), (0.25,))
        f0, _ = apply_unknown_mask(ids, cams, gz, params, "frame0")
        capped, _ = apply_unknown_mask(ids, cams, gz, params, "cap", cap)
        cov0, covc = static_coverage(ids, f0), static_coverage(ids, capped)
        assert (covc <= cap + 1e-9).all()
        assert (cov0 > cap).any()
        within = cov0 <= cap
        assert np.array_equal(f0[within], capped[within])
        assert (covc <= cov0 + 1e-12).all()  # τ_f >= τ: the cap only unmasks
    # two planes: each plane is capped on its own (the design's formula), so the union is <= 2·cap
    two = MaskParams((0.2, 6.0), (0.25, 0.2))
    capped, _ = apply_unknown_mask(ids, cams, gz, two, "cap", cap)
    assert (static_coverage(ids, capped) <= 2 * cap + 1e-9).all()


# ---- pieces --------------------------------------------------------------------------------------------
def test_weighted_quantile_is_the_per_pixel_quantile():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 60))
        values = np.round(rng.normal(size=n), int(rng.integers(0, 3)))  # ties
        weights = rng.integers(0, 17, n)
        p = float(rng.choice([rng.random(), 0.5, 0.0, 1.0]))
        pixels = list(np.repeat(values, weights))
        got = weighted_quantile(values, weights, p)
        assert got == ref_quantile(pixels, p)
        if pixels:  # weight beyond the quantile <= (1 - p)·W
            assert weights[values > got].sum() <= (1 - p) * weights.sum() + 1e-9
    assert weighted_quantile(np.array([1.0]), np.array([0]), 0.5) == math.inf


def test_static_cell_counts():
    rng = np.random.default_rng(1)
    ids = rng.choice(np.array([0, 3, 6, 7, 10, 21, 255], np.uint8), size=(3, 16, 24))
    want = (ids <= STATIC_MAX).reshape(3, 4, 4, 6, 4).sum((2, 4))
    assert np.array_equal(static_cell_counts(ids), want)


def test_bad_inputs_are_refused():
    ids, cams, gz, params, _ = random_case(1)
    with pytest.raises(ValueError):
        apply_unknown_mask(ids.astype(np.int16), cams, gz, params)
    with pytest.raises(ValueError):
        apply_unknown_mask(ids[:, :-1], cams, gz, params)
    with pytest.raises(ValueError):
        apply_unknown_mask(ids, cams, gz, params, calibration="mean")
    with pytest.raises(ValueError):
        MaskParams((0.1, 0.2), (0.1,))
