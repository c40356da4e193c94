"""Events that stages report while a call runs. Observers (telemetry, tests) receive them.

Each event is a frozen, slotted value; stages create one only when someone observes.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "AttemptEnded",
    "BreakerTransition",
    "Event",
    "FaultInjected",
    "RetryScheduled",
    "WorkerAbandoned",
]


@dataclass(frozen=True, slots=True)
class AttemptEnded:
    """One attempt of a call finished; ``result`` is ``ok`` or the ``error_type``."""

    number: int
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


Event = AttemptEnded | RetryScheduled | BreakerTransition | FaultInjected | WorkerAbandoned
