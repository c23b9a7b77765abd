"""gcc's contracts with the insides of its libraries, in one place (docs/design.md, "Library contracts").

Every use of a library's private API or undocumented behaviour lives in this package, behind a named function or
class, with a comment saying what it relies on: `composer.py`, `composer_launcher.py`, `streaming.py`, `torch.py`,
`torch_preload.py`, `diffsynth.py`, `loggers.py` (W&B, MLflow), `python.py`. Each module was verified against one
version of its library and checks the installed one when it is imported (`require`, against the table `VERSIONS`):
that version runs silently, another inside the allowed range (a patch release) with one warning, one outside the
range stops the process (exit 2). tests/compat/ holds a contract test per module, which fails when the library's
behaviour changes.

Moving to a version outside the range: run `make test` against it with `GCC_UNVERIFIED_LIBS=<dist name>` (or
`all`), fix what tests/compat/ reports, then set the new version and range in `VERSIONS` and pyproject.toml. The
override is meant for that check: a run under it logs a warning naming each library outside its range.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import os
import sys
import types
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from gcc import exit_codes

OVERRIDE = "GCC_UNVERIFIED_LIBS"
logger = logging.getLogger(__name__)
_warned: set[str] = set()


class UnverifiedLibrary(SystemExit):
    """A library whose installed version is outside the range gcc's adapter for it allows. It is raised
    while gcc's modules are imported, before any entry point can catch it, so it ends the process the way a bad
    config does: the message on stderr, exit code 2, no traceback."""

    def __init__(self, message: str):
        super().__init__(exit_codes.CONFIG)
        self.message = message

    def __str__(self) -> str:
        return self.message


def installed(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


class Verified(NamedTuple):
    version: str  # the version the adapter's contract tests (tests/compat/) passed with: constraints.txt pins it
    allowed: str  # the range gcc runs with (pyproject.toml declares it): inside it, another version warns


# The one table of library versions. tests/compat/test_require.py checks that pyproject.toml's dependencies declare
# these ranges and constraints.txt pins these versions. A new patch release (inside the range) runs with a warning:
# the contract tests decide whether it holds. Outside the range the adapter refuses to load.
VERSIONS: dict[str, Verified] = {
    "torch": Verified("2.7.0", ">=2.7.0,<2.8"),
    "mosaicml": Verified("0.32.1", ">=0.32.1,<0.33"),  # Composer
    "mosaicml-streaming": Verified("0.13.0", ">=0.13.0,<0.14"),
    "diffsynth": Verified("2.1.12", ">=2.1.12,<2.2"),
    "wandb": Verified("0.31.0", ">=0.31.0,<0.32"),  # the `loggers` extra
    "mlflow-skinny": Verified("3.18.0", ">=3.18.0,<3.19"),  # the `loggers` extra
}


def require(dist: str, adapter: str) -> None:
    """Check the installed `dist` against its row of `VERSIONS` before `adapter` (a module of this package) imports
    it: the verified version passes silently; another version inside the allowed range passes with one warning;
    outside the range (or not installed) the process stops (exit 2), unless `GCC_UNVERIFIED_LIBS` names `dist` (a
    comma-separated list of distribution names, or `all`): then one warning."""
    verified, allowed = VERSIONS[dist]
    have = installed(dist)
    if have is not None and Version(have).public == verified:  # torch's local label (+cu126, +cpu) aside
        return
    inside = have is not None and Version(have) in SpecifierSet(allowed)
    what = (
        f"{dist} {have} is installed; {adapter} was verified with {dist} {verified}"
        if have
        else f"{dist} is not installed; {adapter} needs {dist} {allowed}"
    )
    overridden = {s.strip() for s in os.environ.get(OVERRIDE, "").split(",") if s.strip()} & {dist, "all"}
    if inside or overridden:
        if dist not in _warned:
            _warned.add(dist)
            why = f"inside the allowed range {allowed}" if inside else f"{OVERRIDE}={os.environ[OVERRIDE]}"
            logger.warning(f"{what}; running ({why}): the contract tests in tests/compat/ decide whether it holds")
        return
    fix = f"Install {dist}=={verified} (constraints.txt)"
    if have:
        what += f", outside the range gcc allows ({allowed})"
        fix += (
            f", or re-verify the adapter against {have}: run `make test` with {OVERRIDE}={dist}, fix what the "
            "contract tests in tests/compat/ report, then widen the range in gcc/compat/__init__.py VERSIONS and "
            "pyproject.toml"
        )
    stop(f"{what}. {fix}")


def stop(message: str) -> None:
    """End the import (and so the process, exit code 2) with `message` on stderr."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    raise UnverifiedLibrary(message)


class Unavailable:
    """What a stand-in module (`stand_ins`) gives for any name: a placeholder that refuses to be used."""

    def __init__(self, *args, **kwargs):
        raise ImportError("not loaded in this process: a part of a library that gcc never uses (gcc/compat)")


class _StandIn(types.ModuleType):
    def __init__(self, name: str):
        super().__init__(name, "a stand-in: gcc/compat")
        self.__path__: list[str] = []  # a package: `import <stand-in>.<sub>` finds nothing

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return Unavailable


@contextlib.contextmanager
def stand_ins(names: Iterable[str], absent: Iterable[str] = ()) -> Iterator[None]:
    """While a library loads, each module of `names` (a part of the library, or of a dependency, that gcc never uses
    and that the library's package imports anyway) is an empty stand-in, so it costs nothing: `import x` and `from
    x import Name` succeed and give placeholders (`Unavailable`) that raise when used. Each module of `absent` is
    missing instead (its import raises ModuleNotFoundError: for a library that imports it only if installed). A
    module already loaded is left as it is. Afterwards the names are free again: a later import of one loads the
    real module."""
    placed: dict[str, types.ModuleType | None] = {n: _StandIn(n) for n in names if n not in sys.modules}
    placed.update({n: None for n in absent if n not in sys.modules})
    sys.modules.update(placed)  # type: ignore[arg-type]  # typeshed allows modules only; a None entry makes the import raise
    try:
        yield
    finally:
        for name, module in placed.items():
            if name in sys.modules and sys.modules[name] is module:
                del sys.modules[name]


# every process that loads a library adapter may start multiprocessing's helpers (Streaming's shared memory starts the
# resource tracker; gcc/workers.py the forkserver): they import nothing from the working directory (gcc/compat/python.py)
# CPython is not a distribution (no override; pyproject.toml pins it too): python.py is verified with one version
if sys.version_info[:2] != (3, 11):  # = python.VERIFIED, which cannot be imported before this check
    stop(f"gcc/compat/python.py was verified with Python 3.11, this is {sys.version.split()[0]}")
from gcc.compat import python as _python  # noqa: F401
