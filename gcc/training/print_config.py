"""`train.py --print_config`: every config key with its default, type and meaning, from the declarations (the
fields' `setting`s), and the old key names still read."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any, Literal

from gcc.redact import redact
from gcc.settings import ROLE, Role, config_fields
from gcc.training.config import RENAMED, TrainConfig, default_of


def _type_name(typ: Any, role: Role) -> str:
    """How `describe` states a field's type: its choices, a time's units, `X | null`."""
    if role.units:
        return " | ".join({"ba": 'batches (N or "Nba")', "ep": 'epochs ("Nep")'}[u] for u in role.units)
    if typing.get_origin(typ) is Literal:
        return " | ".join(str(a) for a in typing.get_args(typ))
    if typing.get_origin(typ) in (typing.Union, types.UnionType):
        return " | ".join("null" if t is type(None) else t.__name__ for t in typing.get_args(typ))
    return getattr(typ, "__name__", str(typ))


TEST_ONLY = "faults."  # the keys of gcc's own tests (fault injection): never a real run's


def describe(cfg: TrainConfig | None = None, test_only: bool = False) -> list[str]:
    """`train.py --print_config`: every key (dotted) with its default and type, then its meaning, from the
    declarations; with `cfg` (a yaml and overrides, resolved), the key's value first, credentials masked. Then the
    old key names (RENAMED). The test-only `faults.*` keys only with `test_only` (`--print_config --all`)."""
    values = redact(dataclasses.asdict(cfg)) if cfg is not None else None
    lines = []
    for key, f, typ in config_fields(TrainConfig):
        role = f.metadata[ROLE]
        if key.startswith(TEST_ONLY) and not test_only:
            continue
        default = json.dumps(default_of(f))
        head = f"{key}: {default}"
        if values is not None:
            value = values
            for p in key.split("."):
                value = value[p] if value is not None else None  # None: an optional section that is off
            head = f"{key}: {json.dumps(value)}  (default {default})"
        lines += [f"{head}  [{_type_name(typ, role)}]", f"    {role.doc}"]
    lines.append("")
    if not test_only:
        lines.append(f"({TEST_ONLY}*: fault injection for gcc's own tests, not shown; --print_config --all shows them)")
    lines.append("old key names, still read as the new ones (with a warning):")
    lines += [f"  {old} -> {new}" for old, new in RENAMED.items()]
    return lines
