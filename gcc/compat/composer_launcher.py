"""Composer 0.32.1's launcher (`composer -n N`, `composer.cli.launcher`): what gcc relies on beyond its documented
behaviour (gcc/compat/__init__.py). Kept apart from gcc/compat/composer.py, which loads Composer: a rank uses this
module also before torch and Composer are loaded (a bad config, gcc/training/entry.py).

- `let_rank0_exit_first`: the launcher reports the first non-zero exit *in rank order*
  (`_aggregate_process_returncode`), and once any rank has exited non-zero it SIGTERMs the ranks still running
  (`_monitor_processes`, then `_cleanup_processes`).
- `launcher_args`: the launcher's command line (`_get_parser`), read by a parser of the same options without
  loading Composer (gcc-launch checks the run's config before torch loads).
- `start_ranks`: the launcher's defaults (`_parse_args`) and its start of the ranks (`_launch_processes`), for
  gcc-launch, which then watches and ends them itself (gcc/launcher.py).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
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


# Composer's launcher's options (`_get_parser`, verified with 0.32.1): (option strings, type or None for a flag).
# tests/compat/test_composer_launcher.py checks them against the installed parser, action by action.
LAUNCHER_OPTIONS: tuple[tuple[tuple[str, ...], type | None], ...] = (
    (("-n", "--nproc"), int),
    (("--stdout",), str),
    (("--stderr",), str),
    (("-v", "--verbose"), None),
    (("-m", "--module_mode"), None),
    (("-c", "--command_mode"), None),
    (("--world_size",), int),
    (("--base_rank",), int),
    (("--node_rank",), int),
    (("--master_addr",), str),
    (("--master_port",), int),
)


def launcher_parser() -> argparse.ArgumentParser:
    """A parser of the launcher's command line with the options of Composer's own (`LAUNCHER_OPTIONS`), the training
    script and its arguments; without Composer loaded."""
    p = argparse.ArgumentParser(prog="composer")
    p.add_argument("--version", action="version", version="")
    for names, kind in LAUNCHER_OPTIONS:
        if kind is None:
            p.add_argument(*names, action="store_true")
        else:
            p.add_argument(*names, type=kind)
    p.add_argument("training_script", type=str)
    p.add_argument("training_script_args", nargs="...")
    return p


def launcher_args(argv: list[str]) -> argparse.Namespace | None:
    """A command line of Composer's launcher (`[flags] script args...`) as its parser reads it; None when it does
    not (--help, --version or a usage error: the launcher says why itself when it runs, not here too)."""
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            return launcher_parser().parse_args(argv)
    except SystemExit:
        return None


def world_size_of(args: argparse.Namespace) -> int | None:
    """The launch's world size as the launcher will set it (`_parse_args`: --world_size, else WORLD_SIZE on several
    nodes, else the node's --nproc or LOCAL_WORLD_SIZE); None where it counts the GPUs (no -n: torch would say)."""
    env = os.environ
    nproc = (
        args.nproc if args.nproc is not None else int(env["LOCAL_WORLD_SIZE"]) if "LOCAL_WORLD_SIZE" in env else None
    )
    if args.world_size is not None:
        return args.world_size
    if "WORLD_SIZE" in env and env.get("LOCAL_WORLD_SIZE") != env["WORLD_SIZE"]:
        return int(env["WORLD_SIZE"])
    return nproc


def training_script_args(argv: list[str]) -> list[str] | None:
    """The training script and its arguments in a command line of Composer's launcher, or None (`launcher_args`)."""
    args = launcher_args(argv)
    return None if args is None else [args.training_script, *args.training_script_args]


def start_ranks(argv: list[str], log_dir: str, processes: dict) -> argparse.Namespace:
    """Start the ranks of the command line `argv` as Composer's launcher does (its `_parse_args`, which fills in
    the defaults, and `_launch_processes`: each rank's environment, local rank 0 on the launcher's own streams, the
    others into the --stdout/--stderr files, by default `log_dir/rank{rank}.std{out,err}.txt` as the launcher's
    own), into `processes` ({global rank: Popen}: the ones started before an error too). Returns the arguments."""
    import sys

    from composer.cli import launcher

    saved, sys.argv = sys.argv, [sys.argv[0], *argv]
    try:
        args = launcher._parse_args()
    finally:
        sys.argv = saved
    args.stdout = args.stdout or f"{log_dir}/rank{{rank}}.stdout.txt"
    args.stderr = args.stderr or f"{log_dir}/rank{{rank}}.stderr.txt"
    launcher._launch_processes(
        nproc=args.nproc,
        world_size=args.world_size,
        base_rank=args.base_rank,
        node_rank=args.node_rank,
        master_addr=args.master_addr,
        master_port=args.master_port,
        module_mode=args.module_mode,
        command_mode=args.command_mode,
        stdout_file_format=args.stdout,
        stderr_file_format=args.stderr,
        training_script=args.training_script,
        training_script_args=args.training_script_args,
        processes=processes,
    )
    return args
