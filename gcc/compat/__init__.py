"""gcc's contracts with the insides of its libraries, in one place (docs/design.md, "Library contracts").

Every use of a library's private API or undocumented behaviour lives in this package, behind a named function or
class, with a comment saying what it relies on: `composer.py`, `composer_launcher.py`, `streaming.py`, `torch.py`,
`diffsynth.py`, `loggers.py` (W&B, MLflow), `python.py`. Each module was verified against one version of its library
(`VERIFIED`) and checks the installed one when it is imported (`require`); tests/compat/ holds a contract test per
module, which fails when the library's behaviour changes.

Moving to a new version of a library: run `make test` against it with `GCC_UNVERIFIED_LIBS=<dist name>` (or
`all`), fix what tests/compat/ reports, then set the new version in the module's `VERIFIED`. The override is
meant for that check: a run under it logs a warning naming each library outside its verified version.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import os
import sys
import types
from collections.abc import Iterable, Iterator

from gcc import exit_codes

OVERRIDE = "GCC_UNVERIFIED_LIBS"
logger = logging.getLogger(__name__)
_warned: set[str] = set()


class UnverifiedLibrary(SystemExit):
    """A library whose installed version is not the one gcc's adapter for it was verified against. It is raised
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


def require(dist: str, verified: str, adapter: str) -> None:
    """Stop unless `dist` is installed at the version `adapter` (a module of this package) was verified with, or
    `GCC_UNVERIFIED_LIBS` names it (a comma-separated list of distribution names, or `all`): then warn once."""
    have = installed(dist)
    if have == verified:
        return
    allowed = {s.strip() for s in os.environ.get(OVERRIDE, "").split(",") if s.strip()}
    what = (
        f"{dist} {have} is installed, but {adapter} was verified with {dist} {verified}"
        if have
        else f"{dist} is not installed; {adapter} needs {dist} {verified}"
    )
    if dist in allowed or "all" in allowed:
        if dist not in _warned:
            _warned.add(dist)
            logger.warning(f"{what}; running anyway ({OVERRIDE}={os.environ[OVERRIDE]}): re-verify the adapter")
        return
    fix = f"Install {dist}=={verified} (constraints.txt)"
    if have:
        fix += (
            f", or re-verify the adapter against {have}: run `make test` with {OVERRIDE}={dist}, fix what "
            "tests/compat/ reports, then set its VERIFIED version"
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
