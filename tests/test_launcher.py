"""The command that launches a training run (gcc/launcher.py): `composer -n N [flags] gcc/train.py <yaml> ...` as
docs/training.md gives it, another launcher in its place, or one process without a launcher."""

from __future__ import annotations

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
