"""Stage 3b: a valid call to a key whose breaker is open is answered before approval.

This only *reads* the breaker (nothing is counted): the breaker stage still admits and
records every attempt. Answering here spares an open-breaker call the approval (no human
is asked to approve a call that would fail fast), output shaping and retry machinery. It
runs after validation, so the model always learns of its own mistakes first.
"""

from __future__ import annotations

from ..breakers import Breakers
from ..contract import ErrorType
from ..events import AttemptEnded
from ..outcome import Outcome
from . import Invocation, Next
from .breaker import rejection


class FastFail:
    __slots__ = ("breakers",)

    def __init__(self, breakers: Breakers) -> None:
        self.breakers = breakers

    async def __call__(self, call_next: Next, inv: Invocation) -> Outcome:
        assert inv.key is not None
        wait = self.breakers.blocked_for(inv.key)
        if wait is None:
            return await call_next(inv)
        inv.attempts = 1
        if inv.observers:
            inv.emit(AttemptEnded(1, ErrorType.CIRCUIT_OPEN.value))
        return rejection(inv, self.breakers.get(inv.key), wait)
