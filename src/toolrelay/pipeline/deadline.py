"""Stage 5: every call gets one absolute deadline, the tool's timeout capped by the slot."""

from __future__ import annotations

from collections.abc import Awaitable

import anyio

from ..contract import ErrorType
from ..outcome import Outcome, failure
from . import Invocation, Next


class Deadline:
    """Sets ``inv.deadline`` = now + min(``timeout_s``, slot time left), never later than
    a deadline the call already has (a fallback's: its primary's, ``pipeline/fallback.py``).

    Stages inside honour it: retries never sleep past it, the bulkhead never waits past
    it, and the invoke stage cancels (or abandons) the handler at it.
    """

    __slots__ = ()

    def __call__(self, call_next: Next, inv: Invocation) -> Awaitable[Outcome]:
        assert inv.tool is not None
        own = anyio.current_time() + inv.tool.decl.timeout_s
        if own < inv.deadline:  # a fallback's call keeps its primary's deadline as a bound
            inv.deadline = own
        slot = inv.slot
        if slot is not None and slot.deadline < inv.deadline:
            inv.deadline = slot.deadline
            inv.slot_bound = True
            if slot.remaining() <= 0:
                return failure(
                    ErrorType.TIMEOUT,
                    f"{inv.tool.decl.name} was not started: the model's time budget is spent",
                    retryable=True,
                )
        return call_next(inv)
