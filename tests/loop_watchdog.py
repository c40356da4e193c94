"""A loop watchdog: how long did the event loop go without running a ready task?

::

    async with watchdog() as dog:
        await something_with_hostile_input()
    assert dog.max_gap < 0.05

A ticker task sleeps ``tick_s`` in a loop and records the longest time between two of its
wake-ups; anything that holds the loop (a parser on a huge string, a C call holding the
GIL in another thread) shows up as a gap. Works on both anyio backends.

Time the loop's thread spent runnable but waiting for a CPU (other processes had them: the
kernel's run-queue delay, ``/proc/thread-self/schedstat``) is not a stall of the loop, and
is taken out of each gap: ``max_gap`` is the longest gap less that delay, ``max_wall_gap``
the longest gap as the clock saw it. Without schedstat (not Linux) the two are the same.

The watchdog's own reading of schedstat is one ``pread`` on a file kept open, and is left
out of the gaps: every system call gives the GIL away, and while a worker thread holds it
(a parser the input under test keeps busy) getting it back takes up to the switch interval
(5 ms). The old harness opened, read and closed the file on every tick: three hand-overs,
up to 15 ms of its own added to each gap it measured.

The garbage collector is paused during the block: late in a long test session a full
collection of the whole heap takes 100+ ms, which is CPython's pause, not the input under
test's. It is not run before the block either: with the heap of a test session that
collection took 0.1-0.5 s, paid by every block (~80 of them in the serial tests), and a
paused collector cannot interrupt the block whatever garbage it finds.
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio
import anyio.lowlevel

__all__ = ["Watchdog", "watchdog"]


@dataclass
class Watchdog:
    tick_s: float
    max_gap: float = 0.0
    """The longest time between two ticks, less the time the loop waited for a CPU."""
    max_wall_gap: float = 0.0
    """The longest time between two ticks."""
    ticks: int = 0
    last: float = 0.0
    last_delay: float = 0.0

    schedstat: int = -1
    """An open descriptor of the loop thread's ``schedstat`` (-1: none)."""

    def start(self) -> None:
        self.last_delay = self.run_queue_delay()
        self.last = time.perf_counter()

    def tick(self) -> None:
        gap = time.perf_counter() - self.last
        delay = self.run_queue_delay()
        self.max_wall_gap = max(self.max_wall_gap, gap)
        self.max_gap = max(self.max_gap, gap - (delay - self.last_delay))
        self.last_delay = delay
        self.last = time.perf_counter()  # the read above (and the GIL's return) is ours

    def run_queue_delay(self) -> float:
        """Seconds the loop thread has spent runnable but not running (0.0 where unknown)."""
        if self.schedstat < 0:
            return 0.0
        try:
            return int(os.pread(self.schedstat, 128, 0).split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            return 0.0


@asynccontextmanager
async def watchdog(tick_s: float = 0.005) -> AsyncIterator[Watchdog]:
    """Run a ticker for the duration of the block; ``max_gap`` is in seconds."""
    dog = Watchdog(tick_s)

    async def ticker() -> None:
        dog.start()
        while True:
            await anyio.sleep(tick_s)
            dog.tick()
            dog.ticks += 1

    with contextlib.suppress(OSError):  # the loop's thread: the one entering the block
        dog.schedstat = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            await anyio.lowlevel.checkpoint()  # let the ticker start before the block runs
            try:
                yield dog
            finally:
                # a stall that lasted until the block ended has no tick after it: count it too
                dog.tick()
                tg.cancel_scope.cancel()
    finally:
        if was_enabled:
            gc.enable()
        if dog.schedstat >= 0:
            os.close(dog.schedstat)
