"""How a training run is launched (docs/training.md, the first lines): `composer -n <N> [launcher flags] gcc/train.py
<yaml> [dotted.key=value ...]`, or the same through `gcc-launch`.

`train_command` builds that command line for every caller that launches runs: the demo, the benches and the tests'
launches. This module sits at the top of gcc/, beside gcc/train.py, so that bench/ and tests/ import it without
loading torch or Composer (an argument list, nothing else).

`main` is `gcc-launch` (`python -m gcc.launcher`): Composer's launcher itself, with the same flags, whose own lines
(a rank that crashed and its exit code, the launcher's tracebacks, what it prints of a crashed rank's output) also
go to the run's `<run_dir>/train.log` (`<UTC time> launcher <stdout|stderr>: <line>`, masked). The ranks cannot
take them: the launcher is another process, and the other ranks' output reaches it through files it deletes.
Before it creates or starts anything it checks what it was given, as the ranks would: its own flags and
environment (Composer's reading, `-n 0` included), then, for gcc/train.py, the trainer's command line and the
config (gcc/training/entry.py `checked_config`); a bad one is one line `gcc-launch: ...` and its exit code, and
nothing is created. Then train.log is opened as the ranks open it (gcc/training/console.py `open_log_file`). Another
script, or the trainer's --print_config, and the launcher runs as `composer` does. The launcher's console is as
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


def _checked_run(launch) -> int | None:
    """For a launch of gcc/train.py (`launch`: the launcher's reading of its command line), its command line and
    config checked as every rank checks them (gcc/training/entry.py `checked_config`), then the run's train.log
    opened for appending (gcc/training/console.py `open_log_file`, which creates the run folder): its descriptor.
    None for another script, or for the trainer's --print_config (nothing to check, no run). Raises the verdict's
    error (the config's, a link in place of train.log), or SystemExit for the trainer's usage error (printed)."""
    from gcc.training.console import RUN_LOG, open_log_file
    from gcc.training.entry import build_parser, checked_config

    if Path(launch.training_script).resolve() != TRAIN_SCRIPT:
        return None
    args = build_parser().parse_args(launch.training_script_args)
    if args.print_config:
        return None
    if args.yaml is None:
        build_parser().error("the yaml is required (or --print_config)")
    logging.getLogger("gcc").addHandler(logging.NullHandler())  # a config's warning: each rank prints it
    cfg = checked_config(args.yaml, args.overrides, launch.world_size)
    return open_log_file(Path(cfg.run_dir) / RUN_LOG)


def main(argv: Sequence[str] | None = None) -> int:
    """`gcc-launch [composer's flags] gcc/train.py <yaml> [overrides]` (module docstring): its exit code. Its
    command line, its environment and the config are checked before anything is created or started: a bad one is
    one line `gcc-launch: ...` and exit 2 (3 for a refused train.log)."""
    import gcc.compat.composer  # noqa: F401  (first: Composer loaded without the parts no process of a run uses)

    # isort: split
    from composer.cli import launcher

    from gcc import redact
    from gcc.cli import fail
    from gcc.compat.composer_launcher import launcher_args
    from gcc.errors import BadInput, launch_verdict
    from gcc.training.output_capture import LogLines

    redact.install()
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        launch = launcher_args(args)
    except BadInput as e:
        return fail("gcc-launch", str(e))
    if launch is None:  # --help, --version: printed
        return 0
    try:
        log_fd = _checked_run(launch)
    except SystemExit as e:  # the trainer's usage error, printed by its parser
        return e.code if isinstance(e.code, int) else 2
    except Exception as e:
        code, line = launch_verdict(e)  # anything but a verdict of gcc's is a bug: raised again
        print(f"gcc-launch: {redact.redact_text(line)}", file=sys.stderr, flush=True)
        return code
    sys.argv = [sys.argv[0], *args]  # the launcher reads its command line there
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
