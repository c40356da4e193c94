"""Deadline: every call gets one absolute deadline, the tool's timeout capped by the slot."""

from __future__ import annotations

from collections.abc import Awaitable

import anyio

from ..contract import ErrorType
from ..outcome import Outcome, failure
from . import Invocation, Next


class Deadline:
    """Passes on the invocation with its deadline — now + min(``timeout_s``, slot time
    left), never later than a deadline the call already has (a fallback's: its primary's,
    ``pipeline/fallback.py``); :meth:`~toolrelay.invocation.Invocation.bounded` — as attempt 1
    (the retry and hedge stages number the attempts after it).

    Stages inside honour it: retries never sleep past it, the bulkhead never waits past
    it, and the invoke stage cancels (or abandons) the handler at it.
    """

    __slots__ = ()

    def __call__(self, call_next: Next, inv: Invocation) -> Awaitable[Outcome]:
        inv = inv.bounded(anyio.current_time(), 1)
        if inv.slot_bound and inv.slot is not None and inv.slot.remaining() <= 0:
            assert inv.tool is not None
            return failure(
                ErrorType.TIMEOUT,
                f"{inv.tool.decl.name} was not started: the model's time budget is spent",
                inv.attempt(0),  # no attempt was made
                retryable=True,
            )
        return call_next(inv)
