"""How a training run is launched (docs/training.md, the first lines): `composer -n <N> [launcher flags] gcc/train.py
<yaml> [dotted.key=value ...]`, or the same through `gcc-launch`.

`train_command` builds that command line for every caller that launches runs: the demo, the benches and the tests'
launches. This module sits at the top of gcc/, beside gcc/train.py, so that bench/ and tests/ import it without
loading torch or Composer (an argument list, nothing else).

`main` is `gcc-launch` (`python -m gcc.launcher`): Composer's launcher with the same flags and the same ranks
(their environment and streams are the launcher's own: gcc/compat/composer_launcher.py `start_ranks`), that checks
what it was given before it creates or starts anything and ends quietly (docs/training.md, "How a launch ends"):

- its own command line and the environment Composer's launcher defaults to (`-n` from 1 to 1024, `WORLD_SIZE`,
  ...: gcc/compat/composer_launcher.py `checked_launch`) are checked first, without loading Composer: a bad one is
  one line `gcc-launch: error: ...` (masked, escaped) and exit 2;
- gcc's trainer's command line and config are checked before any rank starts, without loading torch: a bad one is
  its one line and exit 2 within a second or two (`composer -n` answers it from every rank after their start);
  then Composer's own reading of the launch (`composer_args`: a layout it refuses is one line and exit 2), then
  the run's train.log opened (a link, symbolic or hard, in its place: refused, exit 3), and only then the ranks;
- the ranks are watched by gcc-launch itself (`watch`): a signal (SIGTERM, Ctrl-C) is passed on to them as SIGTERM,
  a preemption, and whatever still runs `CLEANUP_S` later is killed, as Composer's launcher does, but without its
  traceback, its "Waiting up to 30 seconds" and the empty blocks of every rank's output; a second Ctrl-C stops the
  ranks at once;
- a launch that ends on gcc's own terms (finished, preempted, config error, refusal, a fault) is the ranks' own
  line(s) and their code; a rank that crashed (a traceback, a signal) is one line naming it, its code and its own
  last words, and the launch exits with that rank's code (128 + the signal's number for a signal, as a shell says
  it), not with a peer's collateral failure. Its whole output is in train.log.

Its own lines also go to the run's `<run_dir>/train.log` (`<UTC time> launcher <stdout|stderr>: <line>`, masked):
the ranks cannot take them, the launcher is another process, and the other ranks' output reaches it through files
it deletes. train.log is opened as the ranks open it (gcc/training/console.py `open_log_file`). A training script
other than gcc's, or the trainer's --print_config, runs as `composer` runs it; --help and --version print
Composer's own text.
"""

from __future__ import annotations

import io
import logging
import math
import os
import signal
import sys
import tempfile
import time
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


# after a signal, or a rank's non-zero exit, the other ranks get this long to end before they are killed (the grace
# Composer's launcher gives them: docs/training.md, "Preemption grace"); after a second Ctrl-C, this long
CLEANUP_S = 30.0
AGAIN_S = 5.0
POLL_S = 0.1


def _is_gcc_trainer(script: str) -> bool:
    path = Path(script)
    return path.resolve() == TRAIN_SCRIPT or (path.name == TRAIN_SCRIPT.name and path.parent.name == "gcc")


def checked_run(launch):
    """For a launch of gcc's trainer (`launch`: the launcher's reading of its command line, `launcher_args`), the
    trainer's command line and config checked as every rank checks them (gcc/training/entry.py `checked_config`),
    without loading torch or Composer and without creating anything: the config. None for another script, or for
    the trainer's --print_config (nothing to check, no run). Raises the config's verdict (one of entry.py's
    `VERDICTS`), or SystemExit for the trainer's usage error or --help (printed by its parser)."""
    from gcc.compat.composer_launcher import world_size_of
    from gcc.training.entry import build_parser, checked_config

    if not _is_gcc_trainer(launch.training_script):
        return None
    parser = build_parser()
    args = parser.parse_args(launch.training_script_args)
    if args.print_config:
        return None
    if args.yaml is None:
        parser.error("the yaml is required (or --print_config)")
    return checked_config(args.yaml, args.overrides, world_size_of(launch))


def _verdict(e: BaseException) -> int:
    """The exit code of a verdict of gcc's (`gcc.errors.launch_verdict`), its one line printed as a rank prints it;
    anything else is a bug and is raised again."""
    from gcc.errors import launch_verdict

    code, line = launch_verdict(e)
    logging.getLogger("gcc.train").error(line)
    return code


def _open_run_log(run_dir: str) -> int:
    """The run's train.log opened for appending (gcc/training/console.py `open_log_file`, which creates the run
    folder). Raises its verdict when it cannot be: a Refusal for a link (symbolic or hard) or anything but a regular
    file in its place, a ConfigError for a run folder that cannot be created."""
    from gcc.training.console import RUN_LOG, open_log_file

    return open_log_file(Path(run_dir) / RUN_LOG)


def main(argv: Sequence[str] | None = None) -> int:
    """`gcc-launch [composer's flags] gcc/train.py <yaml> [overrides]` (module docstring): its exit code. Its
    command line, its environment and the config are checked before anything is created or started."""
    from gcc import exit_codes, redact
    from gcc.cli import fail
    from gcc.compat.composer_launcher import checked_launch, composer_args
    from gcc.errors import BadInput
    from gcc.training.console import configure_logging
    from gcc.training.entry import VERDICTS

    redact.install()  # every line it logs or reports, tracebacks included, masked from here on
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        parsed = checked_launch(args)
    except BadInput as e:
        return fail("gcc-launch", str(e))
    cfg = None
    if parsed is not None:
        configure_logging("ERROR", 0)  # a verdict alone: a renamed key's warning is rank 0's to say
        try:
            cfg = checked_run(parsed)
        except SystemExit as e:  # the trainer's usage error (or its --help), printed by its parser
            return e.code if isinstance(e.code, int) else exit_codes.CONFIG
        except VERDICTS as e:
            return _verdict(e)
    import gcc.compat.composer  # noqa: F401  (first: Composer loaded without the parts no process of a run uses)

    # isort: split
    from composer.cli import launcher

    from gcc.training.output_capture import LogLines

    if parsed is None:  # --help, --version: the launcher's own words
        sys.argv = [sys.argv[0], *args]
        return launcher.main()
    try:
        launch = composer_args(args)
    except BadInput as e:
        return fail("gcc-launch", str(e))
    if cfg is None:
        return run_ranks(launch, None)
    try:
        log_fd = _open_run_log(cfg.run_dir)
    except VERDICTS as e:
        return _verdict(e)
    streams = sys.stdout, sys.stderr
    # the ranks inherit the launcher's fd 1 and fd 2, not these: local rank 0's output stays its own (and in
    # train.log through its own writer, gcc/training/output_capture.py), never twice
    tees = [_Tee(s, LogLines(log_fd, f"launcher {name}")) for s, name in zip(streams, ("stdout", "stderr"))]
    sys.stdout, sys.stderr = tees
    try:
        return run_ranks(launch, Path(cfg.run_dir))
    finally:
        for tee in tees:
            tee.lines.feed("", final=True)
        sys.stdout, sys.stderr = streams
        os.close(log_fd)


def run_ranks(launch, run_dir: Path | None) -> int:
    """Start the ranks of the launcher's reading `launch` (`composer_args`) as Composer's launcher does, watch them
    to their end (`watch`), name a rank that crashed (`crash_line`), and return the launch's exit code
    (`launch_code`)."""
    from gcc import exit_codes
    from gcc.compat.composer_launcher import start_ranks
    from gcc.training.ending import LAUNCHER_NAMES_CRASHES

    os.environ[LAUNCHER_NAMES_CRASHES] = "1"  # the ranks inherit it
    said = {*exit_codes.TOGETHER, *exit_codes.FAULTS, exit_codes.INTERRUPTED}  # the ranks say why themselves
    processes: dict = {}
    signals: list[int] = []
    for s in (signal.SIGINT, signal.SIGTERM):  # Composer's handlers (a SystemExit, its traceback) replaced
        signal.signal(s, lambda signum, frame: signals.append(signum))
    with tempfile.TemporaryDirectory() as logs:
        started = True
        try:
            start_ranks(launch, logs, processes)
        except Exception as e:  # a rank that cannot be started (its command): the ranks started so far end
            print(f"gcc-launch: {type(e).__name__}: {e}", file=sys.stderr)
            signals.append(signal.SIGTERM)
            started = False
        ended, killed = watch(processes, signals)
        code, rank = launch_code(ended, collateral=exit_codes.PEER_LOST)
        if not started and code == 0:  # never a success
            code = 1
        if rank is not None and (code not in said or rank in killed):
            why = (
                f"did not end within {CLEANUP_S:g} s of the signal and was killed"
                if rank in killed
                else how_it_ended(ended[rank][0])
            )
            print(f"gcc-launch: rank {rank} {why}: {crash_line(run_dir, rank, launch)}", file=sys.stderr, flush=True)
    return code


def watch(processes: dict, signals: list[int]) -> tuple[dict[int, tuple[int | None, float]], set[int]]:
    """Wait for every rank to end. Once a rank exits non-zero, or a signal comes (`signals`, filled by the
    handlers), the others get SIGTERM (a preemption) and `CLEANUP_S` to end; a second SIGINT (Ctrl-C) is passed on
    and leaves them `AGAIN_S`; then whatever still runs is killed with all it started. Returns {rank: (its return
    code, None for one that outlived the kill; when it was seen)} and the ranks killed."""
    seen: dict[int, tuple[int | None, float]] = {}
    deadline: float | None = None
    killed: set[int] = set()
    handled = 0
    while True:
        now = time.monotonic()
        for rank, p in processes.items():
            if rank not in seen and p.poll() is not None:
                seen[rank] = (p.returncode, now)
        alive = {rank: p for rank, p in processes.items() if rank not in seen}
        if not alive:
            return seen, killed
        while handled < len(signals):
            again = signals[handled] == signal.SIGINT and signal.SIGINT in signals[:handled]
            _send(alive.values(), signal.SIGINT if again else signal.SIGTERM)
            deadline = min(deadline or math.inf, now + (AGAIN_S if again else CLEANUP_S))
            handled += 1
        if deadline is None and any(code != 0 for code, _ in seen.values()):
            _send(alive.values(), signal.SIGTERM)
            deadline = now + CLEANUP_S
        if deadline is not None and now > deadline:
            if killed:  # killed a while ago and still there
                return {**seen, **{rank: (None, now) for rank in alive}}, killed
            for p in alive.values():
                _kill_tree(p.pid)
            killed, deadline = set(alive), now + CLEANUP_S
        time.sleep(POLL_S)


def _send(processes, signum: int) -> None:
    for p in processes:
        try:
            os.kill(p.pid, signum)
        except ProcessLookupError:
            pass


def _kill_tree(pid: int) -> None:
    """SIGKILL a rank and every process it started (its loader workers, its writer): SIGKILL leaves it no chance to
    stop them itself."""
    import psutil

    try:
        proc = psutil.Process(pid)
        family = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for q in family:
        try:
            q.kill()
        except psutil.NoSuchProcess:
            pass


def launch_code(codes: dict[int, tuple[int | None, float]], collateral: int) -> tuple[int, int | None]:
    """(the launch's exit code, the rank it is from): the first rank seen to exit non-zero, the lowest of those
    seen at once (the cause: the others' codes follow from it), never one that exited `collateral` (its peer died
    first) while another failed; 128 + N for a rank ended by signal N; a rank that never ended is 1. (0, None) when
    every rank exited 0."""
    failed = sorted((code == collateral, when, rank, code) for rank, (code, when) in codes.items() if code != 0)
    if not failed:
        return 0, None
    _, _, rank, code = failed[0]
    if code is None:
        return 1, rank
    return (128 - code if code < 0 else code), rank


def how_it_ended(code: int | None) -> str:
    if code is None:
        return "did not end, even killed"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was ended by {name} (exit {128 - code})"
    return f"exited with code {code}"


# how much of the end of train.log (or of a rank's stderr file) a crashed rank's last words are looked for in: the
# crash is at its end, and the file may hold a long run's every launch
LAST_WORDS_BYTES = 4 << 20


def tail_lines(path: Path, limit: int | None = None) -> list[str]:
    """The lines of the last `limit` bytes (LAST_WORDS_BYTES) of the regular file `path` (the first, cut, left
    out); [] for a file that cannot be read or is not a regular one (a FIFO's writer is never waited for:
    `gcc.inputs.open_regular`)."""
    from gcc.errors import BadInput
    from gcc.inputs import open_regular

    limit = LAST_WORDS_BYTES if limit is None else limit
    try:
        with open_regular(path, "text", cap=sys.maxsize) as (fd, size):
            start = max(0, size - limit)
            data = os.pread(fd, size - start, start)
    except (BadInput, OSError):
        return []
    lines = data.decode("utf-8", "replace").splitlines()
    return lines[1:] if start else lines


def crash_line(run_dir: Path | None, rank: int, parsed) -> str:
    """The crashed rank's own last words: its 'Fatal Python error' line (a native crash), or the last line of its
    traceback (the error), or its last line, from this launch's part of train.log (or, without one, the rank's
    stderr file), their last LAST_WORDS_BYTES; and where its whole output is."""
    lines: list[str] = []
    where = ""
    if run_dir is not None and (run_dir / "train.log").is_file():
        from gcc.training.console import RUN_LOG

        log = run_dir / RUN_LOG
        tail = tail_lines(log)
        starts = [i for i, ln in enumerate(tail) if "==== launch " in ln]
        tag = f" rank {rank} stderr: "
        lines = [ln.split(tag, 1)[1] for ln in tail[starts[-1] if starts else 0 :] if tag in ln]
        where = f"; its whole output is in {log}"
    elif parsed is not None and rank != 0:  # the rank's stderr file (local rank 0's went to the console)
        try:
            name = parsed.stderr.format(
                rank=rank,
                world_size=parsed.world_size,
                local_rank=rank - parsed.base_rank,
                local_world_size=parsed.nproc,
                node_rank=parsed.node_rank,
            )
        except (KeyError, IndexError, ValueError):
            name = None
        lines = tail_lines(Path(name)) if name is not None else []
    return (last_words(lines) or "it printed nothing") + where


def last_words(lines: list[str]) -> str:
    """What a crashed process's output says of its end: the native crash's 'Fatal Python error: ...', else the
    error ending its last traceback, else its last non-empty line ("" for none)."""
    from gcc.inputs import printable

    lines = [ln.rstrip() for ln in lines if ln.strip()]
    fatal = [ln for ln in lines if ln.lstrip().startswith("Fatal Python error:")]
    if fatal:
        return printable(fatal[-1].strip())
    tracebacks = [i for i, ln in enumerate(lines) if ln.startswith("Traceback (most recent call last):")]
    if tracebacks:
        tail = [ln for ln in lines[tracebacks[-1] + 1 :] if not ln.startswith(" ")]
        if tail:
            return printable(tail[0])
    return printable(lines[-1]) if lines else ""


if __name__ == "__main__":
    sys.exit(main())
