"""The command that launches a training run (gcc/launcher.py): `composer -n N [flags] gcc/train.py <yaml> ...` as
docs/training.md gives it, another launcher in its place, or one process without a launcher; and gcc-launch: its
check of the config before any rank starts, its watch over the ranks and its one line for a crashed rank."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from gcc.launch_command import TRAIN_SCRIPT, composer, gcc_launch, train_command

ROOT = Path(__file__).resolve().parents[1]


def test_the_command_is_composer_n_then_the_flags_then_the_trainer_its_yaml_and_overrides():
    cmd = train_command(ROOT / "yamls" / "tiny_cpu.yaml", "run_dir=r", "max_duration=2", n=2, flags=["--stdout", "o"])
    assert cmd == [
        str(Path(sys.executable).with_name("composer")),
        "-n",
        "2",
        "--stdout",
        "o",
        str(ROOT / "gcc" / "train.py"),
        str(ROOT / "yamls" / "tiny_cpu.yaml"),
        "run_dir=r",
        "max_duration=2",
    ]
    assert TRAIN_SCRIPT.is_file() and composer() == cmd[:1]


def test_another_launcher_or_none():
    other = train_command("x.yaml", "a=1", n=4, launcher=["python", "launcher.py"])
    assert other == ["python", "launcher.py", "-n", "4", str(TRAIN_SCRIPT), "x.yaml", "a=1"]
    assert train_command("x.yaml", "a=1", n=None) == [sys.executable, str(TRAIN_SCRIPT), "x.yaml", "a=1"]


def _launch(*script_args: str, flags: tuple[str, ...] = ("-n", "1")):
    """The launcher's reading of `gcc-launch <flags> gcc/train.py <script_args>` (gcc/compat/composer_launcher.py)."""
    from gcc.compat.composer_launcher import launcher_args

    return launcher_args([*flags, str(TRAIN_SCRIPT), *script_args])


def test_gcc_launch_tees_its_own_lines_into_the_runs_train_log_and_leaves_the_console_as_it_was(tmp_path):
    """`gcc-launch`'s streams (gcc/launcher.py `main`): the console gets what the launcher writes, unchanged; the
    run's train.log its lines, masked. The trainer's command line and config are checked first, as every rank checks
    them, and nothing is created before they pass; no run to name (--print_config, another script): no train.log,
    the launcher runs as `composer` does. A train.log that cannot be opened (a link) is refused before any rank
    starts."""
    import io

    import pytest

    from gcc.compat.composer_launcher import launcher_args
    from gcc.errors import Refusal
    from gcc.launcher import _open_run_log, _Tee, checked_run
    from gcc.training.config import ConfigError
    from gcc.training.output_capture import LogLines

    yaml = str(ROOT / "yamls" / "tiny_cpu.yaml")

    run_dir = tmp_path / "run"
    assert checked_run(_launch(yaml, f"run_dir={run_dir}", "--print_config")) is None
    assert checked_run(launcher_args(["-n", "1", "other.py", yaml, f"run_dir={run_dir}"])) is None
    with pytest.raises(ConfigError, match="no_such"):
        checked_run(_launch(yaml, f"run_dir={run_dir}", "no_such=1"))
    with pytest.raises(SystemExit):
        checked_run(_launch())  # no yaml: the trainer's usage error, printed by its parser
    assert not run_dir.exists()
    cfg = checked_run(_launch(yaml, f"run_dir={run_dir}"))
    run_dir.mkdir()
    (run_dir / "train.log").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(Refusal, match=r"train\.log"):
        _open_run_log(cfg.run_dir)
    assert not (tmp_path / "elsewhere").exists()
    (run_dir / "train.log").unlink()
    fd = _open_run_log(cfg.run_dir)
    assert fd is not None
    console = io.StringIO()
    tee = _Tee(console, LogLines(fd, "launcher stderr"))
    print("gcc-launch: rank 1 was ended by SIGSEGV (exit 139): Fatal Python error: Segmentation fault", file=tee)
    tee.write("a command with https://bob:PASSWORD@host/x\npartial")
    tee.lines.feed("", final=True)
    os.close(fd)
    assert console.getvalue().endswith("Segmentation fault\na command with https://bob:PASSWORD@host/x\npartial")
    got = [ln.split(" ", 1)[1] for ln in (run_dir / "train.log").read_text().splitlines()]
    assert got == [
        "launcher stderr: gcc-launch: rank 1 was ended by SIGSEGV (exit 139): Fatal Python error: Segmentation fault",
        "launcher stderr: a command with https://***@host/x",
        "launcher stderr: partial",
    ]


def test_gcc_launch_answers_a_bad_config_before_any_rank_starts(tmp_path):
    """A config error through gcc-launch is its one line and exit 2 within a few seconds, before a rank (or torch)
    starts: the run folder is not even made. `composer -n` answers it from every rank once they have started."""
    run_dir = tmp_path / "run"
    argv = train_command(
        ROOT / "yamls" / "tiny_cpu.yaml",
        f"run_dir={run_dir}",
        "optimizer.learning_rate=1e-4",
        n=2,
        launcher=gcc_launch(),
    )
    t0 = time.monotonic()
    r = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=60)
    assert time.monotonic() - t0 < 30 and r.returncode == 2, (r.stdout, r.stderr)  # before any rank: ≈2 s, 10× that
    assert r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("gcc.train: config error: unknown key(s): optimizer.learning_rate")
    assert not run_dir.exists()


def _ranks(*commands: str) -> dict[int, subprocess.Popen]:
    return {r: subprocess.Popen(["sh", "-c", c]) for r, c in enumerate(commands)}


def test_a_ranks_exit_or_a_signal_stops_the_others_and_the_cause_is_the_launchs_code(monkeypatch):
    """gcc-launch's watch over its ranks (here `sh` processes: what is proven is the handling of processes): the
    first rank to fail stops the others (SIGTERM) and its code is the launch's, not a peer's that failed because of
    it; a signal reaches every rank as SIGTERM, a second Ctrl-C as SIGINT; a rank still there after the grace is
    killed with what it started."""
    import signal

    from gcc import exit_codes, launcher

    ranks = _ranks("exec sleep 60", "sleep 0.3; exit 3")
    ended, killed = launcher.watch(ranks, [])
    assert ended[0][0] == -signal.SIGTERM and not killed
    assert launcher.launch_code(ended, exit_codes.PEER_LOST) == (3, 1)
    # a rank killed by a signal, its peer failing with it a moment later: the crash is the launch's code
    ranks = _ranks(f"sleep 0.3; exit {exit_codes.PEER_LOST}", "sleep 0.1; kill -SEGV $$")
    ended, _ = launcher.watch(ranks, [])
    assert launcher.launch_code(ended, exit_codes.PEER_LOST) == (128 + signal.SIGSEGV, 1)
    assert launcher.how_it_ended(ended[1][0]) == "was ended by SIGSEGV (exit 139)"
    # a signal: SIGTERM to every rank (a preemption); a second Ctrl-C passes SIGINT on
    trap = "trap 'echo TERM >> {0}' TERM; trap 'echo INT >> {0}; exit 0' INT; while :; do sleep 0.05; done"
    with tempfile.TemporaryDirectory() as d:
        logs = [Path(d) / f"r{r}" for r in range(2)]
        ranks = _ranks(*(trap.format(f) for f in logs))
        time.sleep(0.5)
        signals = [signal.SIGINT]
        threading.Timer(1.0, lambda: signals.append(signal.SIGINT)).start()
        ended, killed = launcher.watch(ranks, signals)
        assert [f.read_text().split() for f in logs] == [["TERM", "INT"]] * 2 and not killed
    # a rank that ignores SIGTERM is killed once the grace is over
    monkeypatch.setattr(launcher, "CLEANUP_S", 0.5)
    ranks = _ranks("trap '' TERM; while :; do sleep 0.05; done", "sleep 0.5; exit 4")
    ended, killed = launcher.watch(ranks, [])
    assert killed == {0} and ended[0][0] == -signal.SIGKILL
    assert launcher.launch_code(ended, exit_codes.PEER_LOST) == (4, 1)


def test_a_crashed_ranks_own_last_words():
    from gcc.launcher import last_words

    traceback = ["Traceback (most recent call last):", '  File "x.py", line 1, in <module>', "ValueError: boom"]
    assert last_words(["a line", *traceback, ""]) == "ValueError: boom"
    assert last_words(["Fatal Python error: Segmentation fault", "", "Thread 0x1:", "Extension modules: x"]) == (
        "Fatal Python error: Segmentation fault"
    )
    assert last_words(["first", "last\x1b[2J", "  "]) == "last\\x1b[2J" and last_words([]) == ""


def test_a_crashed_ranks_last_words_are_read_from_the_end_of_its_output_never_from_a_fifo(tmp_path, monkeypatch):
    """gcc-launch looks for a crashed rank's last words in the end of train.log (this launch's part: a long run's
    earlier launches are not read) or of the rank's stderr file, a bounded read; a FIFO in place of that file is
    never waited on."""
    from types import SimpleNamespace

    from gcc import launcher

    monkeypatch.setattr(launcher, "LAST_WORDS_BYTES", 4096)
    log = tmp_path / "train.log"
    old = "t rank 1 stderr: ValueError: an earlier launch's\n"
    filler = "".join(f"t rank 0 stdout: line {i}\n" for i in range(2000))  # far past the bytes read
    log.write_text(
        f"==== launch 1\n{old}{filler}==== launch 2\nt rank 1 stderr: RuntimeError: this one\n{filler[:1000]}"
    )
    assert launcher.crash_line(tmp_path, 1, None) == f"RuntimeError: this one; its whole output is in {log}"
    log.write_text(f"==== launch 1\n{old}==== launch 2\nt rank 0 stdout: x\n")  # this launch's part alone
    assert launcher.crash_line(tmp_path, 1, None) == f"it printed nothing; its whole output is in {log}"
    fifo = tmp_path / "rank1.stderr.txt"
    os.mkfifo(fifo)
    files = str(tmp_path / "rank{rank}.stderr.txt")
    parsed = SimpleNamespace(stderr=files, world_size=2, base_rank=0, nproc=2, node_rank=0)
    assert launcher.crash_line(None, 1, parsed) == "it printed nothing"


def test_gcc_launch_checks_its_flags_and_environment_without_composer(monkeypatch):
    """gcc-launch's own command line and the environment Composer's launcher defaults to, checked before Composer
    loads (gcc/compat/composer_launcher.py `checked_launch`): each integer in ASCII digits and in its range (a
    `--world_size 0` was a ZeroDivisionError in the config's check), a usage error in argparse's words; --help and
    --version left to Composer's launcher (None)."""
    import pytest

    from gcc.compat.composer_launcher import checked_launch
    from gcc.errors import BadInput

    script = [str(TRAIN_SCRIPT), "x.yaml"]
    assert checked_launch(["-n", "2", "--world_size", "4", "--node_rank", "1", *script]).world_size == 4
    assert checked_launch(["--help"]) is None and checked_launch(["--version"]) is None
    for flags, said in [
        (["-n", "0"], "-n 0: The nproc must be 1 or greater"),
        (["-n", "2000"], "at most 1024"),
        (["-n", "٣"], "argument -n/--nproc: invalid int value: '٣'"),
        (["--world_size", "0"], "--world_size='0': expected an integer in [1, 1048576]"),
        (["--master_port", "65536"], "--master_port='65536'"),
        (["--base_rank", "-1"], "--base_rank='-1'"),
        (["-n"], "argument -n/--nproc: expected one argument"),
    ]:
        with pytest.raises(BadInput) as e:
            checked_launch([*flags, *script] if flags != ["-n"] else flags)
        assert said in str(e.value), (flags, str(e.value))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "²")
    with pytest.raises(BadInput, match="LOCAL_WORLD_SIZE='²'"):
        checked_launch(script)
