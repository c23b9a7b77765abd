"""The one invariant of hostile input (docs/training.md, "Trust and safety"), checked by the fuzz tests in
tests/fuzz/ over inputs that Hypothesis generates.

Whatever an entry point is given, it ends with exit 0 or a code of `gcc/exit_codes.py` and, when not 0, one
printable line `<prog>: ...` saying what is wrong: never a traceback, never an exception out of `main`, within
`TIME_LIMIT_S`, and no file outside the folder it was told to write changes. `run_entry` calls an entry's
`main(argv)` in this process (so that hundreds of cases stay fast) with the process's state put back afterwards
(`process_state_restored`), under a timer that interrupts a hang (`Overran`) instead of waiting for it.

The fuzz runs are reproducible: the `gcc` Hypothesis profile derandomizes (the same cases on every run, chosen
from a fixed seed) and keeps no example database; `GCC_FUZZ_EXAMPLES` scales the number of cases (default 1).
The bounded-read tests use the same timer (`quickly`, `refused_quickly`) and measure what a call allocated
(`peak_allocated`).
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import shutil
import signal
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

from hypothesis import HealthCheck, settings

from gcc import exit_codes

CODES = frozenset(v for k, v in vars(exit_codes).items() if k.isupper() and isinstance(v, int))
TIME_LIMIT_S = (
    120.0  # a case that runs longer is a hang (the largest honest case takes seconds, its first imports included)
)
SCALE = float(os.environ.get("GCC_FUZZ_EXAMPLES", "1"))

settings.register_profile(
    "gcc",
    derandomize=True,  # the same cases on every run: a failure is reproduced by rerunning the test
    database=None,
    deadline=None,  # time is bounded by run_entry's timer, not Hypothesis's (a loaded machine is not a bug)
    print_blob=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
settings.load_profile("gcc")


def examples(n: int) -> settings:
    """Hypothesis settings for `n` cases (times GCC_FUZZ_EXAMPLES)."""
    return settings(max_examples=max(1, round(n * SCALE)))


def _process_group_initialized() -> bool:
    tdist = sys.modules.get("torch.distributed")  # never imported here: a test that did not load torch has no group
    return tdist is not None and tdist.is_available() and tdist.is_initialized()


@contextmanager
def process_state_restored() -> Iterator[None]:
    """What a process would have thrown away is put back afterwards: the `gcc` and root loggers' handlers and
    levels (an entry configures its console and may open `<run_dir>/train.log`; the tools call
    logging.basicConfig), boto3's default session, which keeps the first credentials it resolved, and no process group
    (a refused trainer entry may have joined its one-rank group)."""
    loggers = [logging.getLogger("gcc"), logging.getLogger()]
    saved = [(lg, list(lg.handlers), lg.level, lg.propagate) for lg in loggers]
    had_group = _process_group_initialized()
    try:
        yield
    finally:
        if not had_group and _process_group_initialized():
            # a trainer entry that got as far as joining its (one-rank) process group and was then refused leaves
            # the group behind; the next test in this worker that starts its own group would fail
            sys.modules["torch.distributed"].destroy_process_group()
        for lg, handlers, level, propagate in saved:
            for h in list(lg.handlers):
                if h not in handlers:
                    lg.removeHandler(h)
                    h.close()
            for h in handlers:
                if h not in lg.handlers:
                    lg.addHandler(h)
            lg.setLevel(level)
            lg.propagate = propagate
        boto3 = sys.modules.get("boto3")
        if boto3 is not None:
            boto3.DEFAULT_SESSION = None


class Overran(BaseException):
    """An entry ran past TIME_LIMIT_S (a BaseException, so that no `except Exception` of the code under test
    turns it into an ordinary error)."""


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Interrupt this (main) thread with `Overran` after `seconds`: a real signal, so that a read blocked in the
    kernel (a FIFO, a socket) is interrupted too. SIGUSR2: nothing in gcc or pytest-timeout uses it."""
    done = threading.Event()

    def on_signal(signum, frame):
        raise Overran(f"still running after {seconds:.0f} s")

    def timer():
        if not done.wait(seconds):
            signal.pthread_kill(main, signal.SIGUSR2)

    main = threading.main_thread().ident
    old = signal.signal(signal.SIGUSR2, on_signal)
    t = threading.Thread(target=timer, daemon=True)
    t.start()
    try:
        yield
    finally:
        done.set()
        t.join()
        signal.signal(signal.SIGUSR2, old)


@dataclass
class Outcome:
    prog: str
    argv: list[str]
    code: int
    out: str
    err: str
    seconds: float

    # subprocess.CompletedProcess's names, so that a check written for a process reads an outcome too
    returncode = property(lambda self: self.code)
    stdout = property(lambda self: self.out)
    stderr = property(lambda self: self.err)

    def __str__(self) -> str:
        return f"{self.prog} {self.argv} -> {self.code} in {self.seconds:.1f} s\n{(self.out + self.err)[-3000:]}"


def mains() -> dict[str, Callable[[list[str]], int]]:
    """Each program's main(argv), as its console script (pyproject.toml) or gcc/train.py calls it."""
    from gcc.data.convert import main as convert_main
    from gcc.launcher import main as launch_main
    from gcc.synth.world import main as synth_main
    from gcc.tools.compare import main as compare_main
    from gcc.tools.inspect_ckpt import main as inspect_main
    from gcc.tools.maskstats import main as maskstats_main
    from gcc.tools.plot import main as plot_main
    from gcc.tools.sample.cli import main as sample_main
    from gcc.training.entry import main as train_main

    return {
        "gcc.train": train_main,
        "convert_data": convert_main,
        "gcc-synth": synth_main,
        "gcc-inspect": inspect_main,
        "gcc-plot": plot_main,
        "gcc-compare": compare_main,
        "gcc-maskstats": maskstats_main,
        "gcc-sample": sample_main,
        "gcc-launch": launch_main,
    }


def run_entry(prog: str, argv: list[str], limit_s: float = TIME_LIMIT_S, cwd: Path | None = None) -> Outcome:
    """`prog`'s main(argv) in this process (in the folder `cwd`, if given): its exit code and everything it
    printed or logged. An exception out of main propagates (the test fails with it); a hang raises Overran."""
    out, err = io.StringIO(), io.StringIO()
    logged = logging.StreamHandler(err)  # the tools' log lines (pytest's own handlers would swallow them)
    t0 = time.monotonic()
    with process_state_restored(), redirect_stdout(out), redirect_stderr(err):
        logging.getLogger().addHandler(logged)
        argv0, cwd0 = sys.argv, os.getcwd()
        sys.argv = [prog]
        try:
            if cwd is not None:
                os.chdir(cwd)
            with time_limit(limit_s):
                code = mains()[prog](argv)
        except SystemExit as e:  # argparse's answer to a bad flag
            code = e.code if isinstance(e.code, int) else 1
        finally:
            sys.argv = argv0
            os.chdir(cwd0)
            logging.getLogger().removeHandler(logged)
    return Outcome(prog, argv, code, out.getvalue(), err.getvalue(), time.monotonic() - t0)


# the first words of an entry's answer to bad input: the tools' `<prog>: error: `, the trainer's verdicts
# the trainer's command-line parser is named as the user runs it (argparse's `gcc/train.py: error: ...`); gcc-launch
# answers its own flags and environment as `gcc-launch: error: ...` and the trainer's config as a rank does
# (`gcc.train: config error: ...`, before any rank starts: gcc/launcher.py)
ALIASES = {"gcc.train": ("gcc.train", "gcc/train.py"), "gcc-launch": ("gcc-launch", "gcc.train", "gcc/train.py")}
VERDICTS = ("error: ", "config error: ", "refused: ", "damaged data: ", "storage unavailable: ", "disk full: ")


def assert_clean(o: Outcome, codes: frozenset[int] = CODES) -> None:
    """The invariant (module docstring) of one outcome."""
    text = o.out + o.err
    assert "Traceback (most recent call last)" not in text, str(o)
    assert o.code in codes, str(o)
    if o.code not in (exit_codes.OK, exit_codes.DIFFER):
        lines = [
            ln
            for ln in o.err.splitlines()
            for name in ALIASES.get(o.prog, (o.prog,))
            if ln.startswith(f"{name}: ") and ln[len(name) + 2 :].startswith(VERDICTS)
        ]
        assert lines, f"no one-line message `{o.prog}: error: ...`\n{o}"
        assert all(ln.isprintable() for ln in lines), f"a control character in the message\n{o}"


def digest_tree(root: Path, skip: Path | None = None) -> dict[str, str]:
    """{relative path: what it is} of everything under `root` except `skip` (links by their target, files by
    content): two digests differ when any file outside `skip` changed."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        d = Path(dirpath)
        if skip is not None and (d == skip or skip in d.parents):
            dirnames[:] = []
            continue
        for name in dirnames + filenames:
            p = d / name
            if p == skip:
                continue
            rel = str(p.relative_to(root))
            if p.is_symlink():
                found[rel] = "-> " + os.readlink(p)
            elif p.is_file():
                found[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
            elif p.is_dir():
                found[rel] = "dir"
            else:
                found[rel] = "other"
    return found


def quickly(call: Callable, within_s: float = 20.0) -> dict:
    """{"value": what `call()` returned} or {"error": the Exception it raised}, within `within_s` (`time_limit`:
    a regression, a read that waits on a FIFO for ever, fails the test instead of hanging the session)."""
    result: dict = {}
    try:
        with time_limit(within_s):
            try:
                result["value"] = call()
            except Exception as e:  # whatever it raised is what the test looks at
                result["error"] = e
    except Overran:
        raise AssertionError(f"still running after {within_s} s (a read that blocks)") from None
    return result


def refused_quickly(call: Callable, error: type[BaseException], *match: str, within_s: float = 20.0) -> BaseException:
    """`call()` raises `error` whose message holds every `match`, within `within_s` (see `quickly`)."""
    e = quickly(call, within_s).get("error")
    assert isinstance(e, error), f"expected {error.__name__}, got {e!r}"
    for m in match:
        assert m in str(e), str(e)
    return e


def peak_allocated(call: Callable) -> tuple[int, BaseException | None]:
    """(the most bytes Python's allocators held at once while `call()` ran, beyond what they held before; the
    exception it raised, or None). Bytes objects that C code creates (a decompressor's output) count too."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        try:
            call()
            error = None
        except Exception as e:  # returned to the test
            error = e
        return tracemalloc.get_traced_memory()[1] - base, error
    finally:
        tracemalloc.stop()


# the top-level names a Python process gcc starts imports first (its helpers import multiprocessing, gcc and what
# gcc.data.dataset loads; convert_data is a package of this project too)
HOSTILE_MODULES = ("gcc", "convert_data", "multiprocessing", "torch", "streaming", "composer")


def hostile_folder(folder: Path, names: tuple[str, ...] = HOSTILE_MODULES, package: bool = True) -> Path:
    """`folder` holding a module of each of `names` (a package `<name>/__init__.py`, or `<name>.py`) whose import
    leaves a file `RAN-<name>-<pid>` in `folder`: a process started in `folder` that imports from its working
    directory (as `python -m` and `python -c` do) leaves one (`ran_in`)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        code = f"import os\nopen(os.path.join({str(folder)!r}, f'RAN-{name}-{{os.getpid()}}'), 'w').close()\n"
        if package:
            (folder / name).mkdir(exist_ok=True)
            (folder / name / "__init__.py").write_text(code)
        else:
            (folder / f"{name}.py").write_text(code)
    return folder


def ran_in(folder: Path) -> list[str]:
    """What `hostile_folder`'s modules left in `folder`: the modules that were imported from it, and by which pid."""
    return sorted(p.name for p in folder.glob("RAN-*"))


def peak_rss(argv: list[str], timeout_s: float = 600, **kwargs) -> tuple[int, str, int]:
    """`argv` run as a process to its end: (exit code, what it printed on stderr, the most memory it held: its peak
    resident set in bytes, which the kernel reports for the process when it is reaped, `wait4`)."""
    import subprocess
    import tempfile

    with tempfile.TemporaryFile() as err:
        p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, **kwargs)
        with time_limit(timeout_s):
            _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
        err.seek(0)
        return p.returncode, err.read().decode(errors="replace"), usage.ru_maxrss * 1024


# what a file a writer opens in place may be: its own file, or what was planted there (a hard link to a file
# elsewhere, which O_NOFOLLOW does not stop; a symbolic link; a FIFO; a file of another user)
PLANTED = ("own", "hard link", "symbolic link", "fifo", "another user's")


def plant(path: Path, kind: str, victim: Path, names: int = 2) -> None:
    """`path` made a `kind` of PLANTED for the file `victim` ("own": a copy of it; "hard link": `victim` then has
    `names` names; "another user's": a copy owned by uid 4321, which only root can make)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    if kind == "hard link":
        for i in range(names - 1):
            os.link(victim, path if i == 0 else path.with_name(f"{path.name}.other{i}"))
    elif kind == "symbolic link":
        path.symlink_to(victim)
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        shutil.copyfile(victim, path)
        if kind == "another user's":
            os.chown(path, 4321, 4321)


def write_logs(run: Path, rows: int, seed: int = 0) -> int:
    """A run folder's train_log.csv (the trainer's columns, `rows` rows of generated numbers) and val_log.csv (a
    quarter as many rows, three timesteps a step): their bytes."""
    import csv
    import random

    from gcc.training.columns import TRAIN_COLUMNS, VAL_COLUMNS

    rng = random.Random(seed)
    run.mkdir(parents=True, exist_ok=True)
    with open(run / "train_log.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(TRAIN_COLUMNS)
        for step in range(1, rows + 1):
            w.writerow([step, *(repr(rng.random()) for _ in TRAIN_COLUMNS[1:-1]), "c1;c2;c3;c4"])
    with open(run / "val_log.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(VAL_COLUMNS)
        for i in range(rows // 4):
            w.writerow([i // 3 * 10, (200.5, 500.5, 800.5)[i % 3], *(repr(rng.random()) for _ in VAL_COLUMNS[2:])])
    return sum((run / n).stat().st_size for n in ("train_log.csv", "val_log.csv"))
