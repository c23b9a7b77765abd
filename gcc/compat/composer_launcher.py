"""Composer 0.32.1's launcher (`composer -n N`, `composer.cli.launcher`): what gcc relies on beyond its documented
behaviour (gcc/compat/__init__.py). Kept apart from gcc/compat/composer.py, which loads Composer: a rank uses this
module also before torch and Composer are loaded (a bad config, gcc/training/entry.py).

- `let_rank0_exit_first`: the launcher reports the first non-zero exit *in rank order*
  (`_aggregate_process_returncode`), and once any rank has exited non-zero it SIGTERMs the ranks still running
  (`_monitor_processes`, then `_cleanup_processes`).
- `launcher_args`: the launcher's command line (`_get_parser`), read by a parser of the same options without
  loading Composer (gcc-launch checks the run's config before torch loads); `checked_launch`: that reading and the
  environment the launcher defaults to (`LOCAL_WORLD_SIZE`, `WORLD_SIZE`, `BASE_RANK`, `NODE_RANK`, `MASTER_PORT`,
  which it reads with `int()`), checked as gcc reads numbers (gcc.inputs), `-n` in its range (Composer's `-n 0`:
  'The nproc must be 1 or greater').
- `composer_args`: the launcher's own reading with its defaults (`_parse_args`) and the ValueError it raises for a
  layout it refuses; `start_ranks`: its start of the ranks (`_launch_processes`), for gcc-launch, which then
  watches and ends them itself (gcc/launcher.py).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import signal
import time
from collections.abc import Callable, Iterable

from gcc.compat import require
from gcc.errors import BadInput
from gcc.inputs import env_int, parse_int

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


def launcher_parser(number: Callable[[str], int] = int) -> argparse.ArgumentParser:
    """A parser of the launcher's command line with the options of Composer's own (`LAUNCHER_OPTIONS`), the training
    script and its arguments; without Composer loaded. `number` reads the integer options (Composer's: int)."""
    p = argparse.ArgumentParser(prog="composer")
    p.add_argument("--version", action="version", version="")
    for names, kind in LAUNCHER_OPTIONS:
        if kind is None:
            p.add_argument(*names, action="store_true")
        else:
            p.add_argument(*names, type=number if kind is int else kind)
    p.add_argument("training_script", type=str)
    p.add_argument("training_script_args", nargs="...")
    return p


def launcher_args(argv: list[str]) -> argparse.Namespace | None:
    """A command line of Composer's launcher (`[flags] script args...`) as its parser reads it; None when it does
    not (--help, --version or a usage error: `checked_launch` says which)."""
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            return launcher_parser().parse_args(argv)
    except SystemExit:
        return None


# processes on one node: beyond it `-n` is a mistake, not a machine (each one loads torch)
MAX_NPROC = 1024
# the environment the launcher's reading defaults to, and each variable's range (it reads them with int(), which
# fails with a traceback on 'x' and takes '٣'): checked first, by gcc's reader (gcc.inputs.env_int)
LAUNCHER_ENV = {"LOCAL_WORLD_SIZE": (0, MAX_NPROC), "WORLD_SIZE": (1, 1 << 20), "BASE_RANK": (0, 1 << 20)}
LAUNCHER_ENV |= {"NODE_RANK": (0, 1 << 20), "MASTER_PORT": (1, 65535)}
# the flags that set the same, and their ranges (`-n`: 1..MAX_NPROC, in Composer's words below 1)
LAUNCHER_FLAGS = {"world_size": (1, 1 << 20), "base_rank": (0, 1 << 20), "node_rank": (0, 1 << 20)}
LAUNCHER_FLAGS |= {"master_port": (1, 65535)}


def _flag_int(text: str) -> int:
    """An integer option of the launcher's command line as gcc reads numbers (`gcc.inputs.parse_int`: ASCII digits,
    at most 40; `int` also takes '٣'), for argparse, which names the option and the value when it is not."""
    try:
        return parse_int(text, "option")
    except BadInput:
        raise ValueError(text) from None


_flag_int.__name__ = "int"  # argparse's message: "argument -n/--nproc: invalid int value: '٣'"


def checked_launch(argv: list[str]) -> argparse.Namespace | None:
    """The launcher's command line `argv` (`launcher_args`) and the environment it defaults to (`LAUNCHER_ENV`),
    checked without loading Composer, or a BadInput with what is refused: a variable of LAUNCHER_ENV that is not an
    integer of its range, a usage error (argparse's message, which quotes the command line: masked and escaped
    where it is printed; an integer option in other digits than ASCII's among them), `-n` out of 1..MAX_NPROC
    (below 1 in Composer's words, 'The nproc must be 1 or greater'), another integer option out of its range
    (LAUNCHER_FLAGS). None for --help and --version (Composer's launcher prints its own text)."""
    for name, (lo, hi) in LAUNCHER_ENV.items():
        env_int(name, lo, lo, hi)
    err = io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            args = launcher_parser(_flag_int).parse_args(argv)
    except SystemExit as e:
        if e.code == 0:  # --help, --version
            return None
        raise BadInput(err.getvalue().strip().splitlines()[-1].split(": error: ", 1)[-1]) from None
    if args.nproc is not None and args.nproc < 1:
        raise BadInput(f"-n {args.nproc}: The nproc must be 1 or greater")
    if args.nproc is not None and args.nproc > MAX_NPROC:
        raise BadInput(f"-n {args.nproc}: more processes than one node runs (at most {MAX_NPROC})")
    for dest, (lo, hi) in LAUNCHER_FLAGS.items():
        if getattr(args, dest) is not None:
            parse_int(str(getattr(args, dest)), f"--{dest}", lo, hi)
    return args


def world_size_of(args: argparse.Namespace) -> int | None:
    """The launch's world size as the launcher will set it (`_parse_args`: --world_size, else WORLD_SIZE on several
    nodes, else the node's --nproc or LOCAL_WORLD_SIZE, 0 read as 1); None where it counts the GPUs (no -n: torch
    would say). The environment is read as `checked_launch` checked it (an empty variable: unset)."""
    env = {name: os.environ[name] for name in LAUNCHER_ENV if os.environ.get(name, "") != ""}

    def read(name: str) -> int:
        lo, hi = LAUNCHER_ENV[name]
        return env_int(name, lo, lo, hi)

    nproc = (
        args.nproc
        if args.nproc is not None
        else max(read("LOCAL_WORLD_SIZE"), 1)
        if "LOCAL_WORLD_SIZE" in env
        else None
    )
    if args.world_size is not None:
        return args.world_size
    if "WORLD_SIZE" in env and env.get("LOCAL_WORLD_SIZE") != env["WORLD_SIZE"]:
        return read("WORLD_SIZE")
    return nproc


def composer_args(argv: list[str]) -> argparse.Namespace:
    """The launcher's own reading of the command line `argv` (its `_parse_args`, verified with 0.32.1: the defaults
    from the environment, the GPUs counted without -n), or a BadInput with the layout it refuses, in its words
    (`world_size(1) cannot be less than nproc(2)`, a node without its rank, ...)."""
    import sys

    from composer.cli import launcher

    saved, sys.argv = sys.argv, [sys.argv[0], *argv]
    try:
        return launcher._parse_args()
    except ValueError as e:
        raise BadInput(f"{e}") from None
    finally:
        sys.argv = saved


def start_ranks(args: argparse.Namespace, log_dir: str, processes: dict) -> None:
    """Start the ranks of the launcher's reading `args` (`composer_args`) as Composer's launcher does (its
    `_launch_processes`: each rank's environment, local rank 0 on the launcher's own streams, the others into the
    --stdout/--stderr files, by default `log_dir/rank{rank}.std{out,err}.txt` as the launcher's own), into
    `processes` ({global rank: Popen}: the ones started before an error too)."""
    from composer.cli import launcher

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
