"""Fixtures the callback unit tests share."""

from __future__ import annotations

import signal

import pytest

from gcc.training.watchdog import StallWatchdog
from gcc.workers import PREEMPTION_SIGNALS


@pytest.fixture
def watchdog(tmp_path):
    """A real watchdog whose thread checks its deadlines only when a signal wakes it (poll_s of an hour): an armed
    grace deadline cannot end the test process. The process's signal handlers are restored after the test."""
    handlers = {s: signal.getsignal(s) for s in PREEMPTION_SIGNALS}
    w = StallWatchdog(tmp_path, 0, poll_s=3600)
    yield w
    assert w.stop(10)
    for s, h in handlers.items():
        signal.signal(s, h)
