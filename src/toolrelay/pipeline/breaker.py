"""Stage 7: the circuit breaker of the call's ``breaker_key``.

Open → ``circuit_open`` at once with ``retry_after_s``; the handler is not called and no
deadline is waited out. Pinned open by an operator → the answer says so (no trial is due).
Half-open → at most ``half_open_max_calls`` trials at a time. Each attempt's verdict is
recorded, in the breaker period that admitted it; a cancellation is neither success nor
failure. A call's duration (for ``slow_call_s``) starts when it has its bulkhead place:
waiting for our own concurrency limit is not the service's fault.
"""

from __future__ import annotations

import time

from ..breakers import REJECT, Breakers, KeyBreaker
from ..contract import ErrorType
from ..events import BreakerTransition
from ..outcome import Outcome, Verdict, short
from . import Invocation, Next


def rejection(inv: Invocation, breaker: KeyBreaker, wait: float | None = None) -> Outcome:
    """The ``circuit_open`` answer, with when to try again (``wait``, if already known).

    A breaker pinned open by an operator (``force_open``) is due no trial: the answer says
    so instead of promising one, and ``retry_after_s`` is the break, as an interval at
    which to ask again."""
    assert inv.tool is not None
    name = inv.tool.decl.name
    if wait is None:
        wait = breaker.retry_after()
    if breaker.pinned_open:
        message = (
            f"{name} is paused: an operator paused {breaker.key}; "
            "calls are refused until it is released"
        )
        return Outcome(False, None, ErrorType.CIRCUIT_OPEN, short(message), True, wait)
    if wait > 0:
        hint = f"try again in {wait:.1f} s" if wait < 10 else f"try again in {wait:.0f} s"
    else:  # half-open, with every trial place taken
        wait = min(1.0, breaker.options.reset_timeout_s)
        hint = "a trial call is testing it; try again in a moment"
    message = f"{name} is paused because {breaker.key} is failing; {hint}"
    return Outcome(False, None, ErrorType.CIRCUIT_OPEN, short(message), True, wait)


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
            return rejection(inv, breaker)
        inv.started = time.perf_counter()  # the bulkhead moves it past any wait for a place
        try:
            out = await call_next(inv)
        except BaseException:
            breaker.release(token)  # a cancellation says nothing about the service
            raise
        verdict = Verdict.SUCCESS if out.ok else out.verdict
        if breaker.record(verdict, token, time.perf_counter() - inv.started):
            out.final = True
        if inv.observers and breaker.transitions != seen:
            inv.emit(BreakerTransition(inv.key, *breaker.last_transition))
        return out
