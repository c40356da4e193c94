"""Events that stages report while a call runs. Observers (telemetry, tests) receive them.

Each event is a frozen, slotted value; stages create one only when someone observes.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "AttemptEnded",
    "BreakerTransition",
    "ConcurrencyLimitUpdated",
    "ConcurrencyLimited",
    "Event",
    "FallbackEnded",
    "FaultInjected",
    "HedgeEnded",
    "LoopBlocked",
    "RetryBudgetExhausted",
    "RetryScheduled",
    "StorageJoined",
    "WorkerAbandoned",
    "WorkerKilled",
]


@dataclass(frozen=True, slots=True)
class AttemptEnded:
    """Attempt ``attempt`` (1 = the first) of a call finished; ``result`` is ``ok`` or the
    ``error_type``."""

    attempt: int
    result: str


@dataclass(frozen=True, slots=True)
class RetryScheduled:
    """Attempt ``attempt`` failed with ``error_type``; the next starts after ``delay_s``."""

    attempt: int
    delay_s: float
    error_type: str


@dataclass(frozen=True, slots=True)
class BreakerTransition:
    """The breaker of ``breaker_key`` moved between states (seen by this call or any)."""

    breaker_key: str
    from_state: str
    to_state: str


@dataclass(frozen=True, slots=True)
class FaultInjected:
    """A chaos fault was injected into the call."""

    fault: str
    breaker_key: str


@dataclass(frozen=True, slots=True)
class WorkerAbandoned:
    """A sync handler's thread was left running past the call's deadline or cancellation."""

    breaker_key: str


@dataclass(frozen=True, slots=True)
class WorkerKilled:
    """A sync handler's worker process (``isolation="process"``) was killed at the call's
    deadline or cancellation, and is gone."""

    breaker_key: str


@dataclass(frozen=True, slots=True)
class LoopBlocked:
    """An async handler's steps held the event loop for ``seconds`` (each step counted
    that held it for ``BLOCKING_STEP_S`` or more): a blocking call in an ``async def``."""

    seconds: float


@dataclass(frozen=True, slots=True)
class HedgeEnded:
    """Hedge ``attempt`` (2 = the first hedge) of a call: ``won`` (its answer was used),
    ``lost`` (another attempt answered first, or it failed) or ``skipped`` (not started: no
    time left, no bulkhead place, or the retry budget spent). ``winner`` is the attempt
    whose answer the call got (0 while unknown)."""

    breaker_key: str
    attempt: int
    result: str
    winner: int


@dataclass(frozen=True, slots=True)
class RetryBudgetExhausted:
    """A ``retry`` or ``hedge`` (``kind``) of ``breaker_key`` was not made: its retry
    budget is spent."""

    breaker_key: str
    kind: str


@dataclass(frozen=True, slots=True)
class ConcurrencyLimited:
    """The call was refused by its key's adaptive concurrency ``limit`` (``in_flight``
    calls were holding places)."""

    breaker_key: str
    limit: int
    in_flight: int


@dataclass(frozen=True, slots=True)
class ConcurrencyLimitUpdated:
    """A window of the key's adaptive limit ended: the ``limit`` now, the most calls
    in flight during the window (``in_flight``), and the key's ``adaptive_min``."""

    breaker_key: str
    limit: int
    in_flight: int
    min_limit: int


@dataclass(frozen=True, slots=True)
class FallbackEnded:
    """The call's tool answered ``primary`` and fallback ``fallback`` (breaker key
    ``breaker_key``, ``None`` if unknown) was tried: it answered ``result`` (``ok`` or the
    ``error_type``) after ``attempts`` attempts; ``served`` when that is the call's answer."""

    fallback: str
    breaker_key: str | None
    result: str
    served: bool
    primary: str
    attempts: int


@dataclass(frozen=True, slots=True)
class StorageJoined:
    """A first call of ``breaker_key`` on this replica waited ``waited_s`` for the fleet's
    shared state of the key; ``alone``: it did not arrive in time, the key decides alone."""

    breaker_key: str
    waited_s: float
    alone: bool


Event = (
    AttemptEnded
    | FallbackEnded
    | HedgeEnded
    | RetryBudgetExhausted
    | RetryScheduled
    | BreakerTransition
    | FaultInjected
    | WorkerAbandoned
    | WorkerKilled
    | LoopBlocked
    | ConcurrencyLimited
    | ConcurrencyLimitUpdated
    | StorageJoined
)
