"""ValidationLog and ValidateAtStart (gcc/training/callbacks/validation.py). ValidationLog: after each validation, one
`val_log` row per timestep from the objective's `val_mse` metric (mse, the two variants, their gaps to mse, the clip
count) at the step validated, and `val/<k>_t<t>` and `val/<k>_mean` scalars. ValidateAtStart: the step-0 validation
at the first EPOCH_START of a launch starting at step 0 (never later), then every rank stops before step 1 if a
preemption signal came (`PreemptedBeforeFirstStep`); on a resume, at FIT_START, the validation that the preempted
launch skipped at the checkpoint's step."""

from __future__ import annotations

import os
import signal

import pytest
import torch
from _cbfit import Fit
from composer.core import Event, Timestamp

from gcc.model.objective import GcValMSE
from gcc.training.builders import build_evaluators
from gcc.training.callbacks import (
    VAL_COLUMNS,
    PreemptedBeforeFirstStep,
    Preemption,
    StepSync,
    ValidateAtStart,
    ValidationLog,
)
from gcc.training.config import TrainConfig
from gcc.training.watchdog import StallWatchdog
from gcc.workers import PREEMPTION_SIGNALS


def validated_metric() -> GcValMSE:
    """Two timesteps, two val batches (2 clips, then 1): per (timestep, clip) mse of the cond, uncond and
    null-text variants, as GcTrainModel.update_metric feeds them."""
    m = GcValMSE([200, 500])
    t = torch.tensor
    m.update(t([[1.0, 3.0], [2.0, 2.0]]), t([[2.0, 4.0], [4.0, 4.0]]), t([[1.0, 1.0], [3.0, 3.0]]))
    m.update(t([[5.0], [8.0]]), t([[6.0], [10.0]]), t([[1.0], [9.0]]))
    return m


EXPECTED = [
    {"step": 6, "timestep": 200.0, "mse": 3.0, "mse_uncond": 4.0, "mse_nulltext": 1.0, "gap_uncond": 1.0,
     "gap_nulltext": -2.0, "n": 3},
    {"step": 6, "timestep": 500.0, "mse": 4.0, "mse_uncond": 6.0, "mse_nulltext": 5.0, "gap_uncond": 2.0,
     "gap_nulltext": 1.0, "n": 3},
]  # fmt: skip


def at_step(fit: Fit, batch: int) -> None:
    fit.state.timestamp = Timestamp(batch=batch, sample=2 * batch, batch_in_epoch=batch, sample_in_epoch=2 * batch)


def test_a_row_per_timestep_and_scalars_at_the_step_validated():
    val = ValidationLog("val")
    fit = Fit([val])
    fit.fit_start()
    at_step(fit, 6)
    fit.state.eval_metrics = {"val": {"val_mse": validated_metric()}}
    fit.event(Event.EVAL_END)
    assert val.last == EXPECTED
    assert fit.table("val_log") == EXPECTED
    assert list(fit.table("val_log")[0]) == VAL_COLUMNS
    m = fit.memory.most_recent_values
    assert m["val/mse_t200.0"] == 3.0 and m["val/gap_nulltext_t200.0"] == -2.0
    assert m["val/mse_uncond_t500.0"] == 6.0 and m["val/gap_uncond_t500.0"] == 2.0
    means = {k: m[f"val/{k}_mean"] for k in ("mse", "mse_uncond", "mse_nulltext", "gap_uncond", "gap_nulltext")}
    assert means == {"mse": 3.5, "mse_uncond": 5.0, "mse_nulltext": 3.0, "gap_uncond": 1.5, "gap_nulltext": -0.5}
    assert len([k for k in m if k.startswith("val/")]) == 5 * 2 + 5
    assert fit.memory.most_recent_timestamps["val/mse_mean"].batch == 6


def test_another_evaluators_end_logs_nothing():
    val = ValidationLog("val")
    fit = Fit([val])
    fit.fit_start()
    fit.state.eval_metrics = {"other": {"val_mse": validated_metric()}}
    fit.event(Event.EVAL_END)
    assert val.last == [] and fit.memory.tables == {} and fit.memory.most_recent_values == {}


@pytest.fixture
def preemption(tmp_path):
    """A real Preemption on a watchdog whose thread checks deadlines only when a signal wakes it; the process's
    signal handlers are restored after the test."""
    handlers = {s: signal.getsignal(s) for s in PREEMPTION_SIGNALS}
    watchdog = StallWatchdog(tmp_path, 0, poll_s=3600)
    yield Preemption(watchdog, TrainConfig().preemption_grace_s, StepSync(2))
    assert watchdog.stop(10)
    for s, h in handlers.items():
        signal.signal(s, h)


def wired(preemption, inject_sigterm=False, during=None, at=0):
    """preemption, validation log and ValidateAtStart in build_callbacks' order, for a launch that starts at step
    `at` (a resume when > 0); `evaluate` stands for the Trainer's eval(): the validation's EVAL_START/EVAL_END with
    the metric filled, `during` run while it validates."""
    val = ValidationLog("val")
    at_start = ValidateAtStart(preemption, at == 0, inject_sigterm)
    fit = Fit([preemption.sync, preemption, val, at_start])
    if at:
        at_step(fit, at)
    calls = []

    def evaluate():
        calls.append(int(fit.state.timestamp.batch))
        fit.event(Event.EVAL_START)
        if during is not None:
            during()
        fit.state.eval_metrics = {"val": {"val_mse": validated_metric()}}
        fit.event(Event.EVAL_END)

    at_start.evaluate = evaluate
    fit.fit_start()
    return fit, val, calls


def test_the_step_0_validation_runs_at_the_first_epoch_start_only(preemption):
    fit, _, calls = wired(preemption)
    try:
        fit.event(Event.EPOCH_START)
        assert calls == [0]
        assert [r["step"] for r in fit.table("val_log")] == [0, 0]  # the baseline rows of the starting weights
        fit.step()
        at_step(fit, 5)
        fit.event(Event.EPOCH_START)  # a later epoch: no validation
        assert calls == [0]
        assert preemption.preempted_at is None
    finally:
        fit.fit_end()


def test_no_evaluate_no_validation(preemption):
    val = ValidationLog("val")
    fit = Fit([preemption, val, ValidateAtStart(preemption)])
    fit.fit_start()
    try:
        fit.event(Event.EPOCH_START)  # the Trainer was not built yet: nothing to run
        assert val.last == []
    finally:
        fit.fit_end()


def test_a_signal_during_the_step_0_validation_stops_before_step_1(preemption):
    fit, val, calls = wired(preemption, during=lambda: os.kill(os.getpid(), signal.SIGTERM))
    try:
        with pytest.raises(PreemptedBeforeFirstStep, match="stopped before step 1"):
            fit.event(Event.EPOCH_START)
        assert calls == [0] and [r["step"] for r in val.last] == [0, 0]  # the validation finished first
        assert preemption.preempted_at == 0
    finally:
        fit.fit_end()


def test_injected_sigterm_at_the_step_0_validation(preemption):
    fit, _, calls = wired(preemption, inject_sigterm=True)  # the last rank (here: the only one) sends it
    try:
        with pytest.raises(PreemptedBeforeFirstStep):
            fit.event(Event.EPOCH_START)
        assert calls == [0] and preemption.requested
    finally:
        fit.fit_end()


@pytest.mark.parametrize("skipped", ["validation", "export", ""])
def test_a_resume_validates_first_only_what_its_preempted_launch_skipped_at_that_step(preemption, skipped):
    """The checkpoint of step 6 was written by a launch preempted there (Preemption.state_dict): its relaunch
    validates step 6 at FIT_START when that launch skipped the validation, and never the step-0 one."""
    preemption.load_state_dict({"step": 6, "skipped": skipped})  # what Composer loads from the checkpoint
    fit, val, calls = wired(preemption, at=6)
    try:
        assert calls == ([6] if skipped == "validation" else [])
        assert [r["step"] for r in val.last] == ([6, 6] if skipped == "validation" else [])
        fit.event(Event.EPOCH_START)  # an epoch's start of a resume: no step-0 validation
        assert len(calls) == (skipped == "validation") and preemption.preempted_at is None
    finally:
        fit.fit_end()


def test_a_resume_at_another_step_than_the_skipped_one_validates_nothing_first(preemption):
    preemption.load_state_dict({"step": 6, "skipped": "validation"})
    fit, _, calls = wired(preemption, at=9)
    try:
        assert calls == []
    finally:
        fit.fit_end()


def test_the_evaluator_skips_the_validation_of_the_preempted_step_only(preemption):
    """builders.build_evaluators: Composer asks at each BATCH_END, after the preemption's handler, whether to
    validate; the validation due at the step the ranks stopped after on a signal is skipped (and named)."""
    cfg = TrainConfig()
    cfg.eval_interval = 3
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(2, 1)))
    [evaluator] = build_evaluators(cfg, loader, preemption)
    fit = Fit([preemption.sync, preemption])
    fit.fit_start()
    try:
        asked = []
        for _ in range(6):
            if fit.step_count == 5:
                os.kill(os.getpid(), signal.SIGTERM)  # reaches step 6's reduction
            fit.step()
            asked.append(evaluator.eval_interval(fit.state, Event.BATCH_END))
        assert asked == [False, False, True, False, False, False]  # step 6 was due, and preempted
        assert preemption.preempted_at == 6 and preemption.skipped == ["validation"]
    finally:
        fit.fit_end()


@pytest.mark.parametrize("max_steps, due", [(7, True), (6, False)])
def test_the_evaluator_validates_once_more_at_the_end_unless_the_last_step_just_did(preemption, max_steps, due):
    """builders.build_evaluators at FIT_END: the last step 7 is no multiple of 3, so the end validates; 6 just did.
    Its label is "val", the one ValidationLog writes val_log.csv for."""
    cfg = TrainConfig()
    cfg.eval_interval, cfg.max_duration = 3, max_steps
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(2, 1)))
    [evaluator] = build_evaluators(cfg, loader, preemption)
    fit = Fit([preemption.sync, preemption])
    fit.fit_start()
    try:
        at_step(fit, max_steps)
        assert evaluator.eval_interval(fit.state, Event.FIT_END) is due and evaluator.label == "val"
        assert evaluator.eval_interval(fit.state, Event.EPOCH_END) is False  # only the two events
    finally:
        fit.fit_end()
