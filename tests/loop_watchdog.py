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

The garbage collector is run before the block and paused during it: late in a long test
session a full collection of the whole heap takes 100+ ms, which is CPython's pause, not
the input under test's.
"""

from __future__ import annotations

import gc
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

    def tick(self) -> None:
        now, delay = time.perf_counter(), run_queue_delay()
        gap = now - self.last
        self.max_wall_gap = max(self.max_wall_gap, gap)
        self.max_gap = max(self.max_gap, gap - (delay - self.last_delay))
        self.last, self.last_delay = now, delay


def run_queue_delay() -> float:
    """Seconds this thread has spent runnable but not running (0.0 where unknown)."""
    try:
        with open("/proc/thread-self/schedstat") as stats:
            return int(stats.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


@asynccontextmanager
async def watchdog(tick_s: float = 0.005) -> AsyncIterator[Watchdog]:
    """Run a ticker for the duration of the block; ``max_gap`` is in seconds."""
    dog = Watchdog(tick_s)

    async def ticker() -> None:
        dog.last, dog.last_delay = time.perf_counter(), run_queue_delay()
        while True:
            await anyio.sleep(tick_s)
            dog.tick()
            dog.ticks += 1

    gc.collect()
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
