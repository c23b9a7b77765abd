"""The command that launches a training run (docs/training.md, the first lines): `composer -n <N> [launcher flags]
gcc/train.py <yaml> [dotted.key=value ...]`, or the same through `gcc-launch` (gcc/launcher.py).

`train_command` builds that command line for every caller that launches runs: the demo, the benches and the tests'
launches. An argument list and nothing else, so that bench/ and tests/ import it without loading torch or Composer.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

TRAIN_SCRIPT = Path(__file__).resolve().with_name("train.py")


def composer() -> list[str]:
    """The `composer` command of this environment (the console script beside this interpreter)."""
    return [str(Path(sys.executable).with_name("composer"))]


def train_command(
    config: Path | str,
    *overrides: str,
    n: int | None,
    launcher: Sequence[str] | None = None,
    flags: Sequence[str] = (),
) -> list[str]:
    """`<launcher> -n <n> <flags> gcc/train.py <config> <overrides>`: `launcher` is `composer()` unless given (e.g.
    tests/composer_launcher.py, or `gcc_launch()`), `flags` the launcher's own (--stdout, ...). `n=None`: one
    process without a launcher (`python gcc/train.py ...`, as on one GPU)."""
    if n is None:
        head = [sys.executable]
    else:
        head = [*(composer() if launcher is None else launcher), "-n", str(n), *flags]
    return [*head, str(TRAIN_SCRIPT), str(config), *overrides]


def gcc_launch() -> list[str]:
    """`gcc-launch` as this interpreter runs it from a checkout (`python -m gcc.launcher`)."""
    return [sys.executable, "-m", "gcc.launcher"]
