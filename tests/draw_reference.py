"""A plain reference of the per-sample draws (docs/design.md §5–§6), for tests: written from the docs, sharing no
code with gcc (`gcc/data/sample_rng.py`), so a bug of the draws is not repeated in the value a test expects.

numpy's generator `default_rng([seed, epoch, sample_id])` draws the text, cond and mask uniforms, always all three;
text drops when its uniform is under p_text, cond under p_cond; the mask applies when its uniform is under p_mask and
cond is kept, and then draws one uniform for the plane count (1 under 0.7, else 2), then per plane θ = 2π·u and
q = 0.05 + 0.35·u, θ first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Draw:
    text: bool
    cond: bool
    planes: tuple[tuple[float, float], ...] | None  # (θ, q) per plane; None: no mask


def reference_draw(seed: int, epoch: int, sample_id: int, p_text: float, p_cond: float, p_mask: float) -> Draw:
    g = np.random.default_rng([seed, epoch, sample_id])
    u_text, u_cond, u_mask = g.random(3)
    text, cond = bool(u_text < p_text), bool(u_cond < p_cond)
    if not (u_mask < p_mask and not cond):
        return Draw(text, cond, None)
    n = 1 if g.random() < 0.7 else 2
    planes = []
    for _ in range(n):
        theta = 2 * math.pi * g.random()
        planes.append((theta, 0.05 + 0.35 * g.random()))
    return Draw(text, cond, tuple(planes))


def within_binomial(hits: int, n: int, p: float, sigmas: float = 5.0) -> bool:
    """`hits` of `n` draws is a rate p can give: within `sigmas` standard deviations of n·p (a 5σ bound fails a
    correct draw about once in 1.7 million)."""
    return abs(hits - n * p) <= sigmas * math.sqrt(n * p * (1 - p))
