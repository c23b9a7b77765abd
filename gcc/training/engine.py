"""Composer's event engine without the per-callback cost of events a callback does not handle.

Composer 0.32.1 runs ~32 events a step at accumulation 4 (six per micro-batch). For each event its Engine checks
the event's kind against lists of events, filters the algorithms and the callbacks twice (loggers last), and for
every callback (about 17 here) enters a context, formats a debug line with the step's timestamp (built even when
`ENGINE_DEBUG` is unset, the only case it is printed) and calls the callback's method, a no-op for most. That is
~550 callback visits a step for ~40 that do something: several milliseconds a step, over 5 % of a small step
(`bench/trainer_overhead.py`, docs/performance.md).

LeanEngine calls, for each event, only the callbacks whose class or instance overrides that event's method or
`run_event` (Callback's own methods are all no-ops), in Composer's order: the other callbacks, then the loggers.
The list is built once per event and rebuilt when the trainer's callback list changes. Composer's assertions that
the trainer set a dataloader and a duration are left out (gcc's builder sets both). INIT, algorithms, the profiler
and `ENGINE_DEBUG` take Composer's own path, unchanged.
"""

from __future__ import annotations

import os
from collections import OrderedDict

from composer.core import Callback, Engine, Event
from composer.loggers import LoggerDestination


def handles(cb: Callback, event: Event) -> bool:
    """Whether running `event` on `cb` can do anything."""
    if getattr(cb.run_event, "__func__", None) is not Callback.run_event:
        return True
    return getattr(getattr(cb, event.value), "__func__", None) is not getattr(Callback, event.value)


class LeanEngine(Engine):
    """Composer's Engine; `use_lean_engine` switches a built Trainer's engine to it."""

    def run_event(self, event: Event | str):
        event = Event(event)
        state = self.state
        if (
            event == Event.INIT
            or self._is_closed
            or state.profiler is not None
            or state.algorithms
            or os.environ.get("ENGINE_DEBUG")
        ):
            return super().run_event(event)
        for cb in self._handlers(event):
            cb.run_event(event, state, self.logger)
        return OrderedDict()  # Composer's traces: one per algorithm run, and there are none

    def _handlers(self, event: Event) -> tuple:
        callbacks = self.state.callbacks
        cache = self.__dict__.get("_lean_handlers")
        if cache is None or cache[0] != callbacks:  # list equality: same callbacks, same order
            cache = self.__dict__["_lean_handlers"] = (list(callbacks), {})
        if event not in cache[1]:
            ordered = [cb for cb in callbacks if not isinstance(cb, LoggerDestination)] + [
                cb for cb in callbacks if isinstance(cb, LoggerDestination)
            ]
            cache[1][event] = tuple(cb for cb in ordered if handles(cb, event))
        return cache[1][event]


def use_lean_engine(trainer) -> None:
    """Composer builds its Engine inside Trainer.__init__ (and runs INIT there), so the built engine's class is
    switched: LeanEngine adds no state of its own beyond a cache, and overrides only `run_event`."""
    trainer.engine.__class__ = LeanEngine
