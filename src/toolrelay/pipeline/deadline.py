"""Deadline: every call gets one absolute deadline, the tool's timeout capped by the slot."""

from __future__ import annotations

from collections.abc import Awaitable

import anyio

from ..contract import ErrorType
from ..invocation import deadline_for
from ..outcome import Outcome, failure
from . import Invocation, Next


class Deadline:
    """Passes on the invocation with its deadline — now + min(``timeout_s``, slot time
    left), never later than a deadline the call already has (a fallback's: its primary's,
    ``pipeline/fallback.py``); :func:`~toolrelay.invocation.deadline_for` — as attempt 1
    (the retry and hedge stages number the attempts after it).

    Stages inside honour it: retries never sleep past it, the bulkhead never waits past
    it, and the invoke stage cancels (or abandons) the handler at it.
    """

    __slots__ = ()

    def __call__(self, call_next: Next, inv: Invocation) -> Awaitable[Outcome]:
        deadline, slot_bound = deadline_for(inv, anyio.current_time())
        if slot_bound and inv.slot is not None and inv.slot.remaining() <= 0:
            assert inv.tool is not None
            return failure(
                ErrorType.TIMEOUT,
                f"{inv.tool.decl.name} was not started: the model's time budget is spent",
                inv.bounded(deadline, slot_bound, 0),  # no attempt was made
                retryable=True,
            )
        return call_next(inv.bounded(deadline, slot_bound, 1))
