"""A loop watchdog: how long did the event loop go without running a ready task?

::

    async with watchdog() as dog:
        await something_with_hostile_input()
    assert dog.max_gap < 0.05

A ticker task sleeps ``tick_s`` in a loop and records the longest time between two of its
wake-ups; anything that holds the loop (a parser on a huge string, a C call holding the
GIL in another thread) shows up as a gap. Works on both anyio backends.

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
    ticks: int = 0
    last: float = 0.0


@asynccontextmanager
async def watchdog(tick_s: float = 0.005) -> AsyncIterator[Watchdog]:
    """Run a ticker for the duration of the block; ``max_gap`` is in seconds."""
    dog = Watchdog(tick_s)

    async def ticker() -> None:
        dog.last = time.perf_counter()
        while True:
            await anyio.sleep(tick_s)
            now = time.perf_counter()
            dog.max_gap = max(dog.max_gap, now - dog.last)
            dog.ticks += 1
            dog.last = now

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
                dog.max_gap = max(dog.max_gap, time.perf_counter() - dog.last)
                tg.cancel_scope.cancel()
    finally:
        if was_enabled:
            gc.enable()
