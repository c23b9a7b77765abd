"""Geometry: a clip's array shapes (the VAE's shape rule) and its cameras in Unreal Engine conventions (docs/design.md §3).

Shapes: T latent frames of h×w cover F = 4(T-1)+1 pixel frames of 16h×16w (latent frame 0 = pixel frame 0,
latent frame k ≥ 1 = pixel frames 4k-3..4k). `Geometry` holds one clip's shapes; everything that needs the
rule (converter, loader, synth, model, sampler, tests) uses it from here.

World: X forward, Y right, Z up, centimetres. A rotation is (pitch, yaw, roll) in degrees, turned into axes
exactly as UE's FRotationMatrix does. Cameras render at `src_hw`; clips are resampled to `dst_hw`, and dst
pixel (u, v) (u = column, v = row) maps to the source position ((u + 0.5)·sx, (v + 0.5)·sy) with
sx = src_w / dst_w, sy = src_h / dst_h: pixel centres map to pixel centres.

Perspective cameras carry a horizontal FOV and use reversed-Z depth (near plane -> 1, infinity -> 0);
orthographic cameras carry an ortho width (cm across the source image). All functions take a `Cameras`
(one camera per frame, as arrays) so a whole clip is handled in one vectorised call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

VAE_STRIDE_T, VAE_STRIDE_S = 4, 16  # Wan2.2 VAE: 4 frames and 16×16 pixels per latent cell
LATENT_C = 48  # Wan2.2 TI2V-5B latent channels


def pixel_frames(latent_frames: int) -> int:
    """The shape rule in time: latent frame 0 is pixel frame 0, each further latent frame 4 pixel frames."""
    return VAE_STRIDE_T * (latent_frames - 1) + 1


def latent_frame_spans(latent_frames: int) -> list[tuple[int, int]]:
    """[lo, hi) pixel frames of each latent frame: frame 0 alone, then 4k-3..4k (the VAE's causal grouping)."""
    return [(0, 1)] + [(VAE_STRIDE_T * k - 3, VAE_STRIDE_T * k + 1) for k in range(1, latent_frames)]


@dataclass(frozen=True)
class Geometry:
    """One clip's shapes: latents [C, T, h, w], sem ids [F, 16h, 16w], text cells [text_L, text_D]; `src_hw` is
    the raw video's size (used where raw frames are rendered or read)."""

    T: int  # latent frames
    h: int  # latent height
    w: int  # latent width
    text_L: int
    text_D: int
    C: int = LATENT_C
    src_hw: tuple[int, int] | None = None

    @classmethod
    def from_shapes(cls, latents: Sequence[int], text: Sequence[int]) -> Geometry:
        c, t, h, w = (int(v) for v in latents)
        return cls(T=t, h=h, w=w, text_L=int(text[0]), text_D=int(text[1]), C=c)

    @property
    def F(self) -> int:
        return pixel_frames(self.T)

    @property
    def dst_hw(self) -> tuple[int, int]:
        return (VAE_STRIDE_S * self.h, VAE_STRIDE_S * self.w)

    @property
    def latent_shape(self) -> tuple[int, int, int, int]:
        return (self.C, self.T, self.h, self.w)

    @property
    def sem_shape(self) -> tuple[int, int, int]:
        return (self.F, *self.dst_hw)

    @property
    def text_shape(self) -> tuple[int, int]:
        return (self.text_L, self.text_D)

    def as_dict(self) -> dict[str, Any]:
        """As a manifest records it."""
        return {
            "latents": list(self.latent_shape),
            "sem": list(self.sem_shape),
            "text": list(self.text_shape),
            "latent_frames": self.T,
            "frames": self.F,
        }


PERSPECTIVE, ORTHOGRAPHIC = "perspective", "orthographic"
PROJECTIONS = (PERSPECTIVE, ORTHOGRAPHIC)
NEAR_CM = 10.0  # reversed-Z near plane


def rotation_axes(rotation: np.ndarray) -> np.ndarray:
    """(pitch, yaw, roll) degrees [..., 3] -> world axes [..., 3, 3]: rows forward (X), right (Y), up (Z)."""
    p, y, r = np.moveaxis(np.deg2rad(np.asarray(rotation, dtype=np.float64)), -1, 0)
    sp, cp, sy, cy, sr, cr = np.sin(p), np.cos(p), np.sin(y), np.cos(y), np.sin(r), np.cos(r)
    fwd = np.stack([cp * cy, cp * sy, sp], -1)
    right = np.stack([sr * sp * cy - cr * sy, sr * sp * sy + cr * cy, -sr * cp], -1)
    up = np.stack([-(cr * sp * cy + sr * sy), cy * sr - cr * sp * sy, cr * cp], -1)
    return np.stack([fwd, right, up], -2)


def _hw(values: Sequence[Any]) -> tuple[int, int]:
    h, w = values
    return int(h), int(w)


@dataclass(frozen=True)
class Cameras:
    """One camera per frame. `fov_deg` is used where perspective, `ortho_width` where orthographic."""

    location: np.ndarray  # [N, 3] cm
    rotation: np.ndarray  # [N, 3] pitch, yaw, roll in degrees
    orthographic: np.ndarray  # [N] bool
    fov_deg: np.ndarray  # [N] horizontal FOV
    ortho_width: np.ndarray  # [N] cm
    src_hw: tuple[int, int]
    dst_hw: tuple[int, int]

    def __len__(self) -> int:
        return len(self.location)

    def __getitem__(self, idx) -> Cameras:
        idx = np.atleast_1d(np.arange(len(self))[idx])
        return Cameras(
            self.location[idx],
            self.rotation[idx],
            self.orthographic[idx],
            self.fov_deg[idx],
            self.ortho_width[idx],
            self.src_hw,
            self.dst_hw,
        )

    @staticmethod
    def from_meta(meta: dict[str, Any]) -> Cameras:
        """Build from a clip's meta json (the prepared layout, docs/design.md §4)."""
        cams = meta["cameras"]
        return Cameras(
            location=np.array([c["location"] for c in cams], dtype=np.float64).reshape(-1, 3),
            rotation=np.array([c["rotation"] for c in cams], dtype=np.float64).reshape(-1, 3),
            orthographic=np.array([c["projection"] == ORTHOGRAPHIC for c in cams], dtype=bool),
            fov_deg=np.array([c.get("fov_deg") or np.nan for c in cams], dtype=np.float64),
            ortho_width=np.array([c.get("ortho_width") or np.nan for c in cams], dtype=np.float64),
            src_hw=_hw(meta["src_hw"]),
            dst_hw=_hw(meta["dst_hw"]),
        )

    def to_meta(self) -> list[dict[str, Any]]:
        out = []
        for i in range(len(self)):
            cam: dict[str, Any] = {
                "location": [float(v) for v in self.location[i]],
                "rotation": [float(v) for v in self.rotation[i]],
            }
            if self.orthographic[i]:
                cam.update(projection=ORTHOGRAPHIC, ortho_width=float(self.ortho_width[i]))
            else:
                cam.update(projection=PERSPECTIVE, fov_deg=float(self.fov_deg[i]))
            out.append(cam)
        return out

    # ---- pixel <-> camera plane -------------------------------------------------------------------------
    def image_plane_half_extents(self) -> tuple[np.ndarray, np.ndarray]:
        """Half width and height of each camera's image plane [N]: tangents (perspective, at unit distance) or cm
        (orthographic); what the projections below, the mask grid and the synthetic world scale by."""
        src_h, src_w = self.src_hw
        half_w = np.where(self.orthographic, self.ortho_width / 2.0, np.tan(np.deg2rad(self.fov_deg) / 2.0))
        return half_w, half_w * (src_h / src_w)

    def dst_to_ndc(self, pixels: np.ndarray) -> np.ndarray:
        """dst pixels [..., 2] (u, v) -> normalised source coords [..., 2] in [-1, 1], +x right, +y up."""
        pixels = np.asarray(pixels, dtype=np.float64)
        (src_h, src_w), (dst_h, dst_w) = self.src_hw, self.dst_hw
        xs = (pixels[..., 0] + 0.5) * (src_w / dst_w)
        ys = (pixels[..., 1] + 0.5) * (src_h / dst_h)
        return np.stack([2.0 * xs / src_w - 1.0, 1.0 - 2.0 * ys / src_h], -1)

    def rays(self, pixels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """World rays through dst pixels [P, 2] for every camera: origins and unit directions [N, P, 3]."""
        ndc = self.dst_to_ndc(pixels)[None]  # [1, P, 2]
        axes = rotation_axes(self.rotation)  # [N, 3, 3]
        fwd, right, up = axes[:, None, 0], axes[:, None, 1], axes[:, None, 2]  # [N, 1, 3]
        half_w, half_h = (e[:, None, None] for e in self.image_plane_half_extents())  # [N, 1, 1]
        offs = right * (ndc[..., :1] * half_w) + up * (ndc[..., 1:] * half_h)  # [N, P, 3]
        ortho = self.orthographic[:, None, None]
        loc = self.location[:, None, :]
        origins = np.where(ortho, loc + offs, np.broadcast_to(loc, offs.shape))
        dirs = np.where(ortho, np.broadcast_to(fwd, offs.shape), fwd + offs)
        dirs = dirs / np.linalg.norm(dirs, axis=-1, keepdims=True)
        return origins, dirs

    def project(self, points: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """World points [P, 3] -> per camera dst pixel coords [N, P, 2] (u, v, continuous: pixel index + 0.5
        at its centre), forward distance [N, P] (cm), and depth [N, P]: reversed-Z NEAR/distance for
        perspective, distance for orthographic. Points behind a perspective camera get NaN pixels."""
        axes = rotation_axes(self.rotation)  # [N, 3, 3]
        rel = np.asarray(points, dtype=np.float64)[None] - self.location[:, None, :]  # [N, P, 3]
        cam = np.einsum("npk,nak->npa", rel, axes)  # [N, P, 3]: forward, right, up
        fwd, right, up = cam[..., 0], cam[..., 1], cam[..., 2]
        half_w, half_h = (e[:, None] for e in self.image_plane_half_extents())
        ortho = self.orthographic[:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            scale = np.where(ortho, 1.0, 1.0 / np.where(fwd > 0, fwd, np.nan))
            x_ndc = right * scale / half_w
            y_ndc = up * scale / half_h
            depth = np.where(ortho, fwd, NEAR_CM / fwd)
        dst_h, dst_w = self.dst_hw
        u = (x_ndc + 1.0) / 2.0 * dst_w
        v = (1.0 - y_ndc) / 2.0 * dst_h
        return np.stack([u, v], -1), fwd, depth


def ground_points(cameras: Cameras, dst_pixels: np.ndarray, ground_z: float) -> np.ndarray:
    """Intersect each dst pixel's ray with the plane Z = ground_z (docs/design.md §3).

    dst_pixels: [P, 2] (u, v). Returns world XY [N, P, 2], NaN where the ray misses the plane (it points
    parallel to it or away from it, e.g. sky)."""
    origins, dirs = cameras.rays(dst_pixels)
    dz = dirs[..., 2]
    with np.errstate(divide="ignore", invalid="ignore"):
        t = (ground_z - origins[..., 2]) / dz
        xy = origins[..., :2] + dirs[..., :2] * t[..., None]  # 0 * inf for parallel rays: masked below
    hit = np.isfinite(t) & (t > 0) & (np.abs(dz) > 1e-12)
    return np.where(hit[..., None], xy, np.nan)


def pixel_grid(hw: Sequence[int], stride: int = 1, offset: int = 0) -> np.ndarray:
    """dst pixels (u, v) [(H/stride)·(W/stride), 2] of a regular grid, row-major: cell (i, j) -> pixel
    (stride·j + offset, stride·i + offset)."""
    h, w = hw
    vv, uu = np.mgrid[0 : h // stride, 0 : w // stride]
    return np.stack([uu.ravel() * stride + offset, vv.ravel() * stride + offset], -1)
