"""Composer 0.32.1's launcher (`composer -n N`, `composer.cli.launcher`): what gcc relies on beyond its documented
behaviour (gcc/compat/__init__.py). Kept apart from gcc/compat/composer.py, which loads Composer: a rank uses this
module also before torch and Composer are loaded (a bad config, gcc/training/entry.py).

- `let_rank0_exit_first`: the launcher reports the first non-zero exit *in rank order*
  (`_aggregate_process_returncode`), and once any rank has exited non-zero it SIGTERMs the ranks still running
  (`_monitor_processes`, then `_cleanup_processes`).
- `training_script_args`: the launcher's own parser (`_get_parser`) reads its command line.
"""

from __future__ import annotations

import contextlib
import io
import signal
import time
from collections.abc import Iterable

from gcc.compat import require

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
