"""NonFiniteGuard (gcc/training/callbacks/nonfinite.py): a NaN/inf micro-batch loss stops training with
NonFiniteLoss at that step's AFTER_TRAIN_BATCH (inside the optimizer closure: before the update), naming the step and
the clips; `faults.nonfinite_step` (its `inject_step`) poisons the loss of that step, and only that step."""

from __future__ import annotations

import math

import pytest
import torch
from _cbfit import Fit, micro
from composer.core import Callback

from gcc.training.callbacks import NonFiniteGuard, NonFiniteLoss, StepSync


class Updates(Callback):
    """Counts the optimizer updates: Composer's optimizer step follows AFTER_TRAIN_BATCH, whose raise skips it."""

    def __init__(self):
        self.steps = 0

    def batch_end(self, state, logger):
        self.steps += 1


def wired(inject_step: int = 0):
    sync = StepSync(4)  # first at AFTER_TRAIN_BATCH, as build_callbacks orders them
    guard = NonFiniteGuard(sync, inject_step, 0)
    updates = Updates()
    fit = Fit([sync, guard, updates])
    fit.fit_start()
    return fit, sync, updates


def test_finite_losses_pass_and_a_nan_stops_at_its_step_naming_its_clips():
    fit, sync, updates = wired()
    fit.step([micro(["a", "b"], [0, 1], loss=0.4), micro(["c"], [2], loss=0.3)])
    fit.step([micro(["d"], [3], loss=0.2)])
    assert updates.steps == 2 and sync.totals["nonfinite"] == 0
    weights = [p.detach().clone() for p in fit.model.parameters()]
    with pytest.raises(NonFiniteLoss) as e:
        fit.step([micro(["e", "f"], [4, 5], loss=0.1), micro(["g"], [6], loss=float("nan"))])
    assert sync.totals["nonfinite"] == 1  # the count travelled in the step's reduction
    assert "non-finite loss at step 3 (rank 0: clips e;f;g)" in str(e.value)
    assert "before the update" in str(e.value)
    assert updates.steps == 2  # raised before BATCH_END: no checkpoint of the bad step ...
    for p, w in zip(fit.model.parameters(), weights):  # ... and before the optimizer's update
        torch.testing.assert_close(p.detach(), w, rtol=0, atol=0)
    assert fit.step_count == 2


@pytest.mark.parametrize("bad", [float("inf"), float("-inf")])
def test_an_infinite_loss_counts_as_non_finite(bad):
    fit, _, _ = wired()
    with pytest.raises(NonFiniteLoss, match="at step 1"):
        fit.step([micro(["a"], [0], loss=bad)])


def test_a_loss_dict_is_checked_by_its_total():
    fit, _, _ = wired()
    batch, outputs, _ = micro(["a"], [0])
    fit.step([(batch, outputs, {"total": torch.tensor(0.5), "mse": torch.tensor(float("nan"))})])
    with pytest.raises(NonFiniteLoss, match="at step 2"):
        fit.step([(batch, outputs, {"total": torch.tensor(float("nan")), "mse": torch.tensor(0.5)})])


def test_injection_poisons_exactly_the_configured_step():
    fit, _, updates = wired(inject_step=3)
    fit.step()
    fit.step()
    assert updates.steps == 2
    assert math.isfinite(float(fit.state.loss))
    with pytest.raises(NonFiniteLoss, match="at step 3"):
        fit.step()
    assert math.isnan(float(fit.state.loss))  # this rank's loss itself: its backward is poisoned too


def test_a_non_finite_loss_of_an_earlier_step_is_not_counted_again():
    """BATCH_START starts the step's list over: a step after a (hypothetically survived) bad micro-batch is clean."""
    fit, sync, _ = wired()
    with pytest.raises(NonFiniteLoss):
        fit.step([micro(["a"], [0], loss=float("nan"))])
    fit.step([micro(["b"], [1], loss=0.5)])
    assert sync.totals["nonfinite"] == 0
