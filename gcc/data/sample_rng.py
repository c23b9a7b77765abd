"""Per-sample randomness (docs/design.md §5–§6): a pure function of (seed, epoch, sample id).

Each sample owns the generator ``np.random.default_rng([seed, epoch, sample_id])`` (PCG64 seeded through a
SeedSequence of the three integers), so the draws do not depend on worker count, rank count, order of
visits or the resume point. The draw order is fixed:

1. three uniforms in [0, 1): text, cond, mask (always all three, whatever the probabilities);
2. only when the mask applies (mask uniform < p_mask and cond not dropped): one uniform for the number of
   planes (1 if < 0.7, else 2), then per plane θ = 2π·u (U[0, 2π)) and q = 0.05 + 0.35·u (U(0.05, 0.40)),
   θ before q.

``drop_text = u_text < p_text``, ``drop_cond = u_cond < p_cond``. The val split passes all probabilities 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gcc.data.config import COND_DROPOUT, MASK_P, TEXT_DROPOUT
from gcc.data.mask import MaskParams
from gcc.stats import BATCH, MEAN, Stat

P_TEXT, P_COND, P_MASK = TEXT_DROPOUT, COND_DROPOUT, MASK_P  # the config's defaults (gcc/data/config.py)
P_ONE_PLANE = 0.7
Q_LOW, Q_SPAN = 0.05, 0.35  # q = 0.05 + 0.35·u: U(0.05, 0.40)
# what a training step reports of these draws: the batch's per-clip values (gc_collate's keys) as their means over
# the step (gcc/stats.py)
BATCH_STATS = (
    Stat("text_drop", MEAN, BATCH, key="drop_text"),
    Stat("cond_drop", MEAN, BATCH, key="drop_cond"),
    Stat("mask_frac", MEAN, BATCH),
)


@dataclass(frozen=True)
class SampleDraw:
    drop_text: bool
    drop_cond: bool
    mask: MaskParams | None  # None: no mask for this sample
    uniforms: tuple[float, float, float]  # (text, cond, mask), for logging and tests


def sample_rng(seed: int, epoch: int, sample_id: int) -> np.random.Generator:
    """The generator of one sample; seed, epoch and sample_id are non-negative integers."""
    key = [int(seed), int(epoch), int(sample_id)]
    if any(k < 0 for k in key) or any(k != v for k, v in zip(key, (seed, epoch, sample_id))):
        raise ValueError(f"seed, epoch, sample_id must be non-negative integers, got {(seed, epoch, sample_id)}")
    return np.random.default_rng(key)


def draw_sample(
    seed: int, epoch: int, sample_id: int, p_text: float = P_TEXT, p_cond: float = P_COND, p_mask: float = P_MASK
) -> SampleDraw:
    """All random decisions of one sample (see the module docstring for the order)."""
    rng = sample_rng(seed, epoch, sample_id)
    u_text, u_cond, u_mask = (float(u) for u in rng.random(3))
    drop_text, drop_cond = u_text < p_text, u_cond < p_cond
    mask = None
    if u_mask < p_mask and not drop_cond:
        n_planes = 1 if rng.random() < P_ONE_PLANE else 2
        thetas, qs = [], []
        for _ in range(n_planes):
            thetas.append(2.0 * math.pi * float(rng.random()))
            qs.append(Q_LOW + Q_SPAN * float(rng.random()))
        mask = MaskParams(tuple(thetas), tuple(qs))
    return SampleDraw(drop_text, drop_cond, mask, (u_text, u_cond, u_mask))
