"""StepDeadline (gcc/training/callbacks/step_deadline.py): the deadline for the next step on the rank's StallWatchdog
("step"): `stall_timeout_s` until WARMUP step times are known, then max(stall_floor_s, FACTOR × the median of the last
WINDOW step times), capped by stall_timeout_s; validation, a step followed by a checkpoint or an export, and the end
of the launch get stall_timeout_s again, a validation's time and a save's are no step's, 0 turns it off, CLOSE clears it."""

from __future__ import annotations

import statistics
import time

import pytest
from _cbfit import Fit
from composer.callbacks import CheckpointSaver
from composer.core import Callback, Event

from gcc.training.callbacks import StepDeadline
from gcc.training.callbacks.step_deadline import FACTOR, WARMUP, WINDOW, writes_at
from gcc.training.checkpoint.files import ckpt_dir
from gcc.training.config import TrainConfig
from gcc.training.watchdog import StallWatchdog


@pytest.fixture
def watchdog(tmp_path):
    """A real watchdog whose thread never wakes to check its deadlines (poll_s of an hour, no signal handler): the
    tests read what is armed, and a short deadline cannot end the test process."""
    w = StallWatchdog(tmp_path, 0, poll_s=3600)
    yield w
    assert w.stop(10)


def armed(w: StallWatchdog) -> tuple[float, str] | None:
    """The "step" deadline: (seconds from now, reason), or None."""
    if "step" not in w._due:
        return None
    due, reason = w._due["step"]
    return due - time.monotonic(), reason


def test_the_launch_starts_with_stall_timeout_s_and_keeps_it_through_the_warm_up(watchdog):
    cfg = TrainConfig()
    cb = StepDeadline(watchdog, cfg.stall_timeout_s, cfg.stall_floor_s)  # 1800 s, 300 s
    fit = Fit([cb], max_steps=100)
    assert armed(watchdog) is None
    fit.fit_start()
    left, reason = armed(watchdog)
    assert cfg.stall_timeout_s - 5 < left <= cfg.stall_timeout_s
    assert reason == "no step completed within 1800 s (stall_timeout_s=1800, stall_floor_s=300)"
    fit.step()
    assert cb.times == []  # the first step's time (model build, compilation) is not timed
    for _ in range(WARMUP - 1):
        fit.step()
    assert len(cb.times) == WARMUP - 1 and cb.deadline() == cfg.stall_timeout_s
    assert armed(watchdog)[0] > cfg.stall_timeout_s - 5
    fit.step()  # WARMUP step times: quick steps, so the floor
    assert len(cb.times) == WARMUP
    assert cb.deadline() == cfg.stall_floor_s
    left, reason = armed(watchdog)
    assert cfg.stall_floor_s - 5 < left <= cfg.stall_floor_s
    assert reason.startswith("no step completed within 300 s")


def test_after_the_warm_up_the_deadline_is_factor_times_the_median_step(watchdog):
    cb = StepDeadline(watchdog, timeout_s=600, floor_s=0.01)
    fit = Fit([cb], max_steps=100)
    fit.fit_start()
    for _ in range(WARMUP + 1):
        fit.step(data_wait=0.03)
    assert min(cb.times) >= 0.03
    expected = FACTOR * statistics.median(cb.times)
    assert cb.deadline() == pytest.approx(expected)
    assert expected - 1 < armed(watchdog)[0] <= expected


def test_the_deadline_is_capped_by_stall_timeout_s(watchdog):
    cb = StepDeadline(watchdog, timeout_s=0.5, floor_s=0.01)
    fit = Fit([cb], max_steps=100)
    fit.fit_start()
    for _ in range(WARMUP + 1):
        fit.step(data_wait=0.03)  # FACTOR x median >= 0.6 s
    assert cb.deadline() == 0.5


def test_the_median_is_of_the_last_window_steps_only(watchdog):
    cb = StepDeadline(watchdog, timeout_s=600, floor_s=0.0)
    fit = Fit([cb], max_steps=200)
    fit.fit_start()
    for _ in range(WARMUP + 1):
        fit.step(data_wait=0.05)  # slow steps first ...
    slow = cb.deadline()
    for _ in range(WINDOW):
        fit.step()  # ... then WINDOW quick ones: the slow ones no longer count
    assert slow >= FACTOR * 0.05
    assert cb.deadline() == pytest.approx(FACTOR * statistics.median(cb.times[-WINDOW:]))
    # below the slow steps' deadline: the quick steps are the slow ones less their wait (no absolute limit, which a
    # loaded machine could pass)
    assert cb.deadline() < slow


def test_validation_gets_stall_timeout_s_and_its_time_is_no_steps(watchdog):
    cb = StepDeadline(watchdog, timeout_s=900, floor_s=60)
    fit = Fit([cb], max_steps=100)
    fit.fit_start()
    for _ in range(WARMUP + 1):
        fit.step()
    assert armed(watchdog)[0] <= 60
    fit.event(Event.EVAL_START)
    assert armed(watchdog)[0] > 900 - 5
    time.sleep(0.3)  # the validation
    fit.event(Event.EVAL_END)
    assert armed(watchdog)[0] <= 60  # back to the step deadline
    fit.step()
    assert cb.times[-1] < 0.3


def test_the_end_of_the_launch_gets_stall_timeout_s_and_close_clears_it(watchdog):
    cb = StepDeadline(watchdog, timeout_s=900, floor_s=60)
    fit = Fit([cb], max_steps=100)
    fit.fit_start()
    for _ in range(WARMUP + 1):
        fit.step()
    fit.fit_end()
    assert armed(watchdog)[0] > 900 - 5
    cb.close(fit.state, fit.logger)  # Composer's Engine.close(): Trainer.close() or the fit's teardown
    assert armed(watchdog) is None


def test_stall_timeout_s_0_arms_nothing(watchdog):
    cb = StepDeadline(watchdog, timeout_s=0, floor_s=300)
    fit = Fit([cb], max_steps=100)
    fit.fit_start()
    for _ in range(WARMUP + 2):
        fit.step()
    fit.event(Event.EVAL_START)
    fit.event(Event.EVAL_END)
    fit.fit_end()
    assert watchdog._due == {}


class ArmedAtSave(Callback):
    """Before Composer's CheckpointSaver at BATCH_CHECKPOINT: the step deadline a save then runs under."""

    def __init__(self, watchdog):
        self.watchdog, self.seen = watchdog, {}

    def batch_checkpoint(self, state, logger):
        self.seen[int(state.timestamp.batch)] = armed(self.watchdog)[0]


class SlowSave(Callback):
    """Composer's save taking `seconds` (before the saver at BATCH_CHECKPOINT, on the steps that save)."""

    def __init__(self, seconds: float, every: int):
        self.seconds, self.every = seconds, every

    def batch_checkpoint(self, state, logger):
        if int(state.timestamp.batch) % self.every == 0:
            time.sleep(self.seconds)


def test_every_checkpoint_including_the_final_one_is_written_under_stall_timeout_s(watchdog, tmp_path):
    """Composer saves at the step's BATCH_CHECKPOINT (the end-of-training save too, before FIT_END): each save runs
    under what BATCH_END armed. After the save (`after_save`, after the saver) the step deadline is back, and the
    next step is timed from the save's end: a save's time is no step's."""
    steps, every = WARMUP + 6, WARMUP + 2
    cb = StepDeadline(watchdog, timeout_s=900, floor_s=60, writes=writes_at(steps, every, 0))
    probe = ArmedAtSave(watchdog)
    saver = CheckpointSaver(folder=str(ckpt_dir(tmp_path)), save_interval=f"{every}ba", num_checkpoints_to_keep=-1)
    fit = Fit([cb, probe, SlowSave(0.5, every), saver, cb.after_save], max_steps=steps)
    fit.fit_start()
    for _ in range(every):
        fit.step()
    assert int(saver.last_checkpoint_batch) == every
    assert probe.seen[every] > 900 - 5  # the save at step `every`
    assert probe.seen[every - 1] <= 60  # a step with no save: the step deadline
    assert armed(watchdog)[0] <= 60  # after the save: the step deadline again
    timed = len(cb.times)
    fit.step()
    assert len(cb.times) == timed + 1 and cb.times[-1] < 0.5  # timed from the save's end
    assert probe.seen[every + 1] <= 60
    for _ in range(steps - every - 1):
        fit.step()
    assert int(saver.last_checkpoint_batch) == steps  # Composer's end-of-training save, at the last BATCH_CHECKPOINT
    assert probe.seen[steps] > 900 - 5
    fit.fit_end()
    assert armed(watchdog)[0] > 900 - 5


def test_a_validation_before_a_save_hands_the_save_stall_timeout_s(watchdog):
    """Validation runs between BATCH_END and BATCH_CHECKPOINT: its end must not shorten the save's deadline."""
    cb = StepDeadline(watchdog, timeout_s=900, floor_s=60, writes=writes_at(100, 0, WARMUP + 1))
    fit = Fit([cb], max_steps=100)
    fit.fit_start()
    for _ in range(WARMUP + 1):
        fit.step()
    assert armed(watchdog)[0] > 900 - 5  # an export follows this step
    fit.event(Event.EVAL_START)
    fit.event(Event.EVAL_END)
    assert armed(watchdog)[0] > 900 - 5


def test_writes_at_names_every_interval_and_the_last_step():
    writes = writes_at(25, 10, 0, 4)
    assert [s for s in range(1, 26) if writes(s)] == [4, 8, 10, 12, 16, 20, 24, 25]


def test_frequent_saves_do_not_delay_the_step_deadline(watchdog):
    """A run that writes every 3 steps times every step (from each save's end): after WARMUP + 1 steps the deadline
    is the floor, as without saves (CI: a stall after 14 steps waited stall_timeout_s while saves cost timings)."""
    cb = StepDeadline(watchdog, timeout_s=900, floor_s=60, writes=writes_at(100, 3, 6))
    fit = Fit([cb, cb.after_save], max_steps=100)
    fit.fit_start()
    for _ in range(WARMUP + 1):
        fit.step()
    assert len(cb.times) == WARMUP and cb.deadline() == 60
    fit.step()  # step WARMUP + 2 (12): a checkpoint and an export follow, then the step deadline again
    assert armed(watchdog)[0] <= 60
