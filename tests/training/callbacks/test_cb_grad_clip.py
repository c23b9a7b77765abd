"""GradClip (gcc/training/callbacks/grad_clip.py): at AFTER_TRAIN_BATCH (after backward, before the update) the
global gradient norm is clipped to `algorithms.gradient_clipping.clipping_threshold` and reported in `last_norm` (the norm before clipping);
`clipping_threshold: 0` turns clipping off but still reports the norm."""

from __future__ import annotations

import math

import pytest
import torch
from _cbfit import Fit

from gcc.training.callbacks import GradClip
from gcc.training.config import TrainConfig

# Linear(3, 2): weight 2x3 all 1.0, bias 2 all 2.0 -> global norm sqrt(6 * 1 + 2 * 4) = sqrt(14)
GRADS = [torch.ones(2, 3), torch.full((2,), 2.0)]
NORM = math.sqrt(14.0)


def test_the_global_norm_is_clipped_to_max_norm_and_reported_before_clipping():
    clip = GradClip(
        TrainConfig().algorithms.gradient_clipping.clipping_threshold
    )  # the default: 1.0, as build_callbacks passes it
    assert clip.max_norm == 1.0
    fit = Fit([clip])
    fit.fit_start()
    assert math.isnan(clip.last_norm)  # nothing measured yet
    fit.step(grads=GRADS)
    assert clip.last_norm == pytest.approx(NORM)
    w, b = fit.model.weight.grad, fit.model.bias.grad
    after = torch.sqrt(w.pow(2).sum() + b.pow(2).sum())
    assert float(after) == pytest.approx(1.0, rel=1e-5)
    # the direction is kept: every gradient scaled by the same factor
    torch.testing.assert_close(w, GRADS[0] / NORM, rtol=1e-5, atol=0)
    torch.testing.assert_close(b, GRADS[1] / NORM, rtol=1e-5, atol=0)


def test_a_norm_below_max_norm_is_left_as_it_is_and_each_step_reports_its_own():
    clip = GradClip(10.0)
    fit = Fit([clip])
    fit.fit_start()
    fit.step(grads=GRADS)
    assert clip.last_norm == pytest.approx(NORM)
    torch.testing.assert_close(fit.model.weight.grad, GRADS[0])
    fit.step(grads=[g * 2 for g in GRADS])
    assert clip.last_norm == pytest.approx(2 * NORM)


@pytest.mark.parametrize("max_norm", [0, 0.0, None, -1.0])
def test_grad_clip_0_is_off_and_the_norm_is_still_reported(max_norm):
    clip = GradClip(max_norm)
    assert clip.max_norm == math.inf
    fit = Fit([clip])
    fit.fit_start()
    big = [g * 100 for g in GRADS]
    fit.step(grads=big)
    assert clip.last_norm == pytest.approx(100 * NORM)
    torch.testing.assert_close(fit.model.weight.grad, big[0])
    torch.testing.assert_close(fit.model.bias.grad, big[1])
