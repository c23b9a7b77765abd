"""Preemption (gcc/training/callbacks/preemption.py): SIGTERM/SIGUSR1 only set a flag; the flag travels in the step's
reduction (StepSync) and the step that carried it stops training at its BATCH_END (`preempted_at`, Composer's
`stop_training`); a signal after the reduction stops the next step. The signal also arms the rank's grace deadline on
its StallWatchdog; before step 1 `stop_before_first_step` raises PreemptedBeforeFirstStep. FIT_END puts the previous
signal handlers back."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
from _cbfit import Fit
from composer.callbacks import CheckpointSaver
from composer.core import Callback

from gcc.training.callbacks import PreemptedBeforeFirstStep, Preemption, StepSync
from gcc.training.config import TrainConfig
from gcc.workers import PREEMPTION_SIGNALS


class SignalAfterReduce(Callback):
    """Sends this process `signum` at AFTER_TRAIN_BATCH of step `step`, after StepSync's reduction."""

    def __init__(self, step: int, signum: int):
        self.step, self.signum = step, signum

    def after_train_batch(self, state, logger):
        if int(state.timestamp.batch) + 1 == self.step:
            os.kill(os.getpid(), self.signum)


def wired(watchdog, *extra):
    sync = StepSync(2)
    preemption = Preemption(watchdog, TrainConfig().preemption_grace_s, sync)
    fit = Fit([sync, *extra, preemption], max_steps=10)
    return fit, preemption


@pytest.mark.parametrize("signum", PREEMPTION_SIGNALS)
def test_a_signal_stops_training_after_the_step_whose_reduction_carried_it(watchdog, signum):
    fit, preemption = wired(watchdog)
    before = signal.getsignal(signum)
    fit.fit_start()
    fit.step()
    assert preemption.preempted_at is None and preemption.requested is False
    os.kill(os.getpid(), signum)  # the process lives on: the handler only sets the flag
    assert preemption.requested is True
    assert preemption.preempted_at is None and str(fit.state.max_duration) == "10ba"  # nothing until a reduction
    fit.step()
    assert preemption.preempted_at == 2
    assert fit.state.max_duration == fit.state.timestamp.batch  # Composer ends the fit after this step (and saves)
    fit.fit_end()
    assert signal.getsignal(signum) is before  # the previous handler is back
    assert signal.set_wakeup_fd(-1) == -1  # the watchdog no longer listens for signals


def test_a_signal_after_the_steps_reduction_stops_the_next_step(watchdog):
    fit, preemption = wired(watchdog, SignalAfterReduce(2, signal.SIGTERM))
    fit.fit_start()
    try:
        fit.step()
        fit.step()  # the signal came after step 2's reduction
        assert preemption.requested and preemption.preempted_at is None
        assert str(fit.state.max_duration) == "10ba"
        fit.step()
        assert preemption.preempted_at == 3 and int(fit.state.max_duration) == 3
    finally:
        fit.fit_end()


def test_the_signal_arms_the_grace_deadline_on_the_watchdog(watchdog):
    grace = TrainConfig().preemption_grace_s
    fit, _ = wired(watchdog)
    fit.fit_start()
    try:
        t0 = time.monotonic()
        os.kill(os.getpid(), signal.SIGUSR1)
        key = f"signal {int(signal.SIGUSR1)}"
        deadline = time.monotonic() + 30
        while key not in watchdog._due and time.monotonic() < deadline:  # the watchdog's thread arms it
            time.sleep(0.01)
        due, reason = watchdog._due[key]
        assert t0 + grace <= due <= time.monotonic() + grace
        assert reason.startswith("SIGUSR1 received") and f"preemption_grace_s={grace:g} s" in reason
        assert "signal 15" not in watchdog._due  # only the signal that came
    finally:
        fit.fit_end()


def test_before_the_first_step_a_signal_stops_the_fit_before_any_step_and_any_save(watchdog, tmp_path):
    """With Composer's own CheckpointSaver in the fit (a save after every step): the signal raises out of the fit
    before step 1, so no step runs and nothing is saved. Every rank of a launch stopping so, exit 0, no checkpoint:
    tests/training/test_train_e2e.py test_preempted_in_the_step0_validation_..."""
    saver = CheckpointSaver(folder=str(tmp_path / "ckpt"), save_interval="1ba")
    fit, preemption = wired(watchdog, saver)
    weights = [p.detach().clone() for p in fit.model.parameters()]
    fit.fit_start()
    try:
        preemption.stop_before_first_step(fit.state)  # no signal: nothing happens
        assert preemption.preempted_at is None
        os.kill(os.getpid(), signal.SIGTERM)
        with pytest.raises(PreemptedBeforeFirstStep, match="stopped before step 1, after the step-0 validation"):
            preemption.stop_before_first_step(fit.state)
            fit.step()  # what the fit would do next, had nothing raised
        assert preemption.preempted_at == 0
    finally:
        fit.fit_end()
    assert int(fit.state.timestamp.batch) == 0
    assert all(torch.equal(a, b) for a, b in zip(weights, fit.model.parameters()))
    assert not (tmp_path / "ckpt").exists() or not any((tmp_path / "ckpt").iterdir())
