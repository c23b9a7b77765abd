"""The yaml's options of a Composer class (a logger of `loggers:`, a callback of `callbacks:`): each one an argument
of the class's `__init__`, of its type and in its range, checked before any work (docs/training.md "Loggers",
"Callbacks"). One function, `option_problems`, serves both sections: a problem names its key
(`callbacks.speed_monitor.window_size: ...`) and what was expected.
"""

from __future__ import annotations

import inspect
import math
import types
import typing
from collections.abc import Collection, Mapping
from typing import Any

from gcc.inputs import shown


def arguments(cls: type, reserved: Collection[str] = ()) -> dict[str, Any]:
    """A class's keyword arguments and their types, but those gcc sets itself (`reserved`)."""
    hints = typing.get_type_hints(cls.__init__)  # type: ignore[misc]  # the class's own __init__
    return {p: hints.get(p, Any) for p in inspect.signature(cls).parameters if p not in reserved}


def fits(value: Any, hint: Any) -> Any:
    """`value` as an argument of type `hint` (a number written "1e15" read as a number), or TypeError; a float is
    finite (nan and inf pass every range check)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(hint):
            try:
                return fits(value, option)
            except TypeError:
                pass
    elif hint is type(None):
        if value is None:
            return None
    elif hint in (int, float):
        if isinstance(value, str) and hint is float:  # yaml reads 1e15 (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and (hint is float or isinstance(value, int))
            and math.isfinite(value)
        ):
            return value
    elif origin is dict:
        key_type, value_type = typing.get_args(hint)
        if isinstance(value, dict):
            return {fits(k, key_type): fits(v, value_type) for k, v in value.items()}
    elif origin is list:
        (item_type,) = typing.get_args(hint)
        if isinstance(value, list):
            return [fits(v, item_type) for v in value]
    elif hint is Any or (isinstance(hint, type) and isinstance(value, hint)):
        return value
    raise TypeError(f"expected {named(hint)}, got {shown(repr(value))}")


def named(hint: Any) -> str:
    """A type as a message says it: "a finite number or None", "dict[str, str]"."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        return " or ".join(named(o) for o in options if not (o is int and float in options))  # a number covers int
    if typing.get_origin(hint) in (dict, list):
        return f"{typing.get_origin(hint).__name__}[{', '.join(named(t) for t in typing.get_args(hint))}]"
    if hint is float:
        return "a finite number"
    return "None" if hint is type(None) else getattr(hint, "__name__", str(hint))


def option_problems(
    section: str, kind: str, table: Mapping[str, Any], name: str, options: Any, reserved: Collection[str] = ()
) -> tuple[list[str], dict[str, Any]]:
    """The problems of one entry `name` (a `kind`: "logger") of the yaml's `section` (each naming its key) and its arguments as the class
    takes them. `table` maps each name the section may hold to its entry: `.composer_class`, and optionally
    `.bounds` (argument -> `gcc.settings.Range`) where the class takes values that fail later, in the run."""
    key = f"{section}.{shown(name, 60)}"
    if name not in table:
        return [f"{key}: unknown {kind}; choose from {', '.join(table)}"], {}
    if options is not None and not isinstance(options, dict):
        return [f"{key}: expected a mapping of arguments (or {{}}), got {shown(repr(options))}"], {}
    composer_class = table[name].composer_class
    bounds = getattr(table[name], "bounds", {})
    takes = arguments(composer_class, reserved)
    problems, kwargs = [], {}
    for arg, value in (options or {}).items():
        if arg not in takes:
            problems.append(
                f"{key}.{shown(str(arg), 60)}: not an argument of Composer's {composer_class.__name__} "
                f"({', '.join(takes) or 'no arguments'})"
            )
            continue
        try:
            kwargs[arg] = fits(value, takes[arg])
        except TypeError as e:
            problems.append(f"{key}.{arg}: {e}")
            continue
        problem = bounds[arg].problem(kwargs[arg]) if arg in bounds and kwargs[arg] is not None else None
        if problem:
            problems.append(f"{key}.{arg}: {problem}")
    return problems, kwargs
