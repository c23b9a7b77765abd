"""The pooled-grid machinery of the UNKNOWN mask (docs/design.md §6), shared by gcc/data/mask.py (the mask
itself, `frame0`) and gcc/data/mask_cap.py (the `cap` calibration): the mask's parameters (`MaskParams`), the
4×4 cell grid (`CELL`, `cell_pixels`), the quantile definition (`weighted_quantile`), the per-frame affine
row-run machinery on that grid (`ClipGrid`: sure/ambiguous runs of the hit and plane tests, closed-form
projections with their error bounds, exact `geometry.ground_points` for the cells that need it), the run
helpers (`runs_to_cells`, `row_sum`), the exact per-frame quantiles (`frame_quantiles`), the cap batch size
(`CHUNK`) and the diagnostic counters (`STATS`). gcc/data/mask.py documents the definitions and how the
machinery makes them fast; this module depends on neither of the other two.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gcc.geometry import Cameras, ground_points, pixel_grid, rotation_axes

CELL = 4  # pooled grid stride (pixels)

_EPS = float(np.finfo(np.float64).eps)
_SAFETY = 1e4  # margin of the error bounds over the derived constants
CHUNK = 8  # frames per batch in the cap quantiles
# counters (per process) for tests and diagnostics: cells decided with geometry.ground_points, and frames
# whose quantile needed the whole-frame fallback (0 whenever the error bounds hold)
STATS = {"exact_cells": 0, "fallback_frames": 0, "cap_bracketed": 0, "cap_sorted": 0}
_DELTA = 1e-4  # rays with |D_z| < _DELTA·|D|max (near the horizon) are always evaluated exactly


@dataclass(frozen=True)
class MaskParams:
    """The mask's random parameters: one (θ, q) per half-plane. θ in radians (world XY), q in (0, 1)."""

    thetas: tuple[float, ...]
    qs: tuple[float, ...]

    def __post_init__(self):
        if len(self.thetas) != len(self.qs) or not self.thetas:
            raise ValueError(f"need >= 1 plane and as many thetas as qs, got {self.thetas}, {self.qs}")
        if not all(0.0 < q < 1.0 for q in self.qs):
            raise ValueError(f"q must be in (0, 1), got {self.qs}")

    @property
    def n_planes(self) -> int:
        return len(self.thetas)


def weighted_quantile(values: np.ndarray, weights: np.ndarray, p: float) -> float:
    """Inverted-CDF (lower, no interpolation) quantile of a population given as values with integer weights.

    Sort the values ascending, v_1 ≤ … ≤ v_n, with cumulative weights C_k = w_1 + … + w_k and total C_n = W.
    With t = p · W (float64, computed as ``p * float(W)``) the quantile is v_k for the smallest k with
    C_k ≥ t (k = 1 when t ≤ C_1). For a per-pixel population (every weight 1) this is the value at sorted
    position max(1, ceil(p·n)): cells weighted by their number of static pixels give exactly the quantile of
    the pixels. Consequence: the weight of values > quantile is ≤ (1 − p)·W. Returns +inf for an empty
    population (nothing can lie beyond +inf)."""
    values = np.asarray(values, dtype=np.float64)
    weights = np.asarray(weights)
    keep = weights > 0
    values, weights = values[keep], weights[keep]
    if values.size == 0:
        return math.inf
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(weights[order], dtype=np.int64)
    t = p * float(cum[-1])
    k = min(int(np.searchsorted(cum, t, side="left")), values.size - 1)
    return float(values[order[k]])


def cell_pixels(hw: Sequence[int]) -> np.ndarray:
    """dst pixels (u, v) [h4·w4, 2] of the pooled cells, row-major: cell (i, j) -> (4j+2, 4i+2)."""
    return pixel_grid(hw, CELL, CELL // 2)


# ---- per-frame affine machinery ------------------------------------------------------------------------
class ClipGrid:
    """Per-frame camera quantities on the pooled grid (all float64, as geometry computes them)."""

    def __init__(self, cameras: Cameras, hw: tuple[int, int], gz: float):
        h, w = hw
        self.cameras, self.gz = cameras, gz
        self.h4, self.w4 = h // CELL, w // CELL
        self.pix = cell_pixels(hw)
        axes = rotation_axes(cameras.rotation)
        self.fwd, self.right, self.up = axes[:, 0], axes[:, 1], axes[:, 2]  # [F, 3]
        self.half_w, self.half_h = cameras.image_plane_half_extents()
        cols = np.stack([np.arange(self.w4) * CELL + CELL // 2, np.zeros(self.w4)], -1)
        rows = np.stack([np.zeros(self.h4), np.arange(self.h4) * CELL + CELL // 2], -1)
        self.ndcx = cameras.dst_to_ndc(cols)[:, 0]  # [w4] increasing
        self.ndcy = cameras.dst_to_ndc(rows)[:, 1]  # [h4]
        self.b = self.half_h[:, None] * self.ndcy[None, :]  # [F, h4]
        self.ortho = np.asarray(cameras.orthographic, dtype=bool)
        self.L = cameras.location
        self.hgt = gz - self.L[:, 2]  # [F]
        self.dmax = np.where(self.ortho, 1.0, np.sqrt(1.0 + self.half_w**2 + self.half_h**2))
        fz = self.fwd[:, 2]
        # perspective: a lower bound of |D_z| over the sure-hit cells (corners when no horizon is in view)
        a_c = self.half_w[:, None] * self.ndcx[[0, -1]][None]  # [F, 2]
        b_c = self.b[:, [0, -1]]  # [F, 2]
        dz_c = (
            fz[:, None, None]
            + self.up[:, 2, None, None] * b_c[:, :, None]
            + self.right[:, 2, None, None] * a_c[:, None, :]
        )
        same = (dz_c > 0).all((1, 2)) | (dz_c < 0).all((1, 2))
        self.dzmin = np.where(
            same, np.maximum(np.abs(dz_c).min((1, 2)) * (1 - 1e-9), _DELTA * self.dmax), _DELTA * self.dmax
        )
        # orthographic frames with a (near) horizontal view: evaluate the whole frame exactly
        self.frame_exact = self.ortho & (np.abs(fz) < _DELTA)
        with np.errstate(divide="ignore", invalid="ignore"):
            self.inv_fz = np.where(self.frame_exact, 0.0, 1.0 / np.where(fz == 0, 1.0, fz))

    # each affine function of a row is g(j) = g0[f, i] + gx[f] · ndcx[j], with a tolerance tol[f]
    def hit_function(self):
        fz, rz, uz = self.fwd[:, 2], self.right[:, 2], self.up[:, 2]
        sh = np.sign(self.hgt)
        # perspective: hit <=> sign(h)·D_z > 0, near-horizon |D_z| <= δ·|D|max is ambiguous (exact)
        g0_p = sh[:, None] * (fz[:, None] + uz[:, None] * self.b)
        gx_p = sh * rz * self.half_w
        tol_p = _DELTA * self.dmax
        # orthographic: hit <=> sign(f_z)·(h − a·r_z − b·u_z) > 0
        so = np.sign(fz)
        g0_o = so[:, None] * (self.hgt[:, None] - uz[:, None] * self.b)
        gx_o = -so * rz * self.half_w
        tol_o = _SAFETY * 8 * _EPS * (np.abs(self.L[:, 2]) + abs(self.gz) + self.half_w + self.half_h)
        o = self.ortho
        g0 = np.where(o[:, None], g0_o, g0_p)
        gx = np.where(o, gx_o, gx_p)
        tol = np.where(o, tol_o, tol_p)
        # a camera exactly on the plane (perspective) sees t = 0 everywhere: all miss, nothing ambiguous
        none = (~o) & (self.hgt == 0)
        g0[none], gx[none], tol[none] = -1.0, 0.0, 0.0
        return g0, gx, tol

    def plane_function(self, theta: float, tau: np.ndarray):
        """Beyond the plane (proj > tau[f]) <=> g > 0, valid on cells that hit the ground."""
        c, s = math.cos(theta), math.sin(theta)
        th = lambda v: v[:, 0] * c + v[:, 1] * s  # noqa: E731
        Lt, ft, rt, ut = th(self.L), th(self.fwd), th(self.right), th(self.up)
        fz, rz, uz = self.fwd[:, 2], self.right[:, 2], self.up[:, 2]
        lxy = np.abs(self.L[:, 0]) + np.abs(self.L[:, 1])
        finite = np.isfinite(tau)
        taum = np.where(finite, tau, 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            # perspective: proj − τ = h·(D_θ − k·D_z)/D_z with k = (τ − L_θ)/h
            hsafe = np.where(self.hgt == 0, 1.0, self.hgt)
            k = (taum - Lt) / hsafe
            g0_p = (ft - k * fz)[:, None] + (ut - k * uz)[:, None] * self.b
            gx_p = (rt - k * rz) * self.half_w
            dm = self.dmax
            tol_p = (
                _SAFETY
                * 8
                * _EPS
                * (dm * (dm / self.dzmin + 2.0 + np.abs(k)) + 2.0 * (lxy + np.abs(taum)) * dm / np.abs(hsafe))
            )
            # orthographic: proj − τ = (L_θ − τ + r·h) + a·(r_θ − r·r_z) + b·(u_θ − r·u_z), r = f_θ / f_z
            r = ft * self.inv_fz
            g0_o = (Lt - taum + r * self.hgt)[:, None] + (ut - r * uz)[:, None] * self.b
            gx_o = (rt - r * rz) * self.half_w
            tol_o = (
                _SAFETY
                * 8
                * _EPS
                * (
                    lxy
                    + np.abs(self.L[:, 2])
                    + abs(self.gz)
                    + np.abs(taum)
                    + (self.half_w + self.half_h) * (1.0 + 2.0 * np.abs(self.inv_fz))
                    + 2.0 * np.abs(self.hgt * self.inv_fz)
                )
            )
        o = self.ortho
        g0 = np.where(o[:, None], g0_o, g0_p)
        gx = np.where(o, gx_o, gx_p)
        tol = np.where(o, tol_o, tol_p)
        off = ~finite | ((~o) & (self.hgt == 0))  # τ = +inf: nothing is beyond; camera on the plane: all miss
        g0[off], gx[off], tol[off] = -1.0, 0.0, 0.0
        return g0, gx, tol

    def _count_below(self, x: np.ndarray, right: bool) -> np.ndarray:
        """#{j: ndcx_j < x} (or <= x when `right`), from ndcx_j ≈ α + β·j. Off by one only where ndcx_j ≈ x,
        i.e. at |g| ≈ tol, where either side of the split is a correct classification."""
        w4, ndcx = self.w4, self.ndcx
        beta = (ndcx[-1] - ndcx[0]) / (w4 - 1) if w4 > 1 else 1.0
        with np.errstate(invalid="ignore", over="ignore"):
            r = (x - ndcx[0]) / beta
            r = np.floor(r) + 1.0 if right else np.ceil(r)
        return np.clip(np.nan_to_num(r, nan=0.0), 0, w4).astype(np.int64)

    def intervals(self, g0, gx, tol):
        """Per row: sure-positive run [lo, hi) and ambiguous run [alo, ahi) of cell columns, int64 [F, h4],
        and sign(gx) [F]: −1 for the frames whose g decreases along a row (their sure-positive runs are
        prefixes, the others' suffixes), 0 where g is constant along rows."""
        w4 = self.w4
        gxx, tl = gx[:, None], tol[:, None]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            xp = (tl - g0) / gxx
            xn = (-tl - g0) / gxx
        inc = np.broadcast_to(gxx > 0, g0.shape)
        dec = np.broadcast_to(gxx < 0, g0.shape)
        p_r, p_l = self._count_below(xp, True), self._count_below(xp, False)
        n_r, n_l = self._count_below(xn, True), self._count_below(xn, False)
        flat_pos = g0 > tl
        flat_amb = np.abs(g0) <= tl
        lo = np.where(inc, p_r, np.where(dec | flat_pos, 0, w4))
        hi = np.where(dec, p_l, w4)
        alo = np.where(inc, n_l, np.where(dec, p_l, 0))
        ahi = np.where(inc, p_r, np.where(dec, n_r, np.where(flat_amb, w4, 0)))
        fe = self.frame_exact
        if fe.any():
            alo[fe], ahi[fe] = 0, w4
        return lo, hi, alo, np.maximum(ahi, alo), np.sign(gx)

    def positive_cells(self, iv, out: np.ndarray, negate: bool = False) -> np.ndarray:
        """Sure-positive cells bool [F, h4, w4] of intervals `iv` (or their complement with `negate`)."""
        lo, hi, _, _, sgn = iv
        dec = sgn < 0
        J = np.arange(self.w4, dtype=np.int16)
        js = np.where(dec[:, None, None], -J, J).astype(np.int16)  # [F, 1, w4]
        thr = np.where(dec[:, None], 1 - hi, lo).astype(np.int16)[..., None]  # suffix: j >= lo; prefix: -j >= 1-hi
        return (np.less if negate else np.greater_equal)(js, thr, out=out)

    def fast_projections(self, frames: np.ndarray, theta: float) -> np.ndarray:
        """Projections of all cells of the given frames [K, P] by the closed form (error <= `proj_band`):
        orthographic: row term + column term; perspective: (row + column) / (row + column) with
        proj = L_θ + h·D_θ/D_z folded into one numerator, (L_θ·D_z + h·D_θ) / D_z."""
        c, s = math.cos(theta), math.sin(theta)
        out = np.empty((len(frames), self.h4, self.w4))
        th = lambda v: v[:, 0] * c + v[:, 1] * s  # noqa: E731
        for ortho in (True, False):
            sel = np.flatnonzero(self.ortho[frames] == ortho)
            if sel.size == 0:
                continue
            f = frames[sel]
            L, fw, rg, up, h = self.L[f], self.fwd[f], self.right[f], self.up[f], self.hgt[f]
            a = self.half_w[f][:, None] * self.ndcx[None]  # [k, w4]
            b = self.b[f]  # [k, h4]
            if ortho:
                r = th(fw) * self.inv_fz[f]
                row = (th(L) + r * h)[:, None] + (th(up) - r * up[:, 2])[:, None] * b
                col = (th(rg) - r * rg[:, 2])[:, None] * a
                out[sel] = row[:, :, None] + col[:, None, :]
            else:
                lt = th(L)[:, None]
                hh = h[:, None]
                zr = fw[:, 2, None] + up[:, 2, None] * b  # D_z row part
                zc = rg[:, 2, None] * a  # D_z column part
                nr = lt * zr + hh * (th(fw)[:, None] + th(up)[:, None] * b)
                nc = lt * zc + hh * (th(rg)[:, None] * a)
                num = nr[:, :, None] + nc[:, None, :]
                den = zr[:, :, None] + zc[:, None, :]
                with np.errstate(divide="ignore", invalid="ignore"):
                    np.divide(num, den, out=num)
                out[sel] = num
        return out.reshape(len(frames), -1)

    def projection_coefficients(self, frames: np.ndarray, theta: float):
        """Per frame (n0, nb, na, d0, db, da): proj = (n0 + nb·b + na·a) / (d0 + db·b + da·a) on hit cells
        (orthographic: d = 1), the same closed form as `fast_projections` (error <= `proj_band`)."""
        c, s = math.cos(theta), math.sin(theta)
        th = lambda v: v[:, 0] * c + v[:, 1] * s  # noqa: E731
        L, fw, rg, up, h = self.L[frames], self.fwd[frames], self.right[frames], self.up[frames], self.hgt[frames]
        lt = th(L)
        r = th(fw) * self.inv_fz[frames]
        o = self.ortho[frames]
        n0 = np.where(o, lt + r * h, lt * fw[:, 2] + h * th(fw))
        nb = np.where(o, th(up) - r * up[:, 2], lt * up[:, 2] + h * th(up))
        na = np.where(o, th(rg) - r * rg[:, 2], lt * rg[:, 2] + h * th(rg))
        d0 = np.where(o, 1.0, fw[:, 2])
        db = np.where(o, 0.0, up[:, 2])
        da = np.where(o, 0.0, rg[:, 2])
        return n0, nb, na, d0, db, da

    def proj_band(self, f: int, tau_abs: float) -> float:
        """Upper bound (with margin) of |fast − exact| projection for non-ambiguous cells of frame f."""
        lxy = abs(self.L[f, 0]) + abs(self.L[f, 1])
        if self.ortho[f]:
            return float(
                _SAFETY
                * 8
                * _EPS
                * (
                    lxy
                    + abs(self.L[f, 2])
                    + abs(self.gz)
                    + tau_abs
                    + (self.half_w[f] + self.half_h[f]) * (1 + 2 * abs(self.inv_fz[f]))
                    + 2 * abs(self.hgt[f] * self.inv_fz[f])
                )
            )
        ratio = self.dmax[f] / self.dzmin[f]  # <= 1/δ: |D|/|D_z| over the sure-hit cells
        return float(_SAFETY * 8 * _EPS * (lxy + tau_abs + abs(self.hgt[f]) * ratio * (ratio + 2.0)))

    def exact_xy(self, frames: np.ndarray, cells: np.ndarray) -> np.ndarray:
        """geometry.ground_points of the given (frame, cell) pairs [n] -> [n, 2] (the definition itself)."""
        out = np.empty((len(frames), 2))
        if len(frames) == 0:
            return out
        STATS["exact_cells"] += len(frames)
        uf, finv = np.unique(frames, return_inverse=True)
        uc, cinv = np.unique(cells, return_inverse=True)
        if uf.size * uc.size <= 1 << 17:  # one call on (frames × pixels): same per-element arithmetic
            return ground_points(self.cameras[uf], self.pix[uc], self.gz)[finv, cinv]
        order = np.argsort(frames, kind="stable")
        fs = frames[order]
        starts = np.flatnonzero(np.r_[True, fs[1:] != fs[:-1]])
        ends = np.r_[starts[1:], len(fs)]
        for a, e in zip(starts, ends):
            sel = order[a:e]
            out[sel] = ground_points(self.cameras[int(fs[a])], self.pix[cells[sel]], self.gz)[0]
        return out


def runs_to_cells(alo: np.ndarray, ahi: np.ndarray, w4: int) -> np.ndarray:
    """Flat cell indices (f·h4·w4 + i·w4 + j) of all runs [alo, ahi) of every row."""
    n = (ahi - alo).ravel()
    if not n.any():
        return np.zeros(0, dtype=np.int64)
    rows = np.repeat(np.arange(n.size), n)
    start = np.repeat(alo.ravel(), n)
    offs = np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n)
    return rows * w4 + start + offs


def row_sum(cw: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Sum of weights over [lo, hi) of every row from row prefix sums cw [F, h4, w4+1] -> [F]."""
    hi = np.maximum(hi, lo)
    d = np.take_along_axis(cw, hi[..., None], 2) - np.take_along_axis(cw, lo[..., None], 2)
    return d[..., 0].sum(1, dtype=np.int64)


def frame_quantiles(
    clip: ClipGrid, frames: np.ndarray, theta: float, weights: np.ndarray, hit_iv, p: float, lower: float = -math.inf
) -> np.ndarray:
    """Exact :func:`weighted_quantile` at p of the static finite projections of each frame in `frames`
    (+inf for a frame without any). weights: [F, h4, w4]; hit_iv: the hit intervals of all frames.

    `lower` must lie below the quantiles: cells surely below it are counted, not sorted. The closed-form
    projections (error <= band) pick a candidate v; the true quantile is within band of v (order statistics
    move by at most the perturbation), so recomputing the cells within 2·band of v with
    geometry.ground_points (one batched call for all frames) and taking the quantile among them gives the
    exact value."""
    P = clip.h4 * clip.w4
    c, s = math.cos(theta), math.sin(theta)
    frames = np.asarray(frames, dtype=np.int64)
    out = np.full(len(frames), math.inf)
    if frames.size == 0:
        return out
    vals, exact = _hit_projections(clip, frames, theta, hit_iv)
    wf_all = weights[frames].reshape(len(frames), P)
    stat = (wf_all > 0) & ~np.isnan(vals)
    wst = np.where(stat, wf_all, 0)
    W_all = wst.sum(1, dtype=np.int64)
    lower_abs = abs(lower) if math.isfinite(lower) else 0.0
    bands = np.array([clip.proj_band(int(f), lower_abs) for f in frames])
    with np.errstate(invalid="ignore"):
        cand = stat & (vals > (lower - 2 * bands)[:, None])
    base_all = W_all - np.where(cand, wf_all, 0).sum(1, dtype=np.int64)  # surely below `lower`
    state: list[tuple[np.ndarray, int, float] | None] = []
    todo_f, todo_c = [], []
    for n in range(len(frames)):
        W, band, base = int(W_all[n]), float(bands[n]), int(base_all[n])
        idx = np.flatnonzero(cand[n])
        if W == 0 or idx.size == 0:
            state.append(None)
            continue
        t = p * float(W)
        vi, wi = vals[n, idx], wf_all[n, idx]
        v = _candidate(vi, wi, t - base)
        near_m = np.abs(vi - v) <= 2 * band
        near = idx[near_m]
        below = base + int(wi[(vi < v) & ~near_m].sum())
        state.append((near, below, t))
        todo = near[~exact[n, near]]
        todo_f.append(np.full(todo.size, n))
        todo_c.append(todo)
    if todo_f:
        tf, tc = np.concatenate(todo_f), np.concatenate(todo_c)
        if tf.size:
            xy = clip.exact_xy(frames[tf], tc)
            vals[tf, tc] = xy[:, 0] * c + xy[:, 1] * s
    for n, st in enumerate(state):
        if st is None:
            if int(wf_all[n][(wf_all[n] > 0) & ~np.isnan(vals[n])].sum()) == 0:
                continue  # empty population: +inf
        else:
            near, below, t = st
            nv = vals[n, near]
            if not np.isnan(nv).any():
                o = np.argsort(nv, kind="stable")
                cum2 = below + np.cumsum(wf_all[n, near][o])
                k2 = int(np.searchsorted(cum2, t, side="left"))
                if k2 < o.size:
                    out[n] = nv[o[k2]]
                    continue
        # not reached when the error bounds hold: the exact frame
        out[n] = _whole_frame_quantile(clip, int(frames[n]), c, s, wf_all[n], p)
    return out


def _hit_projections(clip: ClipGrid, frames: np.ndarray, theta: float, hit_iv) -> tuple[np.ndarray, np.ndarray]:
    """(vals, exact) [len(frames), h4·w4]: the closed-form projections of the frames' sure-hit cells (NaN
    elsewhere), the ambiguous-hit cells' computed exactly (exact True there)."""
    h4, w4, P = clip.h4, clip.w4, clip.h4 * clip.w4
    c, s = math.cos(theta), math.sin(theta)
    sub = tuple(x[frames] for x in hit_iv)
    sure = clip.positive_cells(sub, np.empty((len(frames), h4, w4), dtype=bool)).reshape(len(frames), P)
    amb = runs_to_cells(sub[2], sub[3], w4)  # flat over (frame position, cell)
    sure.reshape(-1)[amb] = False
    vals = clip.fast_projections(frames, theta)
    np.copyto(vals, np.nan, where=~sure)
    exact = np.zeros(vals.shape, dtype=bool)
    if amb.size:  # near-horizon / ambiguous-hit cells: exact
        xy = clip.exact_xy(frames[amb // P], amb % P)
        vals.reshape(-1)[amb] = xy[:, 0] * c + xy[:, 1] * s
        exact.reshape(-1)[amb] = True
    return vals, exact


def _whole_frame_quantile(clip: ClipGrid, f: int, c: float, s: float, wf: np.ndarray, p: float) -> float:
    """The quantile at p of frame f's static finite projections on (c, s), every pixel computed with
    geometry.ground_points (the fallback of `frame_quantiles`); wf: the frame's weights [h4·w4]."""
    STATS["fallback_frames"] += 1
    xy = ground_points(clip.cameras[f], clip.pix, clip.gz)[0]
    pr = xy[:, 0] * c + xy[:, 1] * s
    ok = ~np.isnan(pr) & (wf > 0)
    return weighted_quantile(pr[ok], wf[ok], p)


def _candidate(values: np.ndarray, weights: np.ndarray, t: float) -> float:
    """The smallest value whose cumulative weight (ascending) reaches t (clamped to the largest value):
    weighted_quantile's rule with the count of values below already subtracted from t. A bracket found with
    np.partition around the expected rank avoids sorting everything; falls back to a full sort."""
    n = values.size
    if n > 2048:
        wbar = float(weights.mean())
        r = int(min(max(t / wbar, 0), n - 1))
        m = max(64, n // 32)
        ka, kb = max(r - m, 0), min(r + m, n - 1)
        part = np.partition(values, (ka, kb))
        a, b = part[ka], part[kb]
        wa = int(weights[values < a].sum()) if ka > 0 else 0
        if wa < t and (kb == n - 1 or int(weights[values <= b].sum()) >= t):
            sel = (values >= a) & (values <= b) if ka > 0 else values <= b
            vs, ws = values[sel], weights[sel]
            o = np.argsort(vs, kind="stable")
            cum = wa + np.cumsum(ws[o])
            k = int(np.searchsorted(cum, t, side="left"))
            return float(vs[o[min(k, o.size - 1)]])
    o = np.argsort(values, kind="stable")
    cum = np.cumsum(weights[o])
    k = int(np.searchsorted(cum, t, side="left"))
    return float(values[o[min(k, n - 1)]])
