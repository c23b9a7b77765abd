"""Hostile run folders for the tools that read a run's logs (`gcc-plot`, `gcc-compare`): generated CSVs, with
the real columns or not, cells of any text (control characters, inf, nan, huge or negative steps), rows of any
length, and the files themselves replaced by a folder, a FIFO, a link to /dev/zero or a missing file. The
invariant of tests/hostile.py holds for every case, and nothing outside the tool's output file is written."""

from __future__ import annotations

import csv
import io
import os
import tempfile
from pathlib import Path

import pytest
from hostile import assert_clean, digest_tree, examples, run_entry
from hypothesis import given
from hypothesis import strategies as st

from gcc import exit_codes
from gcc.training.columns import TRAIN_COLUMNS, VAL_COLUMNS

CELLS = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(
        ["", "inf", "-inf", "nan", "NaN", "1e309", "0x10", " 3", "3 ", "\x1b[2J", "a\rb", '"', "é", "\x00"]
    ),
    st.text(max_size=12),
)


@st.composite
def csv_logs(draw, columns: list[str]) -> bytes:
    """A CSV that starts from a log's real header (or a mangled one) and holds generated rows."""
    header = list(columns)
    if draw(st.booleans()):
        header = draw(st.lists(st.sampled_from([*columns, "x", "step", ""]), max_size=len(columns) + 2))
    rows = draw(
        st.lists(
            st.one_of(
                st.lists(CELLS, min_size=len(header), max_size=len(header)),
                st.lists(CELLS, max_size=len(header) + 2),
            ),
            max_size=8,
        )
    )
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(header)
    w.writerows(rows)
    text = buf.getvalue()
    if draw(st.integers(0, 9)) == 0:  # cut anywhere, even inside a multi-byte character
        data = text.encode()
        return data[: draw(st.integers(0, len(data)))]
    return text.encode()


def files(names: list[str]):
    """A run folder's files: each a generated CSV, or something that is not a regular file (or nothing)."""
    columns = {"train_log.csv": TRAIN_COLUMNS, "val_log.csv": VAL_COLUMNS}
    return st.fixed_dictionaries(
        {
            n: st.one_of(
                csv_logs(columns[n]),
                st.sampled_from(["missing", "folder", "fifo", "devzero", "dangling"]),
                st.binary(max_size=64),
            )
            for n in names
        }
    )


def write_run(run: Path, spec: dict) -> None:
    run.mkdir(parents=True)
    for name, what in spec.items():
        p = run / name
        if isinstance(what, bytes):
            p.write_bytes(what)
        elif what == "folder":
            p.mkdir()
        elif what == "fifo":
            os.mkfifo(p)
        elif what == "devzero":
            p.symlink_to("/dev/zero")
        elif what == "dangling":
            p.symlink_to(run / "nowhere")


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz_tools")


@examples(60)
@given(spec=files(["train_log.csv", "val_log.csv"]))
def test_gcc_plot_answers_any_run_folder(scratch, spec):
    case = Path(tempfile.mkdtemp(dir=scratch))
    write_run(case / "run", spec)
    before = digest_tree(case)
    o = run_entry("gcc-plot", [str(case / "run"), "--out", str(case / "curves.png")])
    assert_clean(o, frozenset({exit_codes.OK, exit_codes.CONFIG}))
    after = digest_tree(case)
    after.pop("curves.png", None)
    assert after == before, o


@examples(60)
@given(a=files(["train_log.csv", "val_log.csv"]), b=files(["train_log.csv", "val_log.csv"]))
def test_gcc_compare_answers_any_two_run_folders(scratch, a, b):
    case = Path(tempfile.mkdtemp(dir=scratch))
    write_run(case / "a", a)
    write_run(case / "b", b)
    before = digest_tree(case)
    o = run_entry("gcc-compare", [str(case / "a"), str(case / "b")])
    assert_clean(o, frozenset({exit_codes.OK, exit_codes.DIFFER, exit_codes.CONFIG}))
    if o.code == exit_codes.OK:  # "they agree" only when there was something to compare
        assert "agree" in o.out and "nothing" not in o.out.lower(), o
    assert digest_tree(case) == before, o
