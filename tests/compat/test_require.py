"""gcc/compat/__init__.py: each adapter checks the installed version of its library when it is imported, against
the table `VERSIONS`: the verified version runs silently, another inside the allowed range with one warning, one
outside it stops the process with a message (exit 2) unless the override names it."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from gcc import compat
from gcc.compat import OVERRIDE, VERSIONS, UnverifiedLibrary, installed, require

ROOT = Path(__file__).resolve().parents[2]


def test_the_installed_libraries_are_the_verified_versions():
    for dist in ("torch", "mosaicml", "mosaicml-streaming", "diffsynth"):
        assert Version(installed(dist)).public == VERSIONS[dist].version, dist
    for dist in ("wandb", "mlflow-skinny"):
        assert installed(dist) in (None, VERSIONS[dist].version), dist  # optional: absent, or the verified one


def _deps() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = [d for deps in project["optional-dependencies"].values() for d in deps]
    return [Requirement(d) for d in project["dependencies"] + extras]


def test_pyproject_declares_the_tables_ranges_and_constraints_pins_the_verified_versions():
    declared = {r.name: r.specifier for r in _deps() if r.name in VERSIONS}
    assert declared == {dist: SpecifierSet(v.allowed) for dist, v in VERSIONS.items()}
    pins = dict(line.split("==") for line in (ROOT / "constraints.txt").read_text().split() if "==" in line)
    assert {dist: pins[dist] for dist in VERSIONS} == {dist: v.version for dist, v in VERSIONS.items()}
    for v in VERSIONS.values():
        assert v.version in SpecifierSet(v.allowed)


def _installed_as(monkeypatch, dist: str, version: str | None) -> None:
    """The version lookup answers `version` for `dist` (the package itself is untouched)."""
    real = compat.installed
    monkeypatch.setattr(compat, "installed", lambda d: version if d == dist else real(d))
    monkeypatch.setattr(compat, "_warned", set())
    monkeypatch.delenv(OVERRIDE, raising=False)


@pytest.mark.parametrize("have", ["0.32.1", "0.32.1+local"])
def test_the_verified_version_runs_silently(monkeypatch, caplog, have):
    _installed_as(monkeypatch, "mosaicml", have)
    with caplog.at_level(logging.WARNING, logger="gcc.compat"):
        require("mosaicml", "gcc/compat/composer.py")
    assert caplog.records == []


def test_a_patch_release_runs_with_one_warning_naming_the_verified_version(monkeypatch, caplog):
    _installed_as(monkeypatch, "mosaicml", "0.32.2")
    with caplog.at_level(logging.WARNING, logger="gcc.compat"):
        require("mosaicml", "gcc/compat/composer.py")
        require("mosaicml", "gcc/compat/composer_launcher.py")
    assert [r.getMessage() for r in caplog.records] == [
        "mosaicml 0.32.2 is installed; gcc/compat/composer.py was verified with mosaicml 0.32.1; running (inside "
        "the allowed range >=0.32.1,<0.33): the contract tests in tests/compat/ decide whether it holds"
    ]


@pytest.mark.parametrize("have", ["0.33.0", "1.0.0", "0.32.0", "0.32.2rc1"])
def test_a_version_outside_the_range_stops_with_exit_code_2_naming_it(monkeypatch, capsys, have):
    _installed_as(monkeypatch, "mosaicml", have)
    with pytest.raises(UnverifiedLibrary) as e:
        require("mosaicml", "gcc/compat/composer.py")
    assert e.value.code == 2
    msg = str(e.value)
    assert msg.startswith(
        f"mosaicml {have} is installed; gcc/compat/composer.py was verified with mosaicml 0.32.1, outside the "
        "range gcc allows (>=0.32.1,<0.33). Install mosaicml==0.32.1 (constraints.txt)"
    )
    assert OVERRIDE in msg and "tests/compat/" in msg
    assert "error:" in capsys.readouterr().err


def test_a_library_not_installed_stops(monkeypatch):
    _installed_as(monkeypatch, "torch", None)
    with pytest.raises(UnverifiedLibrary, match="torch is not installed; gcc/compat/torch.py needs torch >=2.7.0"):
        require("torch", "gcc/compat/torch.py")


@pytest.mark.parametrize("value", ["torch", "numpy, torch", "all"])
def test_the_override_runs_it_with_one_warning(monkeypatch, caplog, value):
    _installed_as(monkeypatch, "torch", "3.0.0")
    monkeypatch.setenv(OVERRIDE, value)
    with caplog.at_level(logging.WARNING, logger="gcc.compat"):
        require("torch", "gcc/compat/torch.py")
        require("torch", "gcc/compat/torch.py")
    assert len(caplog.records) == 1 and f"{OVERRIDE}={value}" in caplog.records[0].getMessage()


def test_the_override_names_only_what_it_names(monkeypatch):
    _installed_as(monkeypatch, "torch", "3.0.0")
    monkeypatch.setenv(OVERRIDE, "numpy")
    with pytest.raises(UnverifiedLibrary):
        require("torch", "gcc/compat/torch.py")


def test_a_process_that_meets_it_ends_with_the_message_and_no_traceback():
    code = (
        "from gcc import compat; compat.installed = lambda dist: '0.0.1'; "
        "compat.require('torch', 'gcc/compat/torch.py')"
    )
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
