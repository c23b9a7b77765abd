"""One command-line convention for every tool: console scripts, snake_case flags (old spellings as aliases),
help text on every flag, the `python -m` forms still working, and errors as `<prog>: error: ...` with exit 2
(docs/training.md, Tools; the cases of bad input: tests/tools/test_bad_input.py)."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
MODULES = {
    "convert_data": "convert_data",
    "gcc-synth": "gcc.synth.world",
    "gcc-sample": "gcc.tools.sample",
    "gcc-maskstats": "gcc.tools.maskstats",
    "gcc-inspect": "gcc.tools.inspect_ckpt",
    "gcc-plot": "gcc.tools.plot",
    "gcc-compare": "gcc.tools.compare",
}


def _parser(entry: str) -> argparse.ArgumentParser:
    module = importlib.import_module(entry.split(":")[0])
    assert callable(getattr(module, entry.split(":")[1]))
    return module.build_parser()


def test_every_tool_is_a_console_script():
    assert set(SCRIPTS) == set(MODULES)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_flags_are_snake_case_with_help(name):
    p = _parser(SCRIPTS[name])
    for action in p._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help, f"{name}: {action.option_strings or action.dest} has no help text"
        longs = [o for o in action.option_strings if o.startswith("--")]
        if longs:  # the first spelling (the one --help shows first) is snake_case; later ones are old aliases
            assert "-" not in longs[0][2:], f"{name}: {longs[0]} is not snake_case"
            assert all(o.replace("-", "_")[2:] == longs[0][2:] for o in longs[1:]), longs


def test_old_spellings_still_parse_the_same():
    p = _parser(SCRIPTS["convert_data"])
    old = p.parse_args(
        ["--src", "a", "--out", "b", "--include-dropped", "--chunk-clips", "3", "--size-limit", "9", "--no-progress"]
    )
    new = p.parse_args(
        ["--src", "a", "--out", "b", "--include_dropped", "--chunk_clips", "3", "--size_limit", "9", "--no_progress"]
    )
    assert vars(old) == vars(new) and new.chunk_clips == 3 and new.include_dropped and new.no_progress


@pytest.mark.parametrize("name", sorted(MODULES))
def test_console_script_and_python_m_forms_answer_help(name):
    exe = Path(sys.executable).with_name(name)
    assert exe.exists(), f"{exe}: not installed (pip install -e .)"
    for cmd in ([str(exe), "--help"], [sys.executable, "-m", MODULES[name], "--help"]):
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
        assert r.returncode == 0 and "usage:" in r.stdout, (cmd, r.stdout[-500:], r.stderr[-2000:])


@pytest.mark.parametrize("name", sorted(MODULES))
def test_a_usage_error_is_prog_error_and_exit_2(name):
    """argparse's convention, which every tool's own input errors follow too (gcc/cli.py)."""
    r = subprocess.run(
        [str(Path(sys.executable).with_name(name)), "--no_such_flag"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.splitlines()[-1].startswith(f"{name}: error: "), r.stderr[-2000:]
