"""Per-turn PDS read time, measured where the reads happen (``RepoView``, ``SideRecords``,
blob fetches) and attributed to the turn that runs them through a context variable.

Several reads of one turn may overlap (its conversation and settings records are read
together); :class:`ReadClock` counts the wall time during which at least one of them was
outstanding, so ``read`` never exceeds the turn's real time and ``bridge`` (= total −
model − write − read) stays our own work. Reads outside a turn (intake, recovery) are
not counted anywhere.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token


class ReadClock:
    """Milliseconds during which at least one read was in flight."""

    __slots__ = ("ms", "reads", "_open", "_since", "_clock")

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.ms = 0.0
        self.reads = 0
        self._open = 0
        self._since = 0.0
        self._clock = clock

    def begin(self) -> None:
        if self._open == 0:
            self._since = self._clock()
        self._open += 1
        self.reads += 1

    def end(self) -> None:
        self._open -= 1
        if self._open == 0:
            self.ms += (self._clock() - self._since) * 1000


_current: ContextVar[ReadClock | None] = ContextVar("gelbridge_turn_reads", default=None)


def start_reads(clock: ReadClock) -> Token[ReadClock | None]:
    """Attribute the reads of this task (and the tasks it creates) to ``clock``."""
    return _current.set(clock)


def stop_reads(token: Token[ReadClock | None]) -> None:
    _current.reset(token)


@contextmanager
def reading() -> Iterator[None]:
    """Wrap one PDS read; counted for the turn running it, if any."""
    clock = _current.get()
    if clock is None:
        yield
        return
    clock.begin()
    try:
        yield
    finally:
        clock.end()
