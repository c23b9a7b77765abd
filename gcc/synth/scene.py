"""The synthetic world's scene (gcc/synth/world.py makes one per clip: `make_scene`): the static classes painted on
the ground (`World`, `world_class`), the characters as capsules of part ids (`PLAYER_CAPSULES`, `BOSS_CAPSULES`,
`capsules_at`), and a clip's scene (`ClipScene`), which gcc/synth/render.py draws."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gcc.geometry import Cameras

CELL_CM = 400.0  # static region size


@dataclass(frozen=True)
class World:
    """Static classes painted on the ground: a domain-warped grid of CELL_CM cells."""

    table: np.ndarray  # [64, 64] uint8 class of each cell (mod 64: the pattern repeats every 256 m)
    warp_amp: float
    warp_freq: tuple[float, float]
    warp_phase: tuple[float, float]


def world_class(world: World, xy: np.ndarray) -> np.ndarray:
    """World XY [..., 2] (cm) -> static class 0..5 (uint8); NaN points -> 6 (sky)."""
    xy = np.asarray(xy, dtype=np.float64)
    x, y = xy[..., 0], xy[..., 1]
    fa, fb = world.warp_freq
    pa, pb = world.warp_phase
    finite = np.isfinite(x) & np.isfinite(y)
    x0, y0 = np.where(finite, x, 0.0), np.where(finite, y, 0.0)
    qx = x0 + world.warp_amp * np.sin(y0 * fa + pa)
    qy = y0 + world.warp_amp * np.sin(x0 * fb + pb)
    ix = np.floor(qx / CELL_CM).astype(np.int64) & 63
    iy = np.floor(qy / CELL_CM).astype(np.int64) & 63
    return np.where(finite, world.table[ix, iy], np.uint8(6)).astype(np.uint8)


# Characters: (part id, A, B, radius) in local cm, facing +X, Z up from the ground.
PLAYER_CAPSULES = (
    (13, (0, -25, 40), (0, -25, 150), 32),
    (13, (0, 25, 40), (0, 25, 150), 32),  # legs
    (11, (0, 0, 170), (0, 0, 260), 55),  # torso
    (10, (0, 0, 315), (0, 0, 330), 40),  # head
    (12, (0, -110, 255), (0, 110, 255), 26),  # arms
    (14, (-55, 0, 130), (-55, 0, 265), 35),  # cape
    (15, (40, 110, 200), (160, 110, 360), 20),  # weapon
)
BOSS_CAPSULES = (
    (19, (0, -60, 70), (0, -60, 260), 65),
    (19, (0, 60, 70), (0, 60, 260), 65),  # legs
    (17, (0, 0, 310), (0, 0, 480), 110),  # torso
    (16, (70, 0, 570), (100, 0, 590), 70),  # head
    (18, (0, -200, 450), (0, 200, 450), 45),  # arms
    (20, (-110, 0, 220), (-380, 0, 70), 50),  # tail
    (21, (70, 200, 380), (230, 200, 680), 35),  # weapon
)


@dataclass
class ClipScene:
    index: int
    gz: float
    world: World
    meta: dict[str, Any]
    cameras: Cameras
    capsules: list[np.ndarray] = field(default_factory=list)  # per frame [K, 8]: A(3) B(3) r id
    context_keys: list[str] = field(default_factory=list)


def capsules_at(parts, pos: np.ndarray, heading_deg: float, gz: float, scale: float) -> np.ndarray:
    c, s = math.cos(math.radians(heading_deg)), math.sin(math.radians(heading_deg))
    rot = np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])
    base = np.array([pos[0], pos[1], gz])
    rows = []
    for pid, a, b, r in parts:
        wa = base + rot @ (np.array(a, dtype=np.float64) * scale)
        wb = base + rot @ (np.array(b, dtype=np.float64) * scale)
        rows.append([*wa, *wb, r * scale, pid])
    return np.array(rows, dtype=np.float64)
