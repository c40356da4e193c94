"""Join (shared storage only, just before fast-fail): a key's first calls on this replica wait
for the fleet's state of the key (breaker, pin, retry budget), at most ``bound_s`` and off
the event loop, so that a replica started during an outage does not call what the fleet
holds open. Later calls never wait (one dict lookup and an attribute check).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable

import anyio

from ..breakers import Breakers
from ..budget import RetryBudgets
from ..events import StorageJoined
from ..outcome import Outcome
from . import Invocation, Next

log = logging.getLogger("toolrelay")


class Join:
    __slots__ = ("bound_s", "breakers", "budgets")

    def __init__(self, breakers: Breakers, budgets: RetryBudgets, bound_s: float) -> None:
        self.breakers = breakers
        self.budgets = budgets
        self.bound_s = bound_s

    def __call__(self, call_next: Next, inv: Invocation) -> Awaitable[Outcome]:
        assert inv.key is not None
        breaker = self.breakers.known(inv.key)
        if breaker is not None and breaker.joined:
            return call_next(inv)
        return self._join(call_next, inv, inv.key)

    async def _join(self, call_next: Next, inv: Invocation, key: str) -> Outcome:
        self.budgets.get(key)  # before the breaker's first sync, which shares the budget too
        breaker = self.breakers.get(key)
        shared = breaker.shared
        assert shared is not None
        started = time.perf_counter()
        if shared.up and not shared.joined.is_set():
            wait = shared.joined.wait
            await anyio.to_thread.run_sync(wait, self.bound_s, abandon_on_cancel=True)
        alone = not shared.heard
        if not breaker.joined:
            breaker.joined = True
            if alone:
                log.warning(
                    "toolrelay: breaker %r decides alone: the fleet's state of it did not "
                    "come from the shared storage within %g s", key, self.bound_s,
                )  # fmt: skip
        if inv.observers:
            inv.emit(StorageJoined(key, time.perf_counter() - started, alone))
        return await call_next(inv)
