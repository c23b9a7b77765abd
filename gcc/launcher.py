"""How a training run is launched (docs/training.md, the first lines): `composer -n <N> [launcher flags] gcc/train.py
<yaml> [dotted.key=value ...]`, or the same through `gcc-launch`.

`train_command` builds that command line for every caller that launches runs: the demo, the benches and the tests'
launches. This module sits at the top of gcc/, beside gcc/train.py, so that bench/ and tests/ import it without
loading torch or Composer (an argument list, nothing else).

`main` is `gcc-launch` (`python -m gcc.launcher`): Composer's launcher itself, with the same flags, whose own lines
(a rank that crashed and its exit code, the launcher's tracebacks, what it prints of a crashed rank's output) also
go to the run's `<run_dir>/train.log` (`<UTC time> launcher <stdout|stderr>: <line>`, masked). The ranks cannot
take them: the launcher is another process, and the other ranks' output reaches it through files it deletes. The
run folder is read from the yaml and overrides with gcc's config loader (no torch), and train.log opened as the
ranks open it (gcc/training/console.py `open_log_file`); a config that does not load, or no training script, and
the launcher runs as `composer` does (the ranks report the config's trouble). The launcher's console is as
`composer`'s.
"""

from __future__ import annotations

import io
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

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


class _Tee(io.TextIOBase):
    """A text stream of the launcher: written on to its console as it was, and line by line to train.log."""

    def __init__(self, stream: TextIO, lines):
        self.stream, self.lines = stream, lines

    def write(self, text: str) -> int:
        n = self.stream.write(text)
        self.lines.feed(text)
        return n

    def flush(self) -> None:
        self.stream.flush()

    def fileno(self) -> int:
        return self.stream.fileno()

    def isatty(self) -> bool:
        return self.stream.isatty()

    @property
    def encoding(self) -> str:  # type: ignore[override]  # the console's
        return self.stream.encoding


def _open_run_log(script_args: list[str] | None) -> int | None:
    """The run's train.log opened for appending (gcc/training/console.py `open_log_file`), or None when the
    command line names no run whose config loads (the launcher then runs as `composer` does)."""
    from gcc.training.config import load_config
    from gcc.training.console import RUN_LOG, open_log_file

    positional = [a for a in (script_args or [])[1:] if not a.startswith("-")]
    if not positional or "--print_config" in (script_args or []):
        return None
    logging.getLogger("gcc").addHandler(logging.NullHandler())  # a config's warning: each rank prints it
    try:
        return open_log_file(Path(load_config(positional[0], positional[1:]).run_dir) / RUN_LOG)
    except Exception:  # whatever the trouble (config, folder, a link), each rank reports it, naming it
        return None


def main(argv: Sequence[str] | None = None) -> int:
    """`gcc-launch [composer's flags] gcc/train.py <yaml> [overrides]` (module docstring): its exit code."""
    import gcc.compat.composer  # noqa: F401  (first: Composer loaded without the parts no process of a run uses)

    # isort: split
    from composer.cli import launcher

    from gcc.compat.composer_launcher import training_script_args
    from gcc.training.output_capture import LogLines

    args = sys.argv[1:] if argv is None else list(argv)
    sys.argv = [sys.argv[0], *args]  # the launcher reads its command line there
    log_fd = _open_run_log(training_script_args(args))
    if log_fd is None:
        return launcher.main()
    streams = sys.stdout, sys.stderr
    # the ranks inherit the launcher's fd 1 and fd 2, not these: local rank 0's output stays its own (and in
    # train.log through its own writer, gcc/training/output_capture.py), never twice
    tees = [_Tee(s, LogLines(log_fd, f"launcher {name}")) for s, name in zip(streams, ("stdout", "stderr"))]
    sys.stdout, sys.stderr = tees
    try:
        return launcher.main()
    finally:
        for tee in tees:
            tee.lines.feed("", final=True)
        sys.stdout, sys.stderr = streams
        os.close(log_fd)


if __name__ == "__main__":
    sys.exit(main())
