"""Composer 0.32.1's launcher (`composer -n N`, `composer.cli.launcher`): what gcc relies on beyond its documented
behaviour (gcc/compat/__init__.py). Kept apart from gcc/compat/composer.py, which loads Composer: a rank uses this
module also before torch and Composer are loaded (a bad config, gcc/training/entry.py).

- `let_rank0_exit_first`: the launcher reports the first non-zero exit *in rank order*
  (`_aggregate_process_returncode`), and once any rank has exited non-zero it SIGTERMs the ranks still running
  (`_monitor_processes`, then `_cleanup_processes`).
- `training_script_args`: the launcher's own parser (`_get_parser`) reads its command line.
- `launcher_args`: its whole reading of the command line and of the environment it defaults to (`_parse_args`:
  `LOCAL_WORLD_SIZE`, `WORLD_SIZE`, `BASE_RANK`, `NODE_RANK`, `MASTER_PORT`, read by `int()`), and the ValueError it
  raises for values it refuses (`-n 0`).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import signal
import sys
import time
from collections.abc import Iterable

from gcc.compat import require
from gcc.errors import BadInput
from gcc.inputs import env_int

require("mosaicml", "gcc/compat/composer_launcher.py")

# The launcher SIGTERMs the other ranks as soon as rank 0 has exited (a loaded machine can take several seconds to
# tear rank 0 down), so this is an upper bound, not a wait.
RANK0_FIRST_S = 60.0


def let_rank0_exit_first(code: int, signals: Iterable[signal.Signals], timeout_s: float = RANK0_FIRST_S) -> None:
    """On a rank other than 0, for a non-zero `code` that every rank reached together: wait (at most `timeout_s`)
    for the launcher to stop this rank once rank 0 has exited, and leave with `code` then (a `SystemExit`, so that
    the process's orderly exit follows). Each of `signals` (the launcher's SIGTERM among them) ends the wait so.

    Relies on Composer's launcher (verified with 0.32.1) reporting the first non-zero exit in rank order and
    SIGTERMing the ranks still running once one has exited non-zero: had this rank exited first, the launcher would
    report rank 0's -15 from that cleanup instead of the run's code. tests/compat/test_composer_launcher.py runs the
    launcher's own monitoring, cleanup and aggregation on processes that exit so."""

    def leave(signum, frame):
        raise SystemExit(code)

    for s in signals:
        signal.signal(s, leave)
    time.sleep(timeout_s)


def training_script_args(argv: list[str]) -> list[str] | None:
    """The training script and its arguments in a command line of Composer's launcher (`[flags] script args...`),
    as the launcher's own parser reads them (`_get_parser`, verified with 0.32.1); None when it does not (the
    launcher says why itself when it runs: its message is not printed here too)."""
    from composer.cli.launcher import _get_parser

    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            args = _get_parser().parse_args(argv)
    except SystemExit:  # --help, --version or a usage error
        return None
    return [args.training_script, *args.training_script_args]


# processes on one node: beyond it `-n` is a mistake, not a machine (each one loads torch)
MAX_NPROC = 1024
# the environment the launcher's reading defaults to, and each variable's range (it reads them with int(), which
# fails with a traceback on 'x' and takes '٣'): checked first, by gcc's reader (gcc.inputs.env_int)
LAUNCHER_ENV = {"LOCAL_WORLD_SIZE": (0, MAX_NPROC), "WORLD_SIZE": (1, 1 << 20), "BASE_RANK": (0, 1 << 20)}
LAUNCHER_ENV |= {"NODE_RANK": (0, 1 << 20), "MASTER_PORT": (1, 65535)}


def launcher_args(argv: list[str]) -> argparse.Namespace | None:
    """The launcher's reading of `argv` (`[flags] script args...`) and of its environment (`_parse_args`, verified
    with 0.32.1), or a BadInput with what it refused, in its words: a usage error (argparse's message, which quotes
    the command line: masked and escaped where it is printed), a value out of its range (`-n 0`: 'The nproc must be 1
    or greater'), a variable of LAUNCHER_ENV that is not an integer of its range. None for --help and --version,
    which it printed."""
    from composer.cli import launcher

    for name, (lo, hi) in LAUNCHER_ENV.items():
        env_int(name, lo, lo, hi)
    saved, out, err = sys.argv, io.StringIO(), io.StringIO()
    sys.argv = [saved[0], *argv]  # where `_parse_args` reads it
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            args = launcher._parse_args()
    except SystemExit as e:
        if e.code == 0:  # --help, --version
            print(out.getvalue(), end="", flush=True)
            return None
        raise BadInput(err.getvalue().strip().splitlines()[-1].split(": error: ", 1)[-1]) from None
    except ValueError as e:
        raise BadInput(f"{e}") from None
    finally:
        sys.argv = saved
    if args.nproc > MAX_NPROC:
        raise BadInput(f"-n {args.nproc}: more processes than one node runs (at most {MAX_NPROC})")
    return args
