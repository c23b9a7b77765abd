"""Preemption (gcc/training/callbacks/preemption.py): SIGTERM/SIGUSR1 only set a flag; the flag travels in the step's
reduction (StepSync) and the step that carried it stops training at its BATCH_END (`preempted_at`, Composer's
`stop_training`); a signal after the reduction stops the next step. The signal also arms the rank's grace deadline on
its StallWatchdog; before step 1 `stop_before_first_step` raises PreemptedBeforeFirstStep. FIT_END puts the previous
signal handlers back. The preempted step skips what is due there (one log line; the checkpoint records it for the
relaunch's catch-up); a signal in the last step stops nothing. GraceCheck: the first save against the grace."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
from _cbfit import Fit, records
from composer.callbacks import CheckpointSaver
from composer.core import Callback

from gcc.training.callbacks import GraceCheck, PreemptedBeforeFirstStep, Preemption, StepSync
from gcc.training.callbacks.preemption import grace_warning
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


LOGGER = "gcc.training.callbacks.preemption"


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
    # once the fit is over a signal is only noted (nothing is left to save): not the previous handler, which might
    # end the process with 128 + the signal (Composer's) in the middle of the launch's end
    assert signal.getsignal(signum) is not before and signal.getsignal(signum) == preemption._late
    if signum != signal.SIGINT:  # (a second Ctrl-C would stop this process: gcc/training/test_train_e2e.py)
        os.kill(os.getpid(), signum)
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


# rank 1 of the group (tests/_launch.py `rank_0_here`): it received the signal, rank 0 did not
SIGNALLED_RANK1 = """
from types import SimpleNamespace
from composer.devices import DeviceCPU
from gcc.training.callbacks import PreemptedBeforeFirstStep, Preemption, StepSync

preemption = Preemption(None, 60.0, StepSync(2))
preemption.requested = True
try:
    preemption.stop_before_first_step(SimpleNamespace(device=DeviceCPU(), timestamp=SimpleNamespace(batch=0)))
    print("not stopped", flush=True)
except PreemptedBeforeFirstStep as e:
    print(f"stopped at {preemption.preempted_at}: {e}", flush=True)
"""


@pytest.mark.slow  # starts rank 1's process
def test_before_the_first_step_a_signal_on_any_rank_stops_every_rank():
    """In a real 2-process gloo group, rank 1 alone received a signal: both ranks stop before step 1."""
    from types import SimpleNamespace

    from _launch import rank_0_here
    from composer.devices import DeviceCPU

    with rank_0_here(SIGNALLED_RANK1) as rank1:
        preemption = Preemption(None, 60.0, StepSync(2))
        with pytest.raises(PreemptedBeforeFirstStep, match="stopped before step 1"):
            preemption.stop_before_first_step(SimpleNamespace(device=DeviceCPU(), timestamp=SimpleNamespace(batch=0)))
        out, err = rank1.communicate(timeout=120)
    assert rank1.returncode == 0, err[-3000:]
    assert preemption.preempted_at == 0 and out.startswith("stopped at 0: preempted: stopped before step 1"), out


def test_the_preempted_step_skips_what_is_due_there_says_so_once_and_its_checkpoint_records_it(watchdog):
    fit, preemption = wired(watchdog)
    preemption.skippable("validation", lambda step: step % 3 == 0)
    preemption.skippable("export", lambda step: step % 6 == 0)
    fit.fit_start()
    try:
        fit.step()
        fit.step()
        assert not preemption.skips("validation", 3) and preemption.state_dict() == {"step": -1, "skipped": ""}
        os.kill(os.getpid(), signal.SIGTERM)
        with records(LOGGER) as got:
            fit.step()  # step 3: validation due, export not
        assert [r.getMessage() for r in got] == [
            "preempted at step 3: saving now, skipped validation (the relaunch runs them first)"
        ]
        assert preemption.skips("validation", 3) and not preemption.skips("export", 3)
        assert not preemption.skips("validation", 6)
    finally:
        fit.fit_end()
    checkpoint = preemption.state_dict()  # what Composer writes at step 3's BATCH_CHECKPOINT
    assert checkpoint == {"step": 3, "skipped": "validation"}
    resumed = Preemption(watchdog, 25.0, StepSync(2))
    resumed.load_state_dict(checkpoint)
    assert resumed.catch_up("validation", 3) and not resumed.catch_up("export", 3)
    assert not resumed.catch_up("validation", 6)  # only at the step it resumes from
    later = Preemption(watchdog, 25.0, StepSync(2))
    later.load_state_dict({"step": -1, "skipped": ""})  # a periodic checkpoint: nothing to catch up
    assert later.pending is None


def test_a_preemption_with_nothing_due_skips_nothing(watchdog):
    fit, preemption = wired(watchdog)
    preemption.skippable("validation", lambda step: step % 3 == 0)
    fit.fit_start()
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        with records(LOGGER) as got:
            fit.step()
        assert [r.getMessage() for r in got] == ["preempted at step 1: saving now"] and preemption.skipped == []
    finally:
        fit.fit_end()


def test_a_signal_in_the_last_step_stops_nothing_and_skips_nothing(watchdog):
    """The run ends at that step anyway: its last validation and export run (a relaunch would find nothing to do)."""
    fit, preemption = wired(watchdog)
    preemption.skippable("validation", lambda step: step % 5 == 0)
    fit.fit_start()
    try:
        for _ in range(9):
            fit.step()
        os.kill(os.getpid(), signal.SIGTERM)
        with records(LOGGER) as got:
            fit.step()  # step 10 of 10
        assert preemption.preempted_at is None and not preemption.skips("validation", 10)
        assert [r.getMessage() for r in got] == [
            "preemption signal in the last step (10): the run ends there as it would have"
        ]
    finally:
        fit.fit_end()


def test_the_grace_warning_adds_a_step_the_save_and_the_upload():
    assert grace_warning(25.0, 1000, 41.2, 12.0, 3.1) == (
        "the first checkpoint took 41.2 s to save (+12.0 s upload and commit); with a step of 3.1 s that is "
        "56.3 s > preemption_grace_s=25: a preemption would exit 5 and lose up to save_interval=1000 steps; raise "
        'preemption_grace_s to at least 57 s, and the scheduler\'s grace with it (docs/training.md, "Preemption grace")'
    )
    assert grace_warning(25.0, 1000, 20.0, None, 4.9) is None  # 24.9 s fits
    assert grace_warning(25.0, 1000, 20.0, None, 5.0) is None  # 25 s, just: it fits
    assert grace_warning(25.0, 1000, 20.0, 0.2, 4.9) is not None  # 25.1 s does not
    line = grace_warning(0.001, 3, 0.5)
    assert line is not None
    assert line.startswith("the first checkpoint took 0.5 s to save; with no step timed yet that is 0.5 s > ")
    assert "preemption_grace_s=0.001:" in line and "save_interval=3 steps" in line


def test_the_grace_check_warns_once_when_the_first_save_and_its_commit_are_known():
    saves: dict[int, float] = {}
    commits: dict[int, float] = {}
    check = GraceCheck(10.0, 3, saves, [1.0, 3.0, 2.0], commits)
    fit = Fit([check])
    with records(LOGGER) as got:
        check.batch_checkpoint(fit.state, fit.logger)  # no save yet
        saves[3] = 8.5
        check.batch_checkpoint(fit.state, fit.logger)  # saved, not committed yet (a background write, an upload)
        assert got == [] and not check.checked
        commits[3] = 0.25
        saves[6] = 100.0  # a later save is not the first
        check.batch_checkpoint(fit.state, fit.logger)
        check.fit_end(fit.state, fit.logger)
    [line] = [r.getMessage() for r in got]
    assert line.startswith("the first checkpoint took 8.5 s to save (+0.2 s upload and commit); with a step of 2.0 s")
    assert "that is 10.8 s > preemption_grace_s=10:" in line
    quiet = GraceCheck(60.0, 3, {3: 8.5}, [2.0])  # no store; it fits
    with records(LOGGER) as got:
        quiet.fit_end(fit.state, fit.logger)
    assert got == [] and quiet.checked


def test_a_resume_says_at_its_first_step_what_it_runs_first(watchdog):
    """The checkpoint of a preempted step records what was skipped there; the relaunch from it names that work at
    FIT_START, at that step only."""
    for step, said in ((6, ["step 6: running first what the preempted launch skipped there: validation, export"]),
                       (5, [])):  # fmt: skip
        fit, preemption = wired(watchdog)
        preemption.load_state_dict({"step": 6, "skipped": "validation,export"})
        fit.state.timestamp = fit.state.timestamp.copy(batch=step)
        with records(LOGGER) as got:
            fit.fit_start()
        fit.fit_end()
        assert [r.getMessage() for r in got] == said


def test_after_the_fit_a_signal_is_noted_and_only_a_second_ctrl_c_stops_at_once(watchdog, monkeypatch):
    """Once the fit is over (the last save may run), SIGTERM and a first Ctrl-C are noted; a second Ctrl-C (the
    first may have come during training) leaves at once with exit 130, on every rank's console."""
    import gcc.training.ending as ending
    from gcc import exit_codes

    def leave_now(code):
        raise SystemExit(code)

    monkeypatch.setattr(ending, "leave_now", leave_now)
    before = {s: signal.getsignal(s) for s in PREEMPTION_SIGNALS}
    for during_fit in (False, True):
        fit, preemption = wired(watchdog)
        fit.fit_start()
        try:
            if during_fit:
                os.kill(os.getpid(), signal.SIGINT)  # noted by the handler of the fit
                assert preemption.requested and preemption.interrupted is True
            fit.fit_end()
            os.kill(os.getpid(), signal.SIGTERM)
            if not during_fit:
                os.kill(os.getpid(), signal.SIGINT)  # a first Ctrl-C, after the fit
                assert preemption.interrupted is True
            with records(LOGGER) as got, pytest.raises(SystemExit) as left:
                os.kill(os.getpid(), signal.SIGINT)
        finally:  # this process's own handlers again, whatever failed: a later Ctrl-C must reach pytest
            for s, handler in before.items():
                signal.signal(s, handler)
        assert left.value.code == exit_codes.INTERRUPTED
        assert [(r.getMessage(), getattr(r, "all_ranks", False)) for r in got] == [
            ("a second Ctrl-C (SIGINT): stopped at once", True)
        ]
