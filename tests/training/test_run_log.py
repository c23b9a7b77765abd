"""`<run_dir>/train.log` (gcc/training/console.py, gcc/training/output_capture.py): rank 0's `gcc` lines and every
rank's own warnings and errors with their level, appended per launch under a header line, lines meant for it alone,
never opened through a link; in a launch's process, everything else each rank prints (its stdout and stderr, a
library's warnings and C-level writes, a native crash's stacks), one whole line per write, masked, nothing lost at
exit; and through `gcc-launch` (gcc/launcher.py), the launcher's own lines."""

from __future__ import annotations

import logging
import os
import re
import select
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from _launch import BASE, env, finish

from gcc.compat.composer_launcher import launcher_args
from gcc.launcher import TRAIN_SCRIPT, _open_run_log, checked_run, gcc_launch, train_command
from gcc.training.console import ALL_RANKS, RUN_LOG_ONLY, RunLogHandler, configure_logging, open_run_log
from gcc.training.run_folder import Refusal

ROOT = Path(__file__).resolve().parents[2]
SECRET = "0123456789abcdef0123456789abcdef01234567"
log = logging.getLogger("gcc.train")


@pytest.fixture
def fresh_logging():
    """The `gcc` logger as a launch sets it up; afterwards no run log is left open in this process."""
    yield
    root = logging.getLogger("gcc")
    for h in list(root.handlers):
        if isinstance(h, RunLogHandler):
            root.removeHandler(h)
            h.close()
    configure_logging("INFO", 0)


def _as_rank(run_dir: Path, rank: int, world: int = 2) -> Path:
    configure_logging("INFO", rank)
    return open_run_log(run_dir, rank, world)


def test_rank0s_lines_and_each_ranks_own_appended_per_launch(tmp_path, capsys, fresh_logging):
    run_dir = tmp_path / "run"  # created by the first launch
    path = _as_rank(run_dir, 0)
    log.info("starting: world 2")
    log.error(f"refused: fetching https://bob:{SECRET}@host/x")  # a verdict every rank logs: rank 0's copy
    log.info("step 10/20  loss 0.5", extra=RUN_LOG_ONLY)  # a progress line while a terminal shows the bar
    console = capsys.readouterr()
    assert "starting: world 2" in console.out and "step 10/20" not in console.out + console.err

    _as_rank(run_dir, 1)  # the other rank of the same launch, appending to the same file
    log.error(f"refused: fetching https://bob:{SECRET}@host/x")  # the same verdict: not again
    log.info("rank 1: model ready", extra=ALL_RANKS)  # its own lines, as on its console
    log.warning("rank 1: SIGTERM received", extra=ALL_RANKS)

    text = path.read_text()
    lines = text.splitlines()
    assert lines[0].startswith("==== launch ")
    assert f"host {socket.gethostname()}  world 2  pid {os.getpid()}" in lines[0]
    assert [ln.split(" ", 1)[1] for ln in lines[1:]] == [  # after the UTC time
        "rank 0 INFO gcc.train: starting: world 2",
        "rank 0 ERROR gcc.train: refused: fetching https://***@host/x",
        "rank 0 INFO gcc.train: step 10/20  loss 0.5",
        "rank 1 INFO gcc.train: rank 1: model ready",
        "rank 1 WARNING gcc.train: rank 1: SIGTERM received",
    ]
    assert SECRET not in text
    _as_rank(run_dir, 0, world=1)  # the next launch
    log.info("resuming from ep0-ba3-rank0.pt")
    assert path.read_text().startswith(text)  # appended, nothing rewritten
    headers = [ln for ln in path.read_text().splitlines() if ln.startswith("==== launch ")]
    assert len(headers) == 2 and "world 1" in headers[1]
    assert path.read_text().endswith("rank 0 INFO gcc.train: resuming from ep0-ba3-rank0.pt\n")


def test_a_git_checkout_puts_its_revision_in_the_header(tmp_path, fresh_logging):
    import subprocess

    from gcc.provenance import this_code

    root = Path(__file__).resolve().parents[2]
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("the tests do not run from a git checkout")
    assert this_code().revision == head.stdout.strip()
    path = _as_rank(tmp_path, 0, world=1)
    assert f"git {head.stdout.strip()}" in path.read_text().splitlines()[0]


@pytest.mark.parametrize("plant", ["symlink", "hard link", "fifo", "folder"])
def test_train_log_is_never_opened_through_a_link_or_as_anything_but_a_file(tmp_path, plant, fresh_logging):
    victim = tmp_path / "victim.txt"
    victim.write_text("someone's file")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    target = run_dir / "train.log"
    {
        "symlink": lambda: target.symlink_to(victim),
        "hard link": lambda: os.link(victim, target),  # O_NOFOLLOW does not stop it: the writes would land in victim
        "fifo": lambda: os.mkfifo(target),
        "folder": lambda: target.mkdir(),
    }[plant]()
    said = r"(cannot be opened as the run's log|not a regular file|a symbolic link|a file with 2 names)"
    with pytest.raises(Refusal, match=rf"train\.log: {said}"):
        open_run_log(run_dir, 0, 1)  # a FIFO without a reader does not block it
    # nor by gcc-launch, which refuses it the same way before it starts a rank
    launch = launcher_args(["-n", "1", str(TRAIN_SCRIPT), str(ROOT / "yamls" / "tiny_cpu.yaml"), f"run_dir={run_dir}"])
    with pytest.raises(Refusal, match=rf"train\.log: {said}"):
        _open_run_log(checked_run(launch).run_dir)
    assert victim.read_text() == "someone's file"


def test_progress_lines_go_to_train_log_while_a_terminal_shows_the_bar(tmp_path, capsys, monkeypatch, fresh_logging):
    from gcc.training.callbacks.console_log import ConsoleLog, console_lines_wanted

    row = {"step": 1, "loss": 0.5, "lr": 1e-3, "grad_norm": 0.4, "data_time": 0.01, "sem_rms": 0.0}
    path = _as_rank(tmp_path, 0, world=1)
    for tty in (True, False):
        monkeypatch.setattr("sys.stdout.isatty", lambda tty=tty: tty)
        cb = ConsoleLog(
            1,
            2,
            SimpleNamespace(last_row=row),
            SimpleNamespace(last=[]),
            SimpleNamespace(preempted_at=None),
            console=console_lines_wanted(1, progress_bar=True),
        )
        cb.fit_start(None, None)
        cb.batch_end(None, None)
        assert ("step 1/2  loss 0.5000" in capsys.readouterr().out) is not tty
    assert path.read_text().count("step 1/2  loss 0.5000") == 2  # with the bar and without


# A rank as a launch's process runs it (gcc/training/entry.py `run`): its console and train.log opened, its output
# captured; then it prints in every way a process can, from two threads at once, and leaves as a fault does
# (gcc/training/ending.py `leave_now`: os._exit, no interpreter shutdown).
RANK = r"""
import logging, os, sys, threading, warnings
from gcc import redact
from gcc.training.console import ALL_RANKS, configure_logging, open_run_log
from gcc.training.ending import leave_now

run_dir, rank, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
redact.install()
configure_logging("INFO", rank)
open_run_log(run_dir, rank, 2, capture_output=True)
logging.getLogger("gcc.train").info(f"rank {rank}: ready", extra=ALL_RANKS)
print("fetching https://bob:SECRET@host/x")
warnings.warn_explicit("a library's warning", UserWarning, "somelib/mod.py", 7)
os.write(2, b"written by C\n")
sys.stdout.write("progress 10%\rprogress 50%\rprogress 100%\n")


def burst(fd):
    for i in range(n):
        os.write(fd, f"burst {rank}.{fd}.{i} ".encode() + b"x" * 300 + b"\n")


threads = [threading.Thread(target=burst, args=(fd,)) for fd in (1, 2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("the last line", flush=True)
sys.stdout.write("no newline at the end")
leave_now(0)
""".replace("SECRET", SECRET)

LINE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ rank [01] (stdout: |stderr: |INFO gcc\.train: )")


def test_everything_a_rank_prints_lands_in_train_log_once_whole_masked_and_before_it_exits(tmp_path):
    """Two ranks at once, each from two threads; a C-level write, a library's warning, a `gcc` record, a credential,
    a progress bar; then os._exit. The console gets every byte as it was; train.log every line, whole, once, masked,
    by the time the rank has exited."""
    run_dir, n = tmp_path / "run", 500
    ranks = []
    for rank in (0, 1):
        with open(tmp_path / f"rank{rank}.out", "wb") as out, open(tmp_path / f"rank{rank}.err", "wb") as err:
            argv = [sys.executable, "-c", RANK, str(run_dir), str(rank), str(n)]
            ranks.append(subprocess.Popen(argv, stdout=out, stderr=err, env=env()))
    assert [r.wait(60) for r in ranks] == [0, 0]
    text = (run_dir / "train.log").read_text()  # the ranks have exited: everything they wrote is there
    for rank in (0, 1):
        for fd, stream in ((1, "stdout"), (2, "stderr")):
            got = re.findall(rf" rank {rank} {stream}: burst {rank}\.{fd}\.(\d+) (x*)\n", text)
            assert [int(i) for i, _ in got] == list(range(n)) and {x for _, x in got} == {"x" * 300}
        assert f" rank {rank} stdout: the last line\n" in text
        assert f" rank {rank} stdout: fetching https://***@host/x\n" in text and SECRET not in text
        assert f" rank {rank} stderr: somelib/mod.py:7: UserWarning: a library's warning\n" in text
        assert f" rank {rank} stderr: written by C\n" in text
        assert f" rank {rank} stdout: progress 100%\n" in text and "progress 50%" not in text
        # the gcc record once, with its level (not again as the console line it also is)
        assert (
            text.count(f"gcc.train: rank {rank}: ready") == 1 and f" rank {rank} INFO gcc.train: rank {rank}: " in text
        )
        console = (tmp_path / f"rank{rank}.out").read_bytes()  # byte for byte as the rank wrote it
        assert b"fetching https://bob:%s@host/x\n" % SECRET.encode() in console
        assert b"progress 10%\rprogress 50%\rprogress 100%\n" in console and console.endswith(b"no newline at the end")
        assert console.count(f"gcc.train: rank {rank}: ready\n".encode()) == 1
        assert b"written by C\n" in (tmp_path / f"rank{rank}.err").read_bytes()
    assert all(LINE.match(ln) or ln.startswith("==== launch ") for ln in text.splitlines()), text[:3000]
    deadline = time.monotonic() + 30  # a line without its newline: once every holder of the pipe has closed it
    while text.count("stdout: no newline at the end\n") < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
        text = (run_dir / "train.log").read_text()
    assert text.count("stdout: no newline at the end\n") == 2


def test_train_logs_lines_are_cut_as_a_terminal_shows_them_and_a_full_disk_is_said_once(tmp_path):
    from gcc.training.output_capture import MAX_LINE, LogLines

    path = tmp_path / "train.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    said = []
    lines = LogLines(fd, "rank 3 stderr", said.append)
    for chunk in (b"a\xc3", b"\xa9 b\r\n", b"\x1b[2Kbar 1\rbar 2", b"\rbar 3\n", "é" * (MAX_LINE + 5), b"\n"):
        lines.feed(chunk)
    lines.feed(b"tail", final=True)
    os.close(fd)
    got = [ln.split(" ", 1)[1] for ln in path.read_text().splitlines()]
    assert got[:2] == ["rank 3 stderr: aé b", "rank 3 stderr: bar 3"]  # a character split across reads; a bar redrawn
    assert got[2:] == ["rank 3 stderr: " + "é" * MAX_LINE, "rank 3 stderr: ééééé", "rank 3 stderr: tail"]
    full = LogLines(os.open("/dev/full", os.O_WRONLY), "rank 0 stdout", said.append)
    full.feed(b"one\ntwo\n")
    full.feed(b"three\n")
    assert len(said) == 1 and "train.log cannot be written (No space left on device)" in said[0]


def test_train_log_never_holds_a_terminals_control_sequences(tmp_path):
    """What a rank writes to a terminal may move its cursor and colour its text (tqdm's bar, a library's colours,
    a window title); train.log keeps the text alone, and drops a line that was nothing but cursor moves."""
    from gcc.training.output_capture import LogLines

    path = tmp_path / "train.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    lines = LogLines(fd, "rank 0 stderr")
    lines.feed(b"\x1b[A\r  train  Epoch 0:  50%|##  | 6/12\x1b[K\n\x1b[A\x1b[A\n")
    lines.feed(b"\x1b[1;31mWARNING\x1b[0m: red\x1b]0;a title\x07 \x1b(Bdone\n\x1b[2K\r\n")
    os.close(fd)
    text = path.read_text()
    assert "\x1b" not in text and "\\x1b" not in text and "\\x07" not in text, text
    got = [ln.split(" ", 1)[1] for ln in text.splitlines()]
    assert got == ["rank 0 stderr:   train  Epoch 0:  50%|##  | 6/12", "rank 0 stderr: WARNING: red done"], got


def test_the_progress_bar_draws_only_on_a_terminal_and_never_into_train_log(monkeypatch):
    """The yaml's progress_bar only allows the bar: on a file or a pipe (a scheduler's log) it never draws, and on a
    terminal it draws on the terminal itself, past train.log's capture (gcc/training/console.py)."""
    from gcc.training import output_capture
    from gcc.training.console import progress_bar_draws, progress_bar_stream

    for tty, allowed, draws in ((False, True, False), (True, False, False), (True, True, True)):
        monkeypatch.setattr("sys.stdout.isatty", lambda tty=tty: tty)
        assert progress_bar_draws(allowed) is draws
    console = os.pipe()
    monkeypatch.setattr(output_capture, "console", lambda fd: console[1] if fd == 1 else fd)
    stream = progress_bar_stream()
    stream.write("bar\r")
    stream.flush()
    assert os.read(console[0], 16) == b"bar\r"
    for fd in console:
        os.close(fd)


@pytest.mark.slow
def test_a_native_crash_lands_in_train_log_with_every_ranks_and_the_launchers_lines(e2e_shards, tmp_path):
    """Rank 1 segfaults at step 1 (faults.native_crash_step), under `gcc-launch -n 2`: train.log holds its Python
    stacks (faulthandler) line by line under its name, rank 0's lines, the C++ lines of both ranks' c10d
    (TORCH_CPP_LOG_LEVEL=INFO), and the launcher's line about the crashed rank, which is all the console gets of
    the crash. Before, it held rank 0's `gcc` lines
    alone: all of this was on the consoles only, rank 1's in files the launcher deletes."""
    run_dir = tmp_path / "run"
    argv = train_command(
        ROOT / "yamls" / "tiny_cpu.yaml",
        f"run_dir={run_dir}",
        f"data.path={e2e_shards}",
        *BASE,
        "max_duration=2",
        "eval_interval=0",  # no validation, step 0's neither: the crash comes at once
        "faults.native_crash_step=1",
        "faults.native_crash_rank=1",
        n=2,
        launcher=gcc_launch(),
        flags=["--stdout", str(tmp_path / "rank{rank}.out"), "--stderr", str(tmp_path / "rank{rank}.err")],
    )
    p = subprocess.Popen(
        argv,
        env=dict(env(), TORCH_CPP_LOG_LEVEL="INFO"),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    with p:
        out = finish(p, 300)
    # gcc-launch's one line for it, the launch's code the crash's (128 + SIGSEGV), nothing of rank 0's collective
    # that failed with it (its own line is in train.log) nor the launcher's blocks of every rank's output
    line = "gcc-launch: rank 1 was ended by SIGSEGV (exit 139): Fatal Python error: Segmentation fault; its whole"
    assert p.returncode == 139 and out.rstrip().splitlines()[-1].startswith(line), out[-3000:]
    assert not any(w in out for w in ("Traceback", "Begin global rank", "Waiting up to")), out[-3000:]
    text = (run_dir / "train.log").read_text()
    crash = text.index(" rank 1 stderr: Fatal Python error: Segmentation fault\n")
    stack = text[crash:].split("\n\n", 1)[0]
    assert re.search(r" rank 1 stderr:   File \"\S+/gcc/data/dataset\.py\", line \d+ in __call__\n", text[crash:]), (
        stack
    )
    assert re.search(r" rank 1 stderr:   File \"\S+/gcc/train\.py\", line \d+ in <module>\n", text[crash:])
    assert " rank 0 INFO gcc.train: starting: world 2" in text
    for rank in (0, 1):
        assert re.search(rf" rank {rank} stderr: .*\[c10d\]", text), text[-3000:]
    assert f" launcher stderr: {line}" in text
    assert " rank 0 ERROR gcc.train: rank 0: stopped: another rank's process is gone" in text


TERMINAL = r"""
import os, sys
from gcc.training.console import configure_logging, open_run_log
from gcc.training.ending import leave_now

configure_logging("INFO", 0)
open_run_log(sys.argv[1], 0, 1, capture_output=True)
print("a terminal:", sys.stdout.isatty(), sys.stderr.isatty(), tuple(os.get_terminal_size(1)))
sys.stdout.write("bar 1\rbar 2\n")
leave_now(0)
"""


def test_a_terminal_stays_a_terminal_of_the_same_size(tmp_path):
    """On a terminal the rank's fd 1 and 2 are a pseudo-terminal of its size: Composer's bar, colours and
    `console_lines_wanted` see what they saw. The terminal gets the bytes; train.log the lines."""
    import fcntl
    import pty
    import struct
    import termios

    console, rank_side = pty.openpty()
    fcntl.ioctl(rank_side, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 133, 0, 0))
    p = subprocess.Popen(
        [sys.executable, "-c", TERMINAL, str(tmp_path / "run")], stdout=rank_side, stderr=rank_side, env=env()
    )
    os.close(rank_side)
    got = b""
    while p.poll() is None or select.select([console], [], [], 1)[0]:
        try:
            got += os.read(console, 4096)
        except OSError:  # EIO: every writer of the terminal has closed it
            break
    assert p.wait(30) == 0
    assert b"a terminal: True True (133, 40)\r\nbar 1\rbar 2\r\n" in got, got
    lines = [ln.split(" ", 1)[1] for ln in (tmp_path / "run" / "train.log").read_text().splitlines()[1:]]
    assert lines == ["rank 0 stdout: a terminal: True True (133, 40)", "rank 0 stdout: bar 2"]
