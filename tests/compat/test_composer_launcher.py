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


def test_gcc_launchs_parser_reads_a_command_line_as_the_launchers_own():
    """gcc-launch reads the launcher's command line before Composer loads (gcc/compat/composer_launcher.py
    `launcher_parser`): the same options, each taking a value or not as Composer's, and the same reading."""
    from gcc.compat.composer_launcher import launcher_args, launcher_parser

    def options(parser):
        return {
            tuple(a.option_strings): (a.nargs, a.type, a.const)
            for a in parser._actions
            if a.option_strings and a.dest not in ("help", "version")
        }

    assert options(launcher_parser()) == options(launcher._get_parser())
    for argv in (
        ["-n", "8", "gcc/train.py", "yamls/sft_v10.yaml", "max_duration=20ba"],
        ["--world_size", "16", "--node_rank", "1", "--master_addr", "h", "--master_port", "29500", "-n", "8", "t.py"],
        ["-v", "--stdout", "o{rank}", "--stderr", "e{rank}", "-m", "gcc.train", "a", "--b", "-c"],
    ):
        assert vars(launcher_args(argv)) == {
            k: v for k, v in vars(launcher._get_parser().parse_args(argv)).items() if k != "version"
        }
    assert launcher_args(["--help"]) is None and launcher_args(["-n"]) is None
