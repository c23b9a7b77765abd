"""The building blocks of a typed config section, for every component that declares one: a field's role
(`setting`, `role`, `Role`: identity, export, range, path, units, its one-line doc), a number's range (`Range`) and
the error a bad value raises (`ConfigError`, exit code 2). A component declares its section with these without
importing gcc/training/config.py, which loads and checks the whole config (docs/design.md §12)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gcc import exit_codes


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
    and read by validate, launch.run_signature, builders.export_metadata and `describe` (`train.py --print_config`).

    identity: True when its value is part of the run signature under its own dotted key (docs/design.md §9.3: a
    relaunch that changes it is refused, exit 3); a signature key (str): signed under that key, which is the key
    runs recorded before the field was renamed (`optimizer.lr` is signed as `optim.lr`), or, for a path, the key
    under which launch.run_signature records what identifies the thing it names (a digest, a resolved path)
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
