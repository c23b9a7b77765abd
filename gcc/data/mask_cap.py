"""The `cap` calibration of the UNKNOWN mask (docs/design.md §6): per frame and plane, τ_f = max(τ, the weighted quantile at
1 − max_frame_coverage of frame f's static finite projections), so no frame has more than that share of its
static ground pixels beyond a plane. It holds `cap_taus` (called by gcc/data/mask.py's `unknown_cells`) and its
helpers, built on the pooled-grid machinery of gcc/data/mask_grid.py (`ClipGrid`, `frame_quantiles`, ...).

How it is fast: only frames whose coverage at τ exceeds the cap need their own quantile. It is bracketed by a
coarse estimate on every 4th cell row/column, the bracket is verified with exact run counts, and only the cells
between the two thresholds are projected and sorted; a full sort of the frame (`mask_grid.frame_quantiles`) remains
as the fallback when the check fails. Every value equals the per-pixel definition exactly (gcc/data/mask.py).
"""

from __future__ import annotations

import math

import numpy as np

from gcc.data.mask_grid import CHUNK, STATS, ClipGrid, MaskParams, frame_quantiles, row_sum, runs_to_cells


def _weights_beyond(
    clip: ClipGrid, theta: float, thr: np.ndarray, cw: np.ndarray, wflat: np.ndarray, hit_iv, hamb: np.ndarray
):
    """Exact per-frame weights [F] of the static finite cells (w_fin) and of those with projection > thr[f]
    (w_bey; thr = +inf: none), and the plane intervals at thr: sums over the sure runs, then the ambiguous
    cells corrected with their exact status."""
    w4, P = clip.w4, clip.h4 * clip.w4
    hlo, hhi = hit_iv[0], hit_iv[1]
    piv = clip.intervals(*clip.plane_function(theta, thr))
    plo, phi = piv[0], piv[1]
    w_fin = row_sum(cw, hlo, hhi)
    w_bey = row_sum(cw, np.maximum(hlo, plo), np.minimum(hhi, phi))
    amb = np.unique(np.concatenate([hamb, runs_to_cells(piv[2], piv[3], w4)]))
    if amb.size:
        fr, cell = amb // P, amb % P
        i, j = cell // w4, cell % w4
        in_h = (j >= hlo[fr, i]) & (j < hhi[fr, i])
        in_p = in_h & (j >= plo[fr, i]) & (j < phi[fr, i])
        xy = clip.exact_xy(fr, cell)
        e_fin = ~np.isnan(xy[:, 0])
        e_bey = e_fin & (xy[:, 0] * math.cos(theta) + xy[:, 1] * math.sin(theta) > thr[fr])
        wa = wflat[amb].astype(np.int64)
        np.add.at(w_fin, fr, wa * (e_fin.astype(np.int64) - in_h))
        np.add.at(w_bey, fr, wa * (e_bey.astype(np.int64) - in_p))
    return w_fin, w_bey, piv


def cap_taus(
    clip: ClipGrid, params: MaskParams, weights: np.ndarray, tau: np.ndarray, hit_iv, max_cov: float
) -> np.ndarray:
    """τ_f = max(τ, weighted_quantile(frame f's static finite projections, 1 − max_cov)) per frame, plane."""
    nf, K = len(clip.cameras), len(tau)
    h4, w4 = clip.h4, clip.w4
    p = 1.0 - max_cov
    cw = np.zeros((nf, h4, w4 + 1), dtype=np.int32)  # row prefix sums (<= 16·w4)
    np.cumsum(weights, axis=2, out=cw[:, :, 1:])
    wflat = weights.reshape(-1)
    hamb = runs_to_cells(hit_iv[2], hit_iv[3], w4)
    taus = np.broadcast_to(tau, (nf, K)).copy()
    for k in range(K):
        if not np.isfinite(tau[k]):
            continue  # no frame-0 population: τ = +inf, and max(τ, ·) stays +inf
        theta = params.thetas[k]
        w_fin, w_bey, _ = _weights_beyond(clip, theta, np.full(nf, tau[k]), cw, wflat, hit_iv, hamb)
        # Q_f <= τ  <=>  weight(proj <= τ) >= p·W, and then τ_f = τ; a frame without static finite pixels
        # has nothing to cap (τ_f = τ)
        need = np.flatnonzero((w_fin > 0) & ((w_fin - w_bey) < p * w_fin.astype(np.float64)))
        if need.size == 0:
            continue
        q, ok = _bracketed_quantiles(clip, need, theta, weights, cw, wflat, hit_iv, hamb, p, float(tau[k]), w_fin)
        taus[need[ok], k] = q[ok]
        rest = need[~ok]
        STATS["cap_bracketed"] += int(ok.sum())
        STATS["cap_sorted"] += int(rest.size)
        for a in range(0, rest.size, CHUNK):  # a few frames at a time: the temporaries stay in cache
            fs = rest[a : a + CHUNK]
            taus[fs, k] = frame_quantiles(clip, fs, theta, weights, hit_iv, p, lower=float(tau[k]))
    return taus


_EST_STRIDE = 4  # coarse estimate: every 4th cell row and column
_EST_EPS = 0.03  # bracket: the coarse quantiles at p ± 0.03


def _bracketed_quantiles(
    clip: ClipGrid,
    frames: np.ndarray,
    theta: float,
    weights: np.ndarray,
    cw,
    wflat,
    hit_iv,
    hamb,
    p: float,
    tau: float,
    w_fin: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Exact quantiles at p (> τ) of the given frames through a verified bracket: the quantiles at p ± ε of
    a coarse subgrid give (lo, hi]; the exact weight counts at lo and hi (row runs) check that the quantile
    lies inside; only the cells of the runs between the two thresholds are then projected and sorted, with
    the same exact patching as `frame_quantiles`. Returns (values, ok): frames whose check fails (ok False)
    are left to `frame_quantiles`."""
    K = len(frames)
    out = np.full(K, np.nan)
    # 1. coarse estimate of (lo, hi] on a subgrid of sure-hit static cells
    lo, hi, ok = _coarse_bracket(clip, frames, theta, weights, hit_iv, p, tau)
    if not ok.any():
        return out, ok
    # 2. exact counts at lo and hi: C(v) = weight of static finite cells with projection <= v
    c_lo, c_hi, t, iv_lo, iv_hi = _bracket_counts(clip, frames, theta, cw, wflat, hit_iv, hamb, p, w_fin, lo, hi, ok)
    sg_lo, sg_hi = iv_lo[4][frames], iv_hi[4][frames]
    ok &= (c_lo < t) & (c_hi >= t) & (sg_lo == sg_hi) & (sg_lo != 0)
    if not ok.any():
        return out, ok
    # 3. candidate cells: between the two thresholds' runs, within the sure-hit run; plus ambiguous-hit cells
    fo = frames[ok]
    pos, cell, vals, wv, exact, bands = _bracket_cells(
        clip, fo, theta, wflat, hit_iv, iv_lo, iv_hi, sg_lo[ok], lo[ok], hi[ok], tau
    )
    # 4. per frame: the quantile among the bracket's cells, patched exactly around the candidate
    res, good = _patched_quantiles(
        clip, fo, theta, pos, cell, vals, wv, exact, bands, c_lo[ok], (c_hi - c_lo)[ok], t[ok]
    )
    okk = np.flatnonzero(ok)
    ok[okk[~good]] = False
    out[okk] = res
    return out, ok


def _coarse_bracket(
    clip: ClipGrid, frames: np.ndarray, theta: float, weights: np.ndarray, hit_iv, p: float, tau: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lo, hi, ok) per frame: the quantiles at p ± ε (lo at least τ) of the sure-hit static cells of every
    `_EST_STRIDE`-th row and column; ok where that bracket is usable (non-empty, finite, frame not exact)."""
    h4, w4 = clip.h4, clip.w4
    K = len(frames)
    st = _EST_STRIDE
    rows = np.arange(st // 2, h4, st) if h4 > st else np.arange(h4)
    cols = np.arange(st // 2, w4, st) if w4 > st else np.arange(w4)
    sub_iv = tuple(x[frames] for x in hit_iv)
    hit = clip.positive_cells(sub_iv, np.empty((K, h4, w4), dtype=bool))[:, rows][:, :, cols]
    wsub = weights[frames][:, rows][:, :, cols]
    n0, nb, na, d0, db, da = (x[:, None, None] for x in clip.projection_coefficients(frames, theta))
    a = (clip.half_w[frames][:, None] * clip.ndcx[cols][None])[:, None, :]
    b = clip.b[frames][:, rows][:, :, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        est = (n0 + nb * b + na * a) / (d0 + db * b + da * a)
    use = hit & (wsub > 0) & np.isfinite(est)
    est = np.where(use, est, np.inf).reshape(K, -1)
    wsub = np.where(use, wsub, 0).reshape(K, -1)
    order = np.argsort(est, axis=1, kind="stable")
    ev = np.take_along_axis(est, order, 1)
    cum = np.cumsum(np.take_along_axis(wsub, order, 1), axis=1)
    tot = cum[:, -1].astype(np.float64)
    last = ev.shape[1] - 1

    def at(pp):
        idx = np.minimum((cum < pp * tot[:, None]).sum(1), last)
        return ev[np.arange(K), idx]

    lo = np.maximum(at(max(p - _EST_EPS, 0.0)), tau)
    hi = at(min(p + _EST_EPS, 1.0))
    ok = (tot > 0) & np.isfinite(hi) & (hi > lo) & ~clip.frame_exact[frames]
    return lo, hi, ok


def _bracket_counts(
    clip: ClipGrid,
    frames: np.ndarray,
    theta: float,
    cw,
    wflat,
    hit_iv,
    hamb,
    p: float,
    w_fin: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    ok: np.ndarray,
):
    """The exact weights C(lo), C(hi) of the frames (C(v) = weight of static finite cells with projection
    <= v), the target t = p·W, and the plane intervals at lo and hi (frames not ok: thresholds +inf)."""
    nf = len(clip.cameras)
    thr_lo, thr_hi = np.full(nf, np.inf), np.full(nf, np.inf)
    thr_lo[frames[ok]], thr_hi[frames[ok]] = lo[ok], hi[ok]
    _, wb_lo, iv_lo = _weights_beyond(clip, theta, thr_lo, cw, wflat, hit_iv, hamb)
    _, wb_hi, iv_hi = _weights_beyond(clip, theta, thr_hi, cw, wflat, hit_iv, hamb)
    W = w_fin[frames]
    t = p * W.astype(np.float64)
    c_lo, c_hi = W - wb_lo[frames], W - wb_hi[frames]
    return c_lo, c_hi, t, iv_lo, iv_hi


def _bracket_cells(
    clip: ClipGrid,
    fo: np.ndarray,
    theta: float,
    wflat,
    hit_iv,
    iv_lo,
    iv_hi,
    sg_lo: np.ndarray,
    lo_o: np.ndarray,
    hi_o: np.ndarray,
    tau: float,
):
    """The candidate cells of frames fo with projection in (lo_o, hi_o] and weight > 0, as (pos [index into
    fo], cell, vals, wv, exact, bands): values exact near the two thresholds and on ambiguous-hit cells."""
    w4, P = clip.w4, clip.h4 * clip.w4
    c, s = math.cos(theta), math.sin(theta)
    inc = (sg_lo > 0)[:, None]
    lo_lo, hi_lo, alo_lo, ahi_lo = (x[fo] for x in iv_lo[:4])
    lo_hi, hi_hi = iv_hi[0][fo], iv_hi[1][fo]
    start = np.where(inc, np.minimum(alo_lo, lo_lo), hi_hi)
    end = np.where(inc, lo_hi, np.maximum(ahi_lo, hi_lo))
    start = np.maximum(start, hit_iv[0][fo])
    end = np.maximum(np.minimum(end, hit_iv[1][fo]), start)
    cells = runs_to_cells(start, end, w4)  # flat over (position in fo, cell)
    hamb_fo = runs_to_cells(hit_iv[2][fo], hit_iv[3][fo], w4)
    pos, cell = cells // P, cells % P
    n0, nb, na, d0, db, da = clip.projection_coefficients(fo, theta)
    i, j = cell // w4, cell % w4
    av = clip.half_w[fo][pos] * clip.ndcx[j]
    bv = clip.b[fo[pos], i]
    with np.errstate(divide="ignore", invalid="ignore"):
        vals = (n0[pos] + nb[pos] * bv + na[pos] * av) / (d0[pos] + db[pos] * bv + da[pos] * av)
    bands = np.array([clip.proj_band(int(f), max(abs(tau), 0.0)) for f in fo])
    near_edge = (np.abs(vals - lo_o[pos]) <= 2 * bands[pos]) | (np.abs(vals - hi_o[pos]) <= 2 * bands[pos])
    exact = near_edge.copy()
    if hamb_fo.size:
        pos = np.concatenate([pos, hamb_fo // P])
        cell = np.concatenate([cell, hamb_fo % P])
        vals = np.concatenate([vals, np.full(hamb_fo.size, np.nan)])
        exact = np.concatenate([exact, np.ones(hamb_fo.size, dtype=bool)])
    ex = np.flatnonzero(exact)
    if ex.size:
        xy = clip.exact_xy(fo[pos[ex]], cell[ex])
        vals[ex] = xy[:, 0] * c + xy[:, 1] * s
    wv = wflat[fo[pos] * P + cell]
    keep = (wv > 0) & (vals > lo_o[pos]) & (vals <= hi_o[pos])  # NaN (miss) drops out
    return pos[keep], cell[keep], vals[keep], wv[keep], exact[keep], bands


def _patched_quantiles(
    clip: ClipGrid,
    fo: np.ndarray,
    theta: float,
    pos: np.ndarray,
    cell: np.ndarray,
    vals: np.ndarray,
    wv: np.ndarray,
    exact: np.ndarray,
    bands: np.ndarray,
    c_lo: np.ndarray,
    c_bracket: np.ndarray,
    t: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Per frame of fo: the weighted quantile (target t, c_lo below the bracket) among its bracket cells, with
    the cells near the candidate made exact first. Returns (values, good): good False where the cells do not
    hold the bracket's weight c_bracket or the patched values do not settle it."""
    c, s = math.cos(theta), math.sin(theta)
    cnt = np.bincount(pos, minlength=fo.size)
    wsum = np.bincount(pos, weights=wv, minlength=fo.size)
    good = wsum == c_bracket  # the runs hold exactly the bracket's weight
    srt = np.argsort(pos, kind="stable")
    starts = np.r_[0, np.cumsum(cnt)[:-1]]
    todo_p = []
    state: list[tuple[np.ndarray, int, float] | None] = []
    for n in range(fo.size):
        if not good[n]:
            state.append(None)
            continue
        sl = srt[starts[n] : starts[n] + cnt[n]]
        v_n, w_n = vals[sl], wv[sl]
        tn = float(t[n]) - float(c_lo[n])
        o = np.argsort(v_n, kind="stable")
        cm = np.cumsum(w_n[o])
        v = v_n[o[min(int(np.searchsorted(cm, tn, side="left")), o.size - 1)]]
        near_m = np.abs(v_n - v) <= 2 * bands[n]
        below = int(c_lo[n]) + int(w_n[(v_n < v) & ~near_m].sum())
        state.append((sl[near_m], below, float(t[n])))
        tod = sl[near_m & ~exact[sl]]
        todo_p.append(tod)
    if todo_p:
        tod = np.concatenate(todo_p)
        if tod.size:
            xy = clip.exact_xy(fo[pos[tod]], cell[tod])
            vals[tod] = xy[:, 0] * c + xy[:, 1] * s
    res = np.full(fo.size, np.nan)
    for n, stt in enumerate(state):
        if stt is None:
            continue
        near, below, tt = stt
        nv = vals[near]
        if np.isnan(nv).any():
            good[n] = False
            continue
        o = np.argsort(nv, kind="stable")
        cm = below + np.cumsum(wv[near][o])
        k2 = int(np.searchsorted(cm, tt, side="left"))
        if k2 < o.size:
            res[n] = nv[o[k2]]
        else:
            good[n] = False
    return res, good
