"""What a config field declares (gcc/settings.py): a number's range and its message, case by case; a field's role
in its dataclass metadata, where validate, the signature, the export metadata and --print_config read it."""

from __future__ import annotations

import dataclasses

import pytest

from gcc.settings import FRACTION, ROLE, Range, Role, setting


@pytest.mark.parametrize(
    "bounds, value, said",
    [
        (Range(1, 100), 1, None),
        (Range(1, 100), 100, None),
        (Range(1, 100), 0, "must be >= 1 and at most 100, got 0"),
        (Range(1, 100), 101, "must be at most 100 (and >= 1), got 101"),
        (Range(0, 10.0, unit=" seconds", exclusive=True), 1e-9, None),
        (Range(0, 10.0, unit=" seconds", exclusive=True), 0, "must be > 0 seconds and at most 10 seconds, got 0"),
        (Range(0, 10.0, unit=" seconds", exclusive=True), 10.5, "must be at most 10 seconds (and > 0), got 10.5"),
        (Range(0.0), 1e30, None),
        (Range(0.0), -1, "must be >= 0, got -1"),
        (Range(0.0, unit=" s", exclusive=True), 0.0, "must be > 0 s, got 0.0"),
        (Range(0.0, 1.0, said="in [0, 1]"), 1.0, None),
        (Range(0.0, 1.0, said="in [0, 1]"), 1.5, "must be in [0, 1], got 1.5"),
        (Range(0.0, 1.0, said="in [0, 1]"), -0.5, "must be in [0, 1], got -0.5"),
        (Range(0, 2.5e6), 3e6, "must be at most 2.5e+06 (and >= 0), got 3000000.0"),
        (Range(0.0), 0.0, None),
        (Range(0.0), -0.5, "must be >= 0, got -0.5"),
        (Range(1, 8, unit=" ranks"), 9, "must be at most 8 ranks (and >= 1), got 9"),
        (Range(1, 8, unit=" ranks"), 0, "must be >= 1 ranks and at most 8 ranks, got 0"),
        (Range(1, 8), 8, None),
        (Range(0.0, exclusive=True), 0.0, "must be > 0, got 0.0"),
        (Range(0.0, exclusive=True), 1e-9, None),
        (Range(0.5, 2.5), 3, "must be at most 2.5 (and >= 0.5), got 3"),
        (FRACTION, -0.0, None),
    ],
)
def test_a_range_says_why_a_value_is_outside_it(bounds, value, said):
    assert bounds.problem(value) == said


def test_a_setting_carries_its_default_and_its_role():
    @dataclasses.dataclass
    class Section:
        rate: float = setting(0.1, identity="old.rate", exported=False, bounds=FRACTION, doc="a rate")

    (f,) = dataclasses.fields(Section)
    assert Section().rate == 0.1
    assert f.metadata[ROLE] == Role("old.rate", False, FRACTION, doc="a rate")
