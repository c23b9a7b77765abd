"""`<run_dir>/train.log` (gcc/training/console.py): rank 0's console lines and every rank's own warnings and errors,
appended per launch under a header line; lines meant for it alone; never opened through a link."""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

from gcc.training.console import ALL_RANKS, RUN_LOG_ONLY, RunLogHandler, configure_logging, open_run_log
from gcc.training.run_folder import Refusal

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


def test_rank0s_lines_and_each_ranks_own_warnings_appended_per_launch(tmp_path, capsys, fresh_logging):
    run_dir = tmp_path / "run"  # created by the first launch
    path = _as_rank(run_dir, 0)
    log.info("starting: world 2")
    log.error(f"refused: fetching https://bob:{SECRET}@host/x")  # a verdict every rank logs: rank 0's copy
    log.info("step 10/20  loss 0.5", extra=RUN_LOG_ONLY)  # a progress line while a terminal shows the bar
    console = capsys.readouterr()
    assert "starting: world 2" in console.out and "step 10/20" not in console.out + console.err

    _as_rank(run_dir, 1)  # the other rank of the same launch, appending to the same file
    log.error(f"refused: fetching https://bob:{SECRET}@host/x")  # the same verdict: not again
    log.info("rank 1: model ready", extra=ALL_RANKS)  # its INFO lines stay on its own console
    log.warning("rank 1: SIGTERM received", extra=ALL_RANKS)

    text = path.read_text()
    lines = text.splitlines()
    assert lines[0].startswith("==== launch ")
    assert f"host {socket.gethostname()}  world 2  pid {os.getpid()}" in lines[0]
    assert [ln.split(" ", 1)[1] for ln in lines[1:]] == [  # after the UTC time
        "rank 0 INFO gcc.train: starting: world 2",
        "rank 0 ERROR gcc.train: refused: fetching https://***@host/x",
        "rank 0 INFO gcc.train: step 10/20  loss 0.5",
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


@pytest.mark.parametrize("plant", ["symlink", "fifo", "folder"])
def test_train_log_is_never_opened_through_a_link_or_as_anything_but_a_file(tmp_path, plant, fresh_logging):
    victim = tmp_path / "victim.txt"
    victim.write_text("someone's file")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    target = run_dir / "train.log"
    {"symlink": lambda: target.symlink_to(victim), "fifo": lambda: os.mkfifo(target), "folder": lambda: target.mkdir()}[
        plant
    ]()
    with pytest.raises(Refusal, match=r"train\.log: (cannot be opened as the run's log|not a regular file)"):
        open_run_log(run_dir, 0, 1)  # a FIFO without a reader does not block it
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
