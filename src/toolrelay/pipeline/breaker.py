"""Breaker: every attempt is admitted by, and its verdict recorded in, the circuit breaker of
the call's ``breaker_key`` (the states, and what counts as a failure: ``docs/breakers.md``).
A cancellation is neither success nor failure.
"""

from __future__ import annotations

import dataclasses
import time

from ..breakers import REJECT, Breakers
from ..events import BreakerTransition
from ..outcome import Outcome, Verdict, circuit_open
from . import Invocation, Next


class Breaker:
    __slots__ = ("breakers",)

    def __init__(self, breakers: Breakers) -> None:
        self.breakers = breakers

    async def __call__(self, call_next: Next, inv: Invocation) -> Outcome:
        assert inv.key is not None and inv.tool is not None
        breaker = self.breakers.get(inv.key)
        seen = breaker.transitions
        token = breaker.admit()
        if token == REJECT:
            if inv.observers and breaker.transitions != seen:
                inv.emit(BreakerTransition(inv.key, *breaker.last_transition))
            return circuit_open(inv, breaker)
        started = time.perf_counter()
        try:
            out = await call_next(inv)
        except BaseException:
            breaker.release(token)  # a cancellation says nothing about the service
            raise
        verdict = Verdict.SUCCESS if out.ok else out.verdict
        # the service's time: from the attempt's bulkhead place to its answer
        if breaker.record(verdict, token, time.perf_counter() - started - out.queued_s):
            out = dataclasses.replace(out, final=True)  # it opened the breaker: no retry
        if inv.observers and breaker.transitions != seen:
            inv.emit(BreakerTransition(inv.key, *breaker.last_transition))
        return out
