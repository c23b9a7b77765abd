"""Contract tests of gcc/compat/composer_launcher.py against the installed Composer launcher: its own monitoring,
cleanup and aggregation run on processes that exit as a launch's ranks do (the ranks are `sh` and `sleep`: what is
proven is the launcher's handling of processes, not gcc's), and `let_rank0_exit_first` on this process."""

from __future__ import annotations

import os
import signal
import subprocess
import threading

import pytest
from composer.cli import launcher

from gcc.compat.composer_launcher import let_rank0_exit_first


def _ranks(*commands: str) -> dict[int, subprocess.Popen]:
    return {r: subprocess.Popen(["sh", "-c", c]) for r, c in enumerate(commands)}


def _end_as_the_launcher_does(ranks: dict[int, subprocess.Popen]) -> int:
    """The launcher's `main` after it started the ranks: monitor, clean up, aggregate."""
    try:
        monitor = threading.Thread(target=launcher._monitor_processes, args=(ranks,), daemon=True)
        monitor.start()
        monitor.join(30)
        assert not monitor.is_alive(), "the launcher waits for every rank after one exited non-zero"
        launcher._cleanup_processes(ranks)
        return launcher._aggregate_process_returncode(ranks)
    finally:
        for p in ranks.values():
            if p.poll() is None:
                p.kill()
            p.wait()


def test_a_rank_that_exits_non_zero_gets_the_others_stopped_and_the_first_code_in_rank_order_is_reported():
    # rank 0 first: its code is the launch's, and the rank still waiting is stopped with SIGTERM
    ranks = _ranks("exit 3", "exec sleep 60")
    assert _end_as_the_launcher_does(ranks) == 3
    assert ranks[1].returncode == -signal.SIGTERM
    # rank 1 first: rank 0's -15 from that cleanup is reported, not rank 1's code (why the others let rank 0 go first)
    ranks = _ranks("exec sleep 60", "exit 3")
    assert _end_as_the_launcher_does(ranks) == -signal.SIGTERM


@pytest.fixture
def restored_handlers():
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        yield
    finally:
        for s, h in saved.items():
            signal.signal(s, h)


def test_a_rank_waiting_for_rank_0_leaves_with_its_code_on_the_launchers_sigterm(restored_handlers):
    timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        with pytest.raises(SystemExit) as e:
            let_rank0_exit_first(3, (signal.SIGTERM, signal.SIGUSR1), timeout_s=30)
    finally:
        timer.cancel()
    assert e.value.code == 3
