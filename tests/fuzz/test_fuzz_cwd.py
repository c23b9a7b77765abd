"""A working directory that holds modules named like gcc's, its libraries' or the standard library's (docs/training.md,
"Trust and safety"): no process gcc starts imports from it. `python -m` and `python -c`, which gcc's helpers are
(train.log's writer, the forkserver of the loader workers and converter processes, multiprocessing's resource
tracker), put the working directory first on their sys.path; gcc starts them with `-P` (gcc/compat/python.py).

Every entry point runs here as a real process (its console script) from a generated hostile folder: each answers
--help, `convert_data --workers 2` converts (a forkserver, its workers, the resource tracker) and `gcc-maskstats`
reads the result through Streaming (its shared memory starts the resource tracker); a training launch from such a
folder is the session's reference run (tests/conftest.py `reference`, checked in tests/compat/test_python.py)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hostile import HOSTILE_MODULES, examples, hostile_folder, ran_in
from hypothesis import given
from hypothesis import strategies as st

from gcc.launcher import TRAIN_SCRIPT

BIN = Path(sys.executable).parent
SCRIPTS = ["convert_data", "gcc-synth", "gcc-sample", "gcc-maskstats", "gcc-inspect", "gcc-plot", "gcc-compare"]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    from gcc.synth.world import make_prepared

    return make_prepared(tmp_path_factory.mktemp("fuzz_cwd"), clips=4, seed=5)


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
    return r


@pytest.mark.slow
@examples(2)
@given(names=st.sets(st.sampled_from(HOSTILE_MODULES), min_size=1).map(tuple), package=st.booleans())
def test_no_process_an_entry_point_starts_imports_from_the_working_directory(prepared, names, package):
    cwd = hostile_folder(Path(tempfile.mkdtemp(dir=prepared.parent)) / "cwd", names, package)
    for script in SCRIPTS:
        assert _run([str(BIN / script), "--help"], cwd).returncode == 0
    assert _run([str(BIN / "gcc-launch"), str(TRAIN_SCRIPT), "--print_config"], cwd).returncode == 0
    out = cwd.parent / "shards"
    convert = [str(BIN / "convert_data"), "--data", str(prepared), "--out", str(out), "--workers", "2"]
    r = _run([*convert, "--chunk_clips", "1"], cwd)  # a chunk a clip: the pool of 2 processes runs
    assert r.returncode == 0 and (out / "manifest.json").is_file(), r.stderr
    r = _run([str(BIN / "gcc-maskstats"), "--data", str(out), "--n", "1"], cwd)
    assert r.returncode == 0, r.stderr
    assert ran_in(cwd) == []
