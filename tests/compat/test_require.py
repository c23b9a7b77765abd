"""gcc/compat/__init__.py: each adapter checks the installed version of its library when it is imported; outside
the version it was verified with, the process stops with a message (exit 2) unless the override names it."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gcc import compat
from gcc.compat import OVERRIDE, UnverifiedLibrary, installed, require

ROOT = Path(__file__).resolve().parents[2]


def test_every_adapter_was_verified_with_the_installed_version():
    from gcc.compat import composer, diffsynth, loggers, streaming, torch

    assert installed("mosaicml") == composer.VERIFIED
    assert installed("mosaicml-streaming") == streaming.VERIFIED
    assert installed("torch").split("+")[0] == torch.VERIFIED
    assert installed("diffsynth") == diffsynth.VERIFIED
    for dist, version in loggers.VERIFIED.items():
        assert installed(dist) in (None, version), dist  # optional: absent, or the verified one


def test_another_version_stops_with_exit_code_2_naming_the_adapter(monkeypatch, capsys):
    monkeypatch.delenv(OVERRIDE, raising=False)
    with pytest.raises(UnverifiedLibrary) as e:
        require("torch", "0.0.1", "gcc/compat/torch.py")
    assert e.value.code == 2
    msg = str(e.value)
    assert "torch" in msg and "0.0.1" in msg and "gcc/compat/torch.py" in msg and OVERRIDE in msg
    assert "error:" in capsys.readouterr().err
    with pytest.raises(UnverifiedLibrary, match="not installed"):
        require("no-such-dist-gcc", "1.0", "gcc/compat/x.py")


@pytest.mark.parametrize("value", ["torch", "numpy, torch", "all"])
def test_the_override_runs_it_with_one_warning(monkeypatch, caplog, value):
    monkeypatch.setenv(OVERRIDE, value)
    monkeypatch.setattr(compat, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="gcc.compat"):
        require("torch", "0.0.1", "gcc/compat/torch.py")
        require("torch", "0.0.1", "gcc/compat/torch.py")
    warnings = [r for r in caplog.records if "re-verify" in r.getMessage()]
    assert len(warnings) == 1 and OVERRIDE in warnings[0].getMessage()


def test_the_override_names_only_what_it_names(monkeypatch):
    monkeypatch.setenv(OVERRIDE, "numpy")
    with pytest.raises(UnverifiedLibrary):
        require("torch", "0.0.1", "gcc/compat/torch.py")


def test_a_process_that_meets_it_ends_with_the_message_and_no_traceback():
    code = "from gcc.compat import require; require('torch', '0.0.1', 'gcc/compat/torch.py')"
    env = {k: v for k, v in os.environ.items() if k != OVERRIDE}
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "error: torch" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_the_entry_script_run_by_path_leaves_only_gcc_importable():
    """`composer -n 8 gcc/train.py ...` runs the file by path, which puts gcc/ first on sys.path: `data`, `model`,
    `tools` and `training` would be importable top-level names in every rank. The entry swaps that folder for the
    one that holds `gcc`, so `gcc` is this checkout's."""
    code = (
        "import importlib.util, runpy, sys\n"
        f"sys.path[0] = {str(ROOT / 'gcc')!r}\n"  # what Python does for a script run by path
        f"runpy.run_path({str(ROOT / 'gcc' / 'train.py')!r}, run_name='gcc_entry')\n"
        "print([n for n in ('data', 'model', 'tools', 'training', 'synth') if importlib.util.find_spec(n)])\n"
        "print(sys.path[0], importlib.util.find_spec('gcc').origin)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd="/", capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    others, where = r.stdout.splitlines()[-2:]
    assert others == "[]", r.stdout
    assert where == f"{ROOT} {ROOT / 'gcc' / '__init__.py'}", r.stdout
