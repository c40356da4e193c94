"""Fast-fail: a call to a key whose breaker is open is answered at once.

This only *reads* the breaker (nothing is counted): the breaker stage still admits and
records every attempt. Answering right after name and policy checks spares an
open-breaker call the decoding, validation, approval (no human is asked to approve a call
that would fail fast) and retry machinery: failing fast costs about half a successful
call. A call with bad arguments to a paused tool learns of its mistake on the next try.
"""

from __future__ import annotations

from collections.abc import Awaitable

from ..breakers import Breakers
from ..contract import ErrorType
from ..events import AttemptEnded
from ..outcome import Outcome, circuit_open
from . import Invocation, Next

REJECTED = AttemptEnded(1, ErrorType.CIRCUIT_OPEN.value)


class FastFail:
    __slots__ = ("breakers",)

    def __init__(self, breakers: Breakers) -> None:
        self.breakers = breakers

    def __call__(self, call_next: Next, inv: Invocation) -> Awaitable[Outcome]:
        key = inv.key
        assert key is not None
        wait = self.breakers.blocked_for(key)
        if wait is None:
            return call_next(inv)
        if inv.observers:
            inv.emit(REJECTED)
        return circuit_open(inv, self.breakers.get(key), wait, 1)  # one attempt, refused
