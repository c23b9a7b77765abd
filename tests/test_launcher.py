"""The command that launches a training run (gcc/launcher.py): `composer -n N [flags] gcc/train.py <yaml> ...` as
docs/training.md gives it, another launcher in its place, or one process without a launcher."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from gcc.launcher import TRAIN_SCRIPT, composer, train_command

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
    the launcher runs as `composer` does."""
    import io

    import pytest

    from gcc.compat.composer_launcher import launcher_args
    from gcc.launcher import _checked_run, _Tee
    from gcc.training.config import ConfigError
    from gcc.training.output_capture import LogLines

    yaml = str(ROOT / "yamls" / "tiny_cpu.yaml")
    run_dir = tmp_path / "run"
    assert _checked_run(_launch(yaml, f"run_dir={run_dir}", "--print_config")) is None
    assert _checked_run(launcher_args(["-n", "1", "other.py", yaml, f"run_dir={run_dir}"])) is None
    with pytest.raises(ConfigError, match="no_such"):
        _checked_run(_launch(yaml, f"run_dir={run_dir}", "no_such=1"))
    with pytest.raises(SystemExit):
        _checked_run(_launch())  # no yaml: the trainer's usage error, printed by its parser
    assert not run_dir.exists()
    fd = _checked_run(_launch(yaml, f"run_dir={run_dir}"))
    assert fd is not None
    console = io.StringIO()
    tee = _Tee(console, LogLines(fd, "launcher stderr"))
    print("ERROR:composer.cli.launcher:Rank 1 crashed with exit code -11.", file=tee)
    tee.write("a command with https://bob:PASSWORD@host/x\npartial")
    tee.lines.feed("", final=True)
    os.close(fd)
    assert console.getvalue().endswith("-11.\na command with https://bob:PASSWORD@host/x\npartial")
    got = [ln.split(" ", 1)[1] for ln in (run_dir / "train.log").read_text().splitlines()]
    assert got == [
        "launcher stderr: ERROR:composer.cli.launcher:Rank 1 crashed with exit code -11.",
        "launcher stderr: a command with https://***@host/x",
        "launcher stderr: partial",
    ]
