"""Holding a dispatcher still for a test: a :class:`FrozenClock` for its breakers,
:func:`force_state` for one breaker, and :func:`capture_events` for its stage events."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal, TypeVar

from ..breakers import REJECT
from ..dispatcher import Dispatcher
from ..events import Event
from ..invocation import Invocation
from ..outcome import Verdict

E = TypeVar("E")


class FrozenClock:
    """A clock that moves only when told: ``Dispatcher(registry, options, clock=clock)``
    makes the dispatcher's breakers read it, so a break of ``reset_timeout_s`` passes with
    ``clock.advance(reset_timeout_s)`` instead of a sleep. Deadlines, retry back-off and
    slow-call timing stay on real time."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` (>= 0) forward."""
        if seconds < 0:
            raise ValueError("a clock does not go back: advance(seconds) needs seconds >= 0")
        self.now += seconds


BreakerState = Literal["closed", "open", "half_open"]


def force_state(
    dispatcher: Dispatcher, key: str, state: BreakerState, *, pinned: bool = False
) -> None:
    """Put breaker ``key`` of ``dispatcher`` in ``state``, from a fresh start (counters
    cleared, unpinned):

    - ``"closed"``: :meth:`~toolrelay.Breakers.reset`;
    - ``"open"``: tripped as failures trip it, so a trial is due ``reset_timeout_s``
      later on the breaker's clock (advance a :class:`FrozenClock`); with ``pinned=True``,
      :meth:`~toolrelay.Breakers.force_open` instead: open, no trials, until reset;
    - ``"half_open"``: the next calls (up to ``half_open_max_calls``) are trials; only for a
      breaker in local memory (not shared through Redis: other replicas would not know).
    """
    breakers = dispatcher.breakers
    if state not in ("closed", "open", "half_open"):
        raise ValueError(f'state must be "closed", "open" or "half_open", not {state!r}')
    if pinned and state != "open":
        raise ValueError("only an open breaker can be pinned")
    breaker = breakers.get(key)
    if state == "half_open" and breaker.shared is not None:
        raise ValueError(f"breaker {key!r} is shared: half_open can be forced only locally")
    breakers.reset(key)
    if state == "closed":
        return
    if pinned:
        breakers.force_open(key)
        return
    if state == "half_open":
        breaker.cb.half_open()
        return
    for _ in range(1_000_000):  # a count or time window needs minimum_calls calls
        token = breaker.admit()
        if token == REJECT or breaker.record(Verdict.FAILURE, token, 0.0):
            break
    if breaker.state != "open":
        raise RuntimeError(f"breaker {key!r} did not open on failures (state {breaker.state})")


@dataclass(frozen=True, slots=True)
class CapturedEvent:
    """A stage event (:mod:`toolrelay.events`) and the tool name of the call it came from."""

    tool: str
    event: Event


class EventLog:
    """The events a :func:`capture_events` block saw, in order."""

    def __init__(self) -> None:
        self.captured: list[CapturedEvent] = []
        self.recording = True

    def __call__(self, inv: Invocation, event: Event) -> None:
        if self.recording:
            name = inv.name if isinstance(inv.name, str) else repr(inv.name)
            self.captured.append(CapturedEvent(name, event))

    def __len__(self) -> int:
        return len(self.captured)

    def __iter__(self) -> Iterator[CapturedEvent]:
        return iter(self.captured)

    def events(self, kind: type[E] | None = None, *, tool: str | None = None) -> list[E]:
        """The events, only those of class ``kind`` and of calls to ``tool`` if given."""
        return [
            c.event  # type: ignore[misc]
            for c in self.captured
            if (kind is None or isinstance(c.event, kind)) and (tool is None or c.tool == tool)
        ]


@contextmanager
def capture_events(dispatcher: Dispatcher) -> Iterator[EventLog]:
    """Collect the stage events of the calls ``dispatcher`` runs inside the block
    (:meth:`~toolrelay.Dispatcher.add_observer`; the observer stays added, and records
    nothing after the block)."""
    log = EventLog()
    dispatcher.add_observer(log)
    try:
        yield log
    finally:
        log.recording = False
