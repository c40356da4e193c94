"""Bulkhead: at most ``max_concurrent`` calls in flight per breaker key (:class:`BulkheadOptions`).

Above that the answer is ``overloaded`` at once, or after at most ``wait_s`` (never past
the call's deadline); the breaker ignores it. With ``max_concurrent = "adaptive"`` the
number of places follows the service's latency (:class:`~toolrelay.adaptive.AdaptiveLimit`,
``docs/adaptive-concurrency.md``); abandoned worker threads of the key still hold places.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable
from typing import ClassVar, Literal

import anyio
from pydantic import ValidationInfo, field_validator
from pydantic.dataclasses import dataclass

from ..adaptive import AdaptiveLimit
from ..contract import ErrorType
from ..events import ConcurrencyLimited, ConcurrencyLimitUpdated
from ..outcome import Outcome, failure
from ..settings import DATACLASS, Count, Seconds, one_line_errors
from . import Invocation, Next


@one_line_errors("BulkheadOptions.{}")
@dataclass(frozen=True, slots=True, kw_only=True, config=DATACLASS)
class BulkheadOptions:
    """How many calls of a key may be in flight.

    ``max_concurrent`` calls may be in flight (and as many worker threads live); ``wait_s``
    is how long a call may wait for a place before ``overloaded``;
    ``max_concurrent_per_tenant`` caps one tenant's share of those places.
    ``max_concurrent = "adaptive"``: the limit follows the key's latency, between
    ``adaptive_min`` and ``adaptive_max`` (:mod:`toolrelay.adaptive`).

    Not reloadable: a key's bulkhead (and its worker threads) keep the settings of its
    first call.
    """

    RELOADABLE: ClassVar[bool] = False
    """Whether a hot reload may change these settings of a key already in use."""

    max_concurrent: Count | Literal["adaptive"] = 32
    max_concurrent_per_tenant: Count | None = None
    wait_s: Seconds = 0.0
    adaptive_min: Count = 2
    adaptive_max: Count = 100

    @property
    def max_places(self) -> int:
        """The most calls that may ever be in flight (and worker threads live)."""
        return self.adaptive_max if self.max_concurrent == "adaptive" else self.max_concurrent

    @field_validator("adaptive_max")
    @classmethod
    def _not_below_adaptive_min(cls, value: int, info: ValidationInfo) -> int:
        if value < info.data.get("adaptive_min", 1):
            raise ValueError("must be ≥ adaptive_min")
        return value


class _Gate:
    """One key's places and its settings, looked up once per call."""

    __slots__ = ("options", "places")

    def __init__(self, options: BulkheadOptions) -> None:
        self.options = options
        assert options.max_concurrent != "adaptive"
        self.places = anyio.Semaphore(options.max_concurrent)

    @property
    def in_flight(self) -> int:
        assert self.options.max_concurrent != "adaptive"
        return self.options.max_concurrent - self.places.value


class _AdaptiveGate:
    """One key's adaptive limit and the calls holding its places."""

    __slots__ = ("freed", "in_flight", "limit", "options")

    def __init__(self, options: BulkheadOptions) -> None:
        self.options = options
        self.limit = AdaptiveLimit(options.adaptive_min, options.adaptive_max)
        self.in_flight = 0
        self.freed: anyio.Event | None = None
        """Set (and dropped) when a place is given back, for calls waiting for one."""

    def release(self) -> None:
        self.in_flight -= 1
        freed, self.freed = self.freed, None
        if freed is not None:
            freed.set()


class Bulkhead:
    __slots__ = ("_gates", "_held", "_options_for", "_tenants")

    def __init__(
        self,
        options_for: Callable[[str], BulkheadOptions],
        held: Callable[[str], int],
    ) -> None:
        """``held(key)``: places of an adaptive key held outside the bulkhead (worker
        threads abandoned at a deadline and still running)."""
        self._options_for = options_for
        self._held = held
        self._gates: dict[str, _Gate | _AdaptiveGate] = {}
        self._tenants: dict[tuple[str, str | None], int] = {}

    def in_flight(self) -> dict[str, int]:
        """Calls holding a place, per key."""
        return {key: gate.in_flight for key, gate in self._gates.items()}

    def limits(self) -> dict[str, int]:
        """The current limit of each adaptive key."""
        return {
            key: gate.limit.limit
            for key, gate in self._gates.items()
            if isinstance(gate, _AdaptiveGate)
        }

    def has_place(self, key: str) -> bool:
        """Has ``key`` a free place now (under its current limit, when adaptive)?"""
        gate = self._gates.get(key)
        if gate is None:
            return True
        if isinstance(gate, _Gate):
            return gate.places.value > 0
        return gate.in_flight + self._held(key) < gate.limit.limit

    def __call__(self, call_next: Next, inv: Invocation) -> Awaitable[Outcome]:
        key = inv.key
        assert key is not None and inv.tool is not None
        gate = self._gates.get(key)
        if gate is None:
            options = self._options_for(key)
            adaptive = options.max_concurrent == "adaptive"
            gate = self._gates[key] = _AdaptiveGate(options) if adaptive else _Gate(options)
        share = gate.options.max_concurrent_per_tenant
        if share is not None:
            return self._share(call_next, inv, gate, key, share)
        if isinstance(gate, _AdaptiveGate):
            return self._adapt(call_next, inv, gate)
        return self._fixed(call_next, inv, gate)

    async def _share(
        self, call_next: Next, inv: Invocation, gate: _Gate | _AdaptiveGate, key: str, share: int
    ) -> Outcome:
        assert inv.tool is not None
        tenant = (key, inv.ctx.tenant_id)
        held = self._tenants.get(tenant, 0)
        if held >= share:
            return failure(
                ErrorType.OVERLOADED,
                f"{inv.tool.decl.name} is busy: your {share} calls to {key} are still running",
                inv,
                retryable=True,
            )
        self._tenants[tenant] = held + 1
        try:
            if isinstance(gate, _AdaptiveGate):
                return await self._adapt(call_next, inv, gate)
            return await self._fixed(call_next, inv, gate)
        finally:
            left = self._tenants[tenant] - 1
            if left:
                self._tenants[tenant] = left
            else:
                del self._tenants[tenant]

    async def _fixed(self, call_next: Next, inv: Invocation, gate: _Gate) -> Outcome:
        assert inv.tool is not None
        places = gate.places
        try:
            places.acquire_nowait()
        except anyio.WouldBlock:
            entered = time.perf_counter()
            limit = min(gate.options.wait_s, inv.deadline - anyio.current_time())
            acquired = False
            if limit > 0:
                with anyio.move_on_after(limit):
                    await places.acquire()
                    acquired = True
            if not acquired:
                return failure(
                    ErrorType.OVERLOADED,
                    f"{inv.tool.decl.name} is busy: {inv.key} already has "
                    f"{gate.options.max_concurrent} calls in flight",
                    inv,
                    retryable=True,
                )
            queued = time.perf_counter() - entered  # queueing is not the service's time
            try:
                out = await call_next(inv)
            finally:
                places.release()
            return dataclasses.replace(out, queued_s=queued)
        try:
            return await call_next(inv)
        finally:
            places.release()

    async def _adapt(self, call_next: Next, inv: Invocation, gate: _AdaptiveGate) -> Outcome:
        assert inv.tool is not None and inv.key is not None
        key, limit = inv.key, gate.limit
        held = self._held
        queued = 0.0
        if gate.in_flight + held(key) >= limit.limit:
            entered = time.perf_counter()
            wait = min(gate.options.wait_s, inv.deadline - anyio.current_time())
            with anyio.move_on_after(max(0.0, wait)):
                while gate.in_flight + held(key) >= limit.limit:
                    if gate.freed is None:
                        gate.freed = anyio.Event()
                    await gate.freed.wait()
            if gate.in_flight + held(key) >= limit.limit:
                if inv.observers:
                    inv.emit(ConcurrencyLimited(key, limit.limit, gate.in_flight))
                return failure(
                    ErrorType.OVERLOADED,
                    f"{inv.tool.decl.name} is busy: {key} is at its adaptive limit of "
                    f"{limit.limit} calls in flight",
                    inv,
                    retryable=True,
                    retry_after_s=limit.retry_after_s(),
                )
            queued = time.perf_counter() - entered  # queueing is not the service's time
        gate.in_flight += 1
        in_flight = gate.in_flight
        started = time.perf_counter()
        try:
            out = await call_next(inv)
        finally:  # a cancellation gives the place back and records nothing
            gate.release()
        if out.error_type is not ErrorType.OVERLOADED:  # overloaded: never reached the service
            dropped = out.error_type is ErrorType.TIMEOUT
            ended = limit.record(time.perf_counter() - started, in_flight, dropped=dropped)
            if ended and inv.observers:
                inv.emit(ConcurrencyLimitUpdated(key, limit.limit, limit.peak, limit.min_limit))
        return dataclasses.replace(out, queued_s=queued) if queued else out
