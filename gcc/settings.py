"""The building blocks of a typed config section, for every component that declares one: a field's role
(`setting`, `role`, `Role`: identity, export, range, path, units, its one-line doc), a number's range (`Range`) and
the error a bad value raises (`ConfigError`, exit code 2). A component declares its section with these without
importing gcc/training/config.py, which loads and checks the whole config (docs/design.md §12)."""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from gcc import exit_codes
from gcc.inputs import shown


class ConfigError(ValueError):
    exit_code = exit_codes.CONFIG


DAY_S = 86400.0
STEPS = 10**9


def num_text(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


@dataclass(frozen=True)
class Range:
    """The values a number may take: `low` to `high` (None: no upper bound), `exclusive`: above `low`, never at it
    (a duration that must not be 0). `unit` as a message says it; `said`: how a message states the range where
    "must be >= low and at most high" would not (a fraction: "in [0, 1]")."""

    low: float
    high: float | None = None
    unit: str = ""
    exclusive: bool = False
    said: str = ""

    def problem(self, value: float) -> str | None:
        """Why `value` is outside the range (None when inside)."""
        low_ok = self.low < value if self.exclusive else self.low <= value
        if low_ok and (self.high is None or value <= self.high):
            return None
        if self.said:
            return f"must be {self.said}, got {value}"
        lowest = f"> {num_text(self.low)}" if self.exclusive else f">= {num_text(self.low)}"
        if self.high is None:
            return f"must be {lowest}{self.unit}, got {value}"
        if not low_ok:
            return f"must be {lowest}{self.unit} and at most {num_text(self.high)}{self.unit}, got {value}"
        return f"must be at most {num_text(self.high)}{self.unit} (and {lowest}), got {value}"


FRACTION = Range(0.0, 1.0, said="in [0, 1]")  # a probability or a share
NON_NEGATIVE = Range(0.0)
WORKERS = Range(0, 1 << 16)  # a rank or a count of ranks


@dataclass(frozen=True)
class Role:
    """What a config field is for, declared next to it with `setting` (`role` for a field with a default factory)
    and read by validate, run_start.run_signature, builders.export_metadata and `describe` (`train.py --print_config`).

    identity: True when its value is part of the run signature under its own dotted key (docs/design.md §9.3: a
    relaunch that changes it is refused, exit 3); a signature key (str): signed under that key, which is the key
    runs recorded before the field was renamed (`optimizer.lr` is signed as `optim.lr`), or, for a path, the key
    under which run_start.run_signature records what identifies the thing it names (a digest, a resolved path)
    rather than its value; False when it may change on resume. sign_default: False for an identity field added
    after runs were recorded: its default (the behaviour those runs had) stays out of the signature, so their
    run.json still matches, and any other value is signed.
    exported: True when its value goes into every export's metadata (docs/design.md §9.9) under its own name; a
    metadata key (str): under that key; False: not exported. A path goes in with credentials masked.
    bounds: the range of a number (None: any value of its type). path: a local path or s3:// URL, refused with
    credentials in it (gcc.storage.userinfo_problem). units: a Composer time (an int counts batches, "500ba" is
    the same; "3ep" is allowed where "ep" is among the units and kept as given until the launch resolves it).
    doc: its meaning in one line (`describe`)."""

    identity: bool | str
    exported: bool | str
    bounds: Range | None = None
    path: bool = False
    sign_default: bool = True
    units: tuple[str, ...] = ()
    doc: str = ""


ROLE = "gcc.role"  # the key of a field's Role in its dataclass field metadata


def role(
    *,
    identity: bool | str,
    exported: bool | str,
    bounds: Range | None = None,
    path: bool = False,
    sign_default: bool = True,
    units: tuple[str, ...] = (),
    doc: str = "",
) -> dict:
    """A config field's metadata holding its Role, for a field with a default factory:
    `x: list = field(default_factory=list, metadata=role(identity=..., exported=...))`."""
    return {ROLE: Role(identity, exported, bounds, path, sign_default, units, doc)}


def setting(default: Any, **declared: Any) -> Any:
    """A config field with its default and its role (`Role`): `x: int = setting(0, identity=..., exported=...)`."""
    return field(default=default, metadata=role(**declared))


BATCHES = ("ba",)  # a Composer time counted in batches: 500 or "500ba"


# ---- a section built from a yaml's mapping ------------------------------------------------------------------
def section_of(typ: Any) -> type | None:
    """The section (dataclass) a field of type `typ` holds: `Section`, or `Section | None` (an optional section,
    off while null: algorithms.ema); None for a value."""
    if typing.get_origin(typ) in (typing.Union, types.UnionType):
        typ = next((t for t in typing.get_args(typ) if t is not type(None)), None)
    return typ if isinstance(typ, type) and dataclasses.is_dataclass(typ) else None


def config_fields(cls: type, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field, Any]]:
    """(dotted key, field, type) of every field of `cls` that holds a value, sections walked, in declaration order."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        section = section_of(hints[f.name])
        if section is not None:
            yield from config_fields(section, f"{prefix}{f.name}.")
        else:
            yield prefix + f.name, f, hints[f.name]


def roles(cls: type) -> dict[str, Role]:
    """The Role of every field of `cls` by dotted key (`data.mask_p`); a TypeError naming a field that declares
    none (each field says what it is for: `setting`)."""
    found = {}
    for key, f, _ in config_fields(cls):
        if ROLE not in f.metadata:
            raise TypeError(f"config field {key}: declares no role (declare it with setting(...) or role(...))")
        found[key] = f.metadata[ROLE]
    return found


def checked_value(key: str, value: Any, typ: Any) -> Any:
    if typing.get_origin(typ) in (typing.Union, types.UnionType):  # `X | None`: null, or an X
        if value is None:
            return None
        (typ,) = [t for t in typing.get_args(typ) if t is not type(None)]
        try:
            return checked_value(key, value, typ)
        except ConfigError:
            raise ConfigError(f"{key}: expected {typ.__name__} or null, got {type(value).__name__} {value!r}") from None
    if typing.get_origin(typ) is Literal:  # of its values' type here; which values, validate (CHOICES)
        typ = type(typing.get_args(typ)[0])
    if typ is float:
        number = as_float(value)
        if number is not None:
            if not math.isfinite(number):  # nan and inf pass every range check below: refused here
                raise ConfigError(f"{key}: expected a finite number, got {value!r}")
            return number
    base = typing.get_origin(typ) or typ
    if (base is dict and isinstance(value, dict)) or (base is list and isinstance(value, list)):
        return value
    if isinstance(base, type) and isinstance(value, base) and not (base is int and isinstance(value, bool)):
        return value
    raise ConfigError(f"{key}: expected {getattr(typ, '__name__', typ)}, got {type(value).__name__} {value!r}")


def as_float(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:  # an int too large for a float
            return math.inf
    if isinstance(value, str):  # yaml reads "1e-5" as a string
        try:
            return float(value)
        except ValueError:
            return None
    return None


def build_section(cls, data: dict, prefix: str = "", hint: Callable[[str], str] = lambda key: ""):
    """An instance of the config dataclass `cls` from the mapping `data` (a yaml's), each value checked against its
    field's type (a Composer time by its units), sections built in turn; a ConfigError naming the dotted key
    otherwise (`hint`: what an unknown key might have meant)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or '(root)'}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"unknown key(s): {', '.join(prefix + k + hint(prefix + k) for k in unknown)}")
    kwargs = {}
    for k, v in data.items():
        typ, section = hints[k], section_of(hints[k])
        if section is not None:
            optional = section is not typ
            kwargs[k] = None if optional and v is None else build_section(section, v, f"{prefix}{k}.", hint)
        elif fields[k].metadata[ROLE].units:
            kwargs[k] = composer_time(prefix + k, v, fields[k].metadata[ROLE].units)
        else:
            kwargs[k] = checked_value(prefix + k, v, typ)
    return cls(**kwargs)


_TIME = re.compile(r"([0-9]{1,18})\s*([a-z]+)")  # 18 digits: beyond any bound, short of Python's int limit
COMPOSER_UNITS = ("ba", "ep", "sp", "tok", "dur", "sec", "iter")  # what a Composer time string may end with


def composer_time(key: str, value: Any, units: tuple[str, ...]) -> int | str:
    """A Composer time as gcc keeps it: batches as an int (500 and "500ba" alike), epochs as "Nep" (resolved at
    launch: `resolve_duration`). A ConfigError naming the key for anything else, or a unit that cannot hold here."""
    wanted = 'a whole number of batches (500 or "500ba")' + (' or of epochs ("3ep")' if "ep" in units else "")
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    match = _TIME.fullmatch(value.strip().lower()) if isinstance(value, str) else None
    if match is None:
        raise ConfigError(f"{key}: expected {wanted}, got {shown(repr(value))}")
    count, unit = int(match[1]), match[2]
    if unit not in units:
        why = "a Composer unit gcc does not count in here" if unit in COMPOSER_UNITS else "not a Composer unit"
        raise ConfigError(
            f"{key}: the unit {unit!r} of {shown(repr(value))} cannot be used here ({why}); expected {wanted}"
        )
    return count if unit == "ba" else f"{count}{unit}"


def time_count(value: int | str) -> int:
    """The number of a kept time: its batches, or its epochs ("3ep" -> 3)."""
    return value if isinstance(value, int) else int(value[: -len("ep")])
