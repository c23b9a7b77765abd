"""Helpers of the bounded-read tests (tests/test_inputs.py, tests/data/test_trust_data.py): a call that must end
quickly (or be refused quickly), and the most memory Python allocated while a call ran."""

from __future__ import annotations

import threading
import tracemalloc
from collections.abc import Callable


def quickly(call: Callable, within_s: float = 20.0) -> dict:
    """{"value": what `call()` returned} or {"error": what it raised}, within `within_s`. It runs in a thread, so
    that a regression (a read that waits on a FIFO for ever) fails the test instead of hanging the session."""
    result: dict = {}

    def target():
        try:
            result["value"] = call()
        except BaseException as e:  # whatever it raised is what the test looks at
            result["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(within_s)
    assert not t.is_alive(), f"still reading after {within_s} s (a read that blocks)"
    return result


def refused_quickly(call: Callable, error: type[BaseException], *match: str, within_s: float = 20.0) -> BaseException:
    """`call()` raises `error` whose message holds every `match`, within `within_s` (see `quickly`)."""
    e = quickly(call, within_s).get("error")
    assert isinstance(e, error), f"expected {error.__name__}, got {e!r}"
    for m in match:
        assert m in str(e), str(e)
    return e


def peak_allocated(call: Callable) -> tuple[int, BaseException | None]:
    """(the most bytes Python's allocators held at once while `call()` ran, beyond what they held before; the
    exception it raised, or None). Bytes objects that C code creates (a decompressor's output) count too."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        try:
            call()
            error = None
        except Exception as e:  # returned to the test
            error = e
        return tracemalloc.get_traced_memory()[1] - base, error
    finally:
        tracemalloc.stop()
