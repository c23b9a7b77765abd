"""Numbers from outside, generated (docs/training.md, "Trust and safety"): integers of any length (past gcc's 40
digits, past Python's 4300), digits of other scripts ('²', which `str.isdigit()` takes and `int()` refuses; '٣',
which `int()` reads), signs, spaces, nothing. They reach the one number parser (`gcc.inputs.parse_int`), the
launcher's environment of the trainer and of `gcc-launch` (with its `-n`), and the names that hold a step
(`samples/step-N`, `step-N.safetensors`, checkpoints). Each is read as the integer it is, in its range, or refused
with one line naming it; never a traceback. (JSON documents with such integers: tests/fuzz/test_fuzz_data.py.)"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hostile import assert_clean, examples, run_entry
from hypothesis import given
from hypothesis import strategies as st

from gcc import exit_codes, inputs
from gcc.errors import BadInput

ROOT = Path(__file__).resolve().parents[2]

NUMBERS = st.one_of(
    st.integers(-(10**6), 10**6).map(str),
    st.integers(1, 6000).map(lambda n: "9" * n),
    st.text(st.characters(categories=["Nd", "No"]), min_size=1, max_size=4),  # ٣, ², १२, ...
    st.sampled_from(["", " ", " 3 ", "+2", "-0", "0x10", "1e3", "1_000", "3.0", "٣", "²", "१२", "4\n", "0", "1"]),
    st.text(max_size=6),
)
ASCII_INTEGER = re.compile(r"[+-]?[0-9]{1,40}")


@examples(400)
@given(text=NUMBERS, lo=st.one_of(st.none(), st.integers(-5, 5)), span=st.one_of(st.none(), st.integers(0, 10**7)))
def test_parse_int_reads_an_ascii_integer_in_its_range_and_names_anything_else(text, lo, span):
    hi = None if span is None else (lo or 0) + span
    try:
        n = inputs.parse_int(text, "THE_NAME", lo, hi)
    except BadInput as e:
        assert str(e).startswith("THE_NAME=") and str(e).isprintable(), str(e)
        n = None
    ascii_integer = ASCII_INTEGER.fullmatch(text.strip())
    if n is None:
        assert not ascii_integer or (lo is not None and int(text) < lo) or (hi is not None and int(text) > hi)
    else:
        assert ascii_integer and n == int(text)


@contextlib.contextmanager
def environ(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    import gcc.compat.composer  # noqa: F401  (loaded once, outside any case's time limit: gcc-launch's)

    return tmp_path_factory.mktemp("fuzz_numbers")


LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_PORT")
environments = st.dictionaries(
    st.sampled_from(LAUNCH_ENV), NUMBERS.filter(lambda v: "\0" not in v and "=" not in v), max_size=3
)
# a config that fails its check after the environment's: a case never starts a run, whatever the environment
BAD_CONFIG = "max_duration=-1"


def _named(o, env: dict[str, str], bad: str | None) -> None:
    """The outcome's one line names the variable `bad` (None: the environment passed, the config is the trouble)."""
    assert_clean(o, frozenset({exit_codes.CONFIG}))
    if bad is not None:
        assert f"{bad}=" in o.err, (env, o)
    else:
        assert "max_duration" in o.err, (env, o)


@examples(60)
@given(env=environments)
def test_the_trainer_answers_any_launcher_environment(scratch, env):
    """A rank checks RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK and MASTER_PORT first
    (gcc/training/ranks.py), each an integer of its range given the others, before it reads anything else."""
    from gcc.training import ranks

    case = Path(tempfile.mkdtemp(dir=scratch))
    argv = [str(ROOT / "yamls" / "tiny_cpu.yaml"), f"run_dir={case / 'run'}", f"data.path={case}", BAD_CONFIG]
    with environ(env):
        try:
            ranks.check()
            bad = None
        except BadInput as e:
            bad = str(e).split(": ", 1)[1].split("=", 1)[0]
        o = run_entry("gcc.train", argv)
    _named(o, env, bad)
    assert not (case / "run").exists(), o  # nothing written before the verdict


@examples(40)
@given(
    env=st.dictionaries(
        st.sampled_from(["LOCAL_WORLD_SIZE", "WORLD_SIZE", "BASE_RANK", "NODE_RANK", "MASTER_PORT"]),
        NUMBERS.filter(lambda v: "\0" not in v and "=" not in v),
        max_size=2,
    ),
    nproc=st.one_of(st.none(), NUMBERS.filter(lambda v: "\0" not in v)),
)
def test_gcc_launch_answers_any_n_and_launcher_environment_before_it_creates_anything(scratch, env, nproc):
    """`gcc-launch` reads its flags and the environment Composer's launcher defaults to (`-n 0`, `WORLD_SIZE=x`,
    `LOCAL_WORLD_SIZE=²`) before it creates or starts anything: one line and exit 2, no run folder, no rank."""
    from gcc.launcher import TRAIN_SCRIPT

    case = Path(tempfile.mkdtemp(dir=scratch))
    flags = [] if nproc is None else ["-n", nproc]
    argv = [*flags, str(TRAIN_SCRIPT), str(ROOT / "yamls" / "tiny_cpu.yaml"), f"run_dir={case / 'run'}", BAD_CONFIG]
    with environ(env):
        o = run_entry("gcc-launch", argv)
    assert_clean(o, frozenset({exit_codes.CONFIG}))
    assert not (case / "run").exists(), o


# a file name holds at most 255 bytes (the longest of these names adds 18 to N)
STEPS = NUMBERS.filter(
    lambda v: v and "/" not in v and "\0" not in v and v.strip() == v and v not in (".", "..") and len(v.encode()) < 230
)


@examples(60)
@given(names=st.lists(STEPS, min_size=1, max_size=4, unique=True))
def test_a_name_that_holds_a_step_is_read_only_in_ascii_digits(scratch, names):
    """samples/step-N, step-N.safetensors and checkpoints ep0-baN...: a name whose N is not ASCII digits (or has more
    than 18) is not one of the run's, and is left alone, never an int() that fails mid-run; a checkpoint's name that
    Composer would read as a step is refused before the run starts."""
    from gcc.tools.compare import export_steps
    from gcc.training.callbacks.samples import rotate_samples
    from gcc.training.run_folder import Refusal, check_run_folder, list_checkpoints, repair_checkpoints

    run = Path(tempfile.mkdtemp(dir=scratch))
    (run / "checkpoints").mkdir()
    for n in names:
        (run / "samples" / f"step-{n}").mkdir(parents=True)
        (run / f"step-{n}.safetensors").write_bytes(b"")
        (run / "checkpoints" / f"ep0-ba{n}-rank0.pt").write_bytes(b"")
    ours = sorted(int(n) for n in names if re.fullmatch(r"[0-9]{1,18}", n))
    removed = rotate_samples(run, keep=1)
    assert sorted(int(p.name[5:]) for p in removed) == ours[:-1]
    assert sorted(export_steps(run)) == sorted({int(n) for n in names if re.fullmatch(r"0|[1-9][0-9]{0,17}", n)})
    assert [s for s, _ in list_checkpoints(run)] == ours
    # a name Composer's own check of its folder reads as a step (`\d` of any script) and gcc does not is refused
    # before the Trainer starts (Composer would stop on it with a FileExistsError)
    composers = [n for n in names if re.match(r"^\d+$", n) and not re.fullmatch(r"[0-9]{1,18}", n)]
    with pytest.raises(Refusal, match="not in ASCII digits") if composers else contextlib.nullcontext():
        check_run_folder(run)
    assert repair_checkpoints(run) is None  # none of them is a complete checkpoint (empty files)
