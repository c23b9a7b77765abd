"""A synthetic clip's frames drawn from its scene (gcc/synth/scene.py): each pixel's semantic id and a shade, by
casting the cameras' rays at the ground and at the characters' capsules (`render_frame`, `render_clip`), and the
RGB frame a palette and the shade make of them (`rgb_frame`)."""

from __future__ import annotations

import numpy as np
from PIL import Image

from gcc import vocab
from gcc.geometry import Cameras, rotation_axes
from gcc.synth.scene import ClipScene, world_class

_LIGHT = np.array([0.35, 0.25, 0.9]) / np.linalg.norm([0.35, 0.25, 0.9])


def _ray_capsules(o: np.ndarray, d: np.ndarray, caps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rays o, d [P, 3] (d unit) vs capsules [K, 8] -> nearest positive hit distance [P] (inf = none) and
    capsule index [P]. Inigo Quilez's capsule intersection, vectorised over capsules x rays."""
    ox, oy, oz = (o[None, :, n] for n in range(3))
    dx, dy, dz = (d[None, :, n] for n in range(3))
    ax, ay, az, bx, by, bz, r = (caps[:, n, None] for n in range(7))
    bax, bay, baz = bx - ax, by - ay, bz - az
    oax, oay, oaz = ox - ax, oy - ay, oz - az
    baba = bax * bax + bay * bay + baz * baz
    bard = bax * dx + bay * dy + baz * dz
    baoa = bax * oax + bay * oay + baz * oaz
    rdoa = dx * oax + dy * oay + dz * oaz
    oaoa = oax * oax + oay * oay + oaz * oaz
    a = baba - bard * bard
    b = baba * rdoa - baoa * bard
    c = baba * oaoa - baoa * baoa - r * r * baba
    h = b * b - a * c
    with np.errstate(invalid="ignore", divide="ignore"):
        t_body = (-b - np.sqrt(h)) / a
        y = baoa + t_body * bard
        body = (h >= 0) & (a > 1e-12) & (y > 0) & (y < baba)
        low = y <= 0  # the cap on A's side, else B's
        ocx, ocy, ocz = np.where(low, oax, ox - bx), np.where(low, oay, oy - by), np.where(low, oaz, oz - bz)
        b2 = dx * ocx + dy * ocy + dz * ocz
        h2 = b2 * b2 - (ocx * ocx + ocy * ocy + ocz * ocz - r * r)
        t_cap = -b2 - np.sqrt(h2)
    t = np.where(body, t_body, np.where(h2 > 0, t_cap, np.inf))
    t = np.where(t > 0, t, np.inf)
    k = np.argmin(t, 0)
    return t[k, np.arange(t.shape[1])], k


def _axis_offsets(cam: Cameras, u0: int, u1: int, v0: int, v1: int):
    """Image-plane offsets of one camera's pixel columns u0..u1-1 [nu, 3] and rows v0..v1-1 [nv, 3] (as in
    `Cameras.rays`: right * ndc_x * half_w and up * ndc_y * half_h), plus its location and forward axis."""
    us, vs = np.arange(u0, u1, dtype=np.float64), np.arange(v0, v1, dtype=np.float64)
    ndc_x = cam.dst_to_ndc(np.stack([us, np.zeros_like(us)], -1))[:, 0]
    ndc_y = cam.dst_to_ndc(np.stack([np.zeros_like(vs), vs], -1))[:, 1]
    fwd, right, up = rotation_axes(cam.rotation)[0]
    half_w, half_h = (float(e[0]) for e in cam.image_plane_half_extents())
    return right[None, :] * (ndc_x * half_w)[:, None], up[None, :] * (ndc_y * half_h)[:, None], cam.location[0], fwd


def _ground_hits(cam: Cameras, gz: float) -> np.ndarray:
    """`ground_points` of every dst pixel of one camera, [H*W, 2] (NaN = miss), computed per row and column
    (the ray offsets are separable in u and v; the ray's length cancels in the hit point)."""
    H, W = cam.dst_hw
    cols, rows, loc, fwd = _axis_offsets(cam, 0, W, 0, H)
    grid = [rows[:, None, k] + cols[None, :, k] for k in range(3)]  # [H, W] per world axis
    if cam.orthographic[0]:
        o = [loc[k] + grid[k] for k in range(3)]
        d = [np.full((1, 1), fwd[k]) for k in range(3)]
    else:
        o = [np.full((1, 1), loc[k]) for k in range(3)]
        d = [fwd[k] + grid[k] for k in range(3)]
    with np.errstate(divide="ignore", invalid="ignore"):
        t = (gz - o[2]) / d[2]
        hit = np.isfinite(t) & (t > 0) & (np.abs(d[2]) > 1e-12)
        x = np.where(hit, o[0] + d[0] * t, np.nan)
        y = np.where(hit, o[1] + d[1] * t, np.nan)
    return np.stack([x.ravel(), y.ravel()], -1)


def _block_rays(cam: Cameras, u0: int, u1: int, v0: int, v1: int) -> tuple[np.ndarray, np.ndarray]:
    """Rays of one camera through the dst pixel block rows v0..v1-1 x cols u0..u1-1 (row-major): origins and
    unit directions [n, 3], as `Cameras.rays` computes them, evaluated per row and column."""
    cols, rows, loc, fwd = _axis_offsets(cam, u0, u1, v0, v1)
    offs = (rows[:, None, :] + cols[None, :, :]).reshape(-1, 3)
    if cam.orthographic[0]:
        return loc + offs, np.broadcast_to(fwd, offs.shape)
    d = fwd + offs
    return np.broadcast_to(loc, offs.shape), d / np.sqrt(np.einsum("pk,pk->p", d, d))[:, None]


def _char_block(cam: Cameras, caps: np.ndarray) -> tuple[int, int, int, int] | None:
    """The dst pixel block (u0, u1, v0, v1) that may see the capsules: the projection of their 3D bounding
    box (whole frame when a corner is behind the camera), clipped to the frame; None when off screen."""
    H, W = cam.dst_hw
    lo = np.minimum(caps[:, 0:3], caps[:, 3:6]).min(0) - caps[:, 6].max()
    hi = np.maximum(caps[:, 0:3], caps[:, 3:6]).max(0) + caps[:, 6].max()
    corners = np.array([[x, y, z] for x in (lo[0], hi[0]) for y in (lo[1], hi[1]) for z in (lo[2], hi[2])])
    uv = cam.project(corners)[0][0]
    if not np.all(np.isfinite(uv)):
        return 0, W, 0, H
    u0, v0 = (max(0, int(np.floor(x)) - 2) for x in uv.min(0))
    u1, v1 = (int(np.ceil(x)) + 2 for x in uv.max(0))
    u1, v1 = min(W, u1), min(H, v1)
    return (u0, u1, v0, v1) if (u1 > u0 and v1 > v0) else None


def render_frame(scene: ClipScene, f: int) -> tuple[np.ndarray, np.ndarray]:
    """Frame f at dst_hw: sem ids uint8 [H, W] and a shade factor float32 [H, W]."""
    H, W = scene.cameras.dst_hw
    cam = scene.cameras[f]
    gxy = _ground_hits(cam, scene.gz)
    hitg = np.isfinite(gxy[:, 0])
    ids = world_class(scene.world, gxy).reshape(H, W)
    # light world-anchored texture on the ground, flat sky
    with np.errstate(invalid="ignore"):
        chk = (np.floor(gxy[:, 0] / 150.0) + np.floor(gxy[:, 1] / 150.0)) % 2
    shade = np.where(hitg, 0.88 + 0.12 * np.nan_to_num(chk), 1.0).astype(np.float32).reshape(H, W)
    tchar = np.full((H, W), np.inf)  # nearest character hit so far (characters may overlap on screen)
    caps_all = scene.capsules[f]
    # characters: big frames test each capsule in its own screen block, small ones each character's block
    groups = (
        [caps_all[n : n + 1] for n in range(len(caps_all))]
        if H * W > 65536
        else [caps_all[caps_all[:, 7] < 16], caps_all[caps_all[:, 7] >= 16]]
    )  # player, boss
    for group in groups:
        blk = _char_block(cam, group) if len(group) else None
        if blk is None:
            continue
        u0, u1, v0, v1 = blk
        bo, bd = _block_rays(cam, u0, u1, v0, v1)
        with np.errstate(divide="ignore", invalid="ignore"):
            tg = (scene.gz - bo[:, 2]) / bd[:, 2]
        tg = np.where(np.isfinite(tg) & (tg > 0), tg, np.inf)  # the ground, along the unit ray
        tc, k = _ray_capsules(bo, bd, group)
        hit = tc < np.minimum(tg, tchar[v0:v1, u0:u1].ravel())
        if not hit.any():
            continue
        hk, ht = k[hit], tc[hit]
        p = bo[hit] + bd[hit] * ht[:, None]
        a, b, r = group[hk, 0:3], group[hk, 3:6], group[hk, 6]
        ba = b - a
        u = np.clip(np.einsum("pk,pk->p", p - a, ba) / np.einsum("pk,pk->p", ba, ba), 0.0, 1.0)
        n = (p - (a + ba * u[:, None])) / r[:, None]
        lam = np.clip(n @ _LIGHT, 0.0, 1.0)
        for arr, val in ((ids, group[hk, 7].astype(np.uint8)), (shade, 0.55 + 0.45 * lam), (tchar, ht)):
            blkv = arr[v0:v1, u0:u1].reshape(-1).copy()
            blkv[hit] = val
            arr[v0:v1, u0:u1] = blkv.reshape(v1 - v0, u1 - u0)
    return ids, shade


def render_clip(scene: ClipScene) -> tuple[np.ndarray, np.ndarray]:
    """All frames: ids uint8 [F, H, W], shade float32 [F, H, W]."""
    out = [render_frame(scene, f) for f in range(len(scene.cameras))]
    return np.stack([o[0] for o in out]), np.stack([o[1] for o in out])


def rgb_frame(ids: np.ndarray, shade: np.ndarray, src_hw: tuple[int, int]) -> np.ndarray:
    """Palette colour x shade at dst, bilinearly resized to src_hw: uint8 [h, w, 3]."""
    rgb = (vocab.PALETTE["parts"][ids] * shade[..., None]).astype(np.uint8)  # no UNKNOWN in the world
    img = Image.fromarray(rgb)
    if img.size != (src_hw[1], src_hw[0]):
        img = img.resize((src_hw[1], src_hw[0]), Image.Resampling.BILINEAR)
    return np.asarray(img)
