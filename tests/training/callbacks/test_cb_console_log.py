"""ConsoleLog (gcc/training/callbacks/console_log.py): every `console_log_interval` steps, at the launch's last step and
at the step a preemption stops, one `gcc.train` line: step/max, the mean loss of the steps since the last line, lr,
grad_norm, s/step over that period, data wait, sem_rms, elapsed and eta (from the pace since the launch's first
line); after each validation one line per
timestep. With `console` False (Composer's bar on a terminal) the lines are marked for train.log alone."""

from __future__ import annotations

import os
import re
import signal
import time

import torch
from _cbfit import Fit, micro, records
from composer.core import Event

from gcc.model.objective import GcValMSE
from gcc.training.callbacks import ConsoleLog, GradClip, Preemption, StepSync, TrainStats, ValidationLog
from gcc.training.callbacks.console_log import console_lines_wanted, duration
from gcc.training.config import TrainConfig

GRADS = [torch.ones(2, 3), torch.full((2,), 2.0)]  # global norm sqrt(14) = 3.742
LINE = re.compile(
    r"step (\d+)/(\d+)  loss ([\d.]+)  lr ([\d.e+-]+)  grad_norm ([\d.]+)  ([\d.]+) s/step  data ([\d.]+) s/step  "
    r"sem_rms ([\d.]+)  elapsed (\S+)  eta (\S+)"
)


def wired(watchdog, every: int, max_steps: int, console: bool = True, clock=time.monotonic):
    """The callbacks ConsoleLog reads, in build_callbacks' order, ConsoleLog after them."""
    sync = StepSync(2)
    grad_clip = GradClip(10.0, sync)
    stats = TrainStats(sync, [f"c{i}" for i in range(2 * max_steps)])
    preemption = Preemption(watchdog, TrainConfig().preemption_grace_s, sync)
    val = ValidationLog("val")
    console_log = ConsoleLog(every, max_steps, stats, val, preemption, console=console, clock=clock)
    fit = Fit([sync, grad_clip, stats, preemption, val, console_log], max_steps=max_steps)
    fit.fit_start()
    return fit, preemption


def step(fit: Fit, loss: float, data_wait: float = 0.0) -> None:
    b = fit.step_count
    fit.step(
        [micro([f"c{2 * b}", f"c{2 * b + 1}"], [2 * b, 2 * b + 1], sem_rms=0.25, x_rms=1.0)],
        grads=GRADS,
        total_loss=loss,
        data_wait=data_wait,
    )


def test_a_line_every_n_steps_and_at_the_last_with_the_windows_mean_loss(watchdog):
    fit, _ = wired(watchdog, every=3, max_steps=7)
    try:
        with records("gcc.train") as got:
            for s in range(1, 8):
                step(fit, loss=float(s), data_wait=0.05)
    finally:
        fit.fit_end()
    lines = [r.getMessage() for r in got]
    parsed = [LINE.fullmatch(line) for line in lines]
    assert all(parsed), lines
    assert [(m[1], m[2]) for m in parsed] == [("3", "7"), ("6", "7"), ("7", "7")]
    assert [m[3] for m in parsed] == ["2.0000", "5.0000", "7.0000"]  # mean of (1, 2, 3), of (4, 5, 6), of (7)
    for m in parsed:
        assert m[4] == "1.00e-03" and m[5] == "3.742" and m[8] == "0.2500"
        assert float(m[6]) >= 0.05 and float(m[7]) >= 0.05  # each step waited 0.05 s for its data
    assert parsed[2][10] == "0s"  # nothing left at the last step
    assert all(not getattr(r, "run_log_only", False) for r in got)


def test_eta_starts_after_the_first_line_at_the_pace_since_then(watchdog):
    """The first line's period holds the loader workers' start (here 100 s for 2 steps): its eta is `?`; later
    lines estimate from the pace since the first line (1 s a step, one slow window included), on a fake clock."""
    now = [0.0]  # the launch starts at t=0 on the fake clock
    fit, _ = wired(watchdog, every=2, max_steps=12, clock=lambda: now[0])
    try:
        with records("gcc.train") as got:
            for t in (50.0, 100.0, 101.0, 102.0, 103.0, 106.0, 107.0, 108.0):  # steps 1..8
                now[0] = t
                step(fit, loss=1.0)
    finally:
        fit.fit_end()
    parsed = [LINE.fullmatch(r.getMessage()) for r in got]
    assert [(m[1], m[6], m[10]) for m in parsed] == [
        ("2", "50.00", "?"),  # the workers' start: no estimate
        ("4", "1.00", "8s"),  # 2 s for 2 steps since the first line; 8 steps left
        ("6", "2.00", "9s"),  # 6 s for 4 steps: 1.5 s a step, 6 left
        ("8", "1.00", "5s"),  # 8 s for 6 steps, 4 left: 5.3 s
    ]


def test_a_launch_whose_first_line_is_its_last_says_0s(watchdog):
    fit, _ = wired(watchdog, every=5, max_steps=3)
    try:
        with records("gcc.train") as got:
            for _ in range(3):
                step(fit, loss=1.0)
    finally:
        fit.fit_end()
    assert [LINE.fullmatch(r.getMessage())[10] for r in got] == ["0s"]


def test_a_preempted_step_gets_its_line(watchdog):
    fit, preemption = wired(watchdog, every=3, max_steps=10)
    try:
        with records("gcc.train") as got:
            for s in range(1, 4):
                step(fit, loss=float(s))
            os.kill(os.getpid(), signal.SIGUSR1)
            step(fit, loss=10.0)  # step 4: preempted
        assert preemption.preempted_at == 4
    finally:
        fit.fit_end()
    parsed = [LINE.fullmatch(r.getMessage()) for r in got]
    assert [(m[1], m[3]) for m in parsed] == [("3", "2.0000"), ("4", "10.0000")]


def test_validation_lines_one_per_timestep(watchdog):
    fit, _ = wired(watchdog, every=3, max_steps=10)
    try:
        for _ in range(6):
            step(fit, loss=1.0)
        m = GcValMSE([200, 500])
        t = torch.tensor
        m.update(t([[1.0, 5.0], [2.0, 2.0]]), t([[3.0, 5.0], [3.0, 5.0]]), t([[1.0, 1.0], [3.0, 5.0]]))
        fit.state.eval_metrics = {"val": {"val_mse": m}}
        with records("gcc.train") as got:
            fit.event(Event.EVAL_END)
    finally:
        fit.fit_end()
    assert [r.getMessage() for r in got] == [
        "val step 6  t=200.0  mse 3.0000  gap_uncond +1.0000  gap_nulltext -2.0000  (n 2)",
        "val step 6  t=500.0  mse 2.0000  gap_uncond +2.0000  gap_nulltext +2.0000  (n 2)",
    ]


def test_with_the_progress_bar_on_a_terminal_the_lines_go_to_train_log_alone(watchdog):
    fit, _ = wired(watchdog, every=1, max_steps=10, console=False)
    try:
        with records("gcc.train") as got:
            step(fit, loss=1.0)
            fit.state.eval_metrics = {"val": {"val_mse": GcValMSE([200])}}
            fit.event(Event.EVAL_END)
    finally:
        fit.fit_end()
    assert len(got) == 2 and all(r.run_log_only is True for r in got)


def test_duration_and_whether_the_lines_are_wanted():
    assert [duration(s) for s in (0, 12.4, 59.6, 245, 3599, 3725, 90061)] == [
        "0s",
        "12s",
        "1m00s",
        "4m05s",
        "59m59s",
        "1h02m",
        "25h01m",
    ]
    assert console_lines_wanted(0, progress_bar=False) is False  # console_log_interval: 0 is off
    assert console_lines_wanted(10, progress_bar=False) is True
