"""GradClip (gcc/training/callbacks/grad_clip.py): at the step's reduce (StepSync, at AFTER_TRAIN_BATCH: after
backward, before the update) the global gradient norm is clipped to `algorithms.gradient_clipping.clipping_threshold`
and the norm before clipping rides the reduce (`totals["grad_norm"]`); `clipping_threshold: 0` turns clipping off
but still reports the norm."""

from __future__ import annotations

import math

import pytest
import torch
from _cbfit import Fit

from gcc.training.callbacks import GradClip, StepSync
from gcc.training.config import TrainConfig

# Linear(3, 2): weight 2x3 all 1.0, bias 2 all 2.0 -> global norm sqrt(6 * 1 + 2 * 4) = sqrt(14)
GRADS = [torch.ones(2, 3), torch.full((2,), 2.0)]
NORM = math.sqrt(14.0)


def _wired(max_norm):
    sync = StepSync(per_rank_batch=2)
    clip = GradClip(max_norm, sync)
    fit = Fit([sync, clip])
    fit.fit_start()
    return fit, sync, clip


def test_the_global_norm_is_clipped_to_max_norm_and_reported_before_clipping():
    # the default: 1.0, as build_callbacks passes it
    fit, sync, clip = _wired(TrainConfig().algorithms.gradient_clipping.clipping_threshold)
    assert clip.max_norm == 1.0
    assert clip.norm is None  # nothing measured yet
    fit.step(grads=GRADS)
    assert sync.totals["grad_norm"] == pytest.approx(NORM)
    assert isinstance(clip.norm, torch.Tensor)  # kept on the device until the reduce reads it
    w, b = fit.model.weight.grad, fit.model.bias.grad
    after = torch.sqrt(w.pow(2).sum() + b.pow(2).sum())
    assert float(after) == pytest.approx(1.0, rel=1e-5)
    # the direction is kept: every gradient scaled by the same factor
    torch.testing.assert_close(w, GRADS[0] / NORM, rtol=1e-5, atol=0)
    torch.testing.assert_close(b, GRADS[1] / NORM, rtol=1e-5, atol=0)


def test_a_norm_below_max_norm_is_left_as_it_is_and_each_step_reports_its_own():
    fit, sync, _ = _wired(10.0)
    fit.step(grads=GRADS)
    assert sync.totals["grad_norm"] == pytest.approx(NORM)
    torch.testing.assert_close(fit.model.weight.grad, GRADS[0])
    fit.step(grads=[g * 2 for g in GRADS])
    assert sync.totals["grad_norm"] == pytest.approx(2 * NORM)


@pytest.mark.parametrize("max_norm", [0, 0.0, None, -1.0])
def test_grad_clip_0_is_off_and_the_norm_is_still_reported(max_norm):
    fit, sync, clip = _wired(max_norm)
    assert clip.max_norm == math.inf
    big = [g * 100 for g in GRADS]
    fit.step(grads=big)
    assert sync.totals["grad_norm"] == pytest.approx(100 * NORM)
    torch.testing.assert_close(fit.model.weight.grad, big[0])
    torch.testing.assert_close(fit.model.bias.grad, big[1])
