"""Bulkhead: at most ``max_concurrent`` calls in flight per breaker key.

Above that the answer is ``overloaded`` at once, or after at most ``bulkhead_wait_s``
(never past the call's deadline). Load shedding is not a service failure: the breaker
ignores it.

With ``max_concurrent = "adaptive"`` the number of places follows the service's latency
(:class:`~toolrelay.adaptive.AdaptiveLimit`): each attempt's time from its place to its
answer is recorded (a timeout as a drop; a cancellation, or an ``overloaded`` answer from
inside, not at all), abandoned worker threads of the key still hold places, and a call
refused by the limit is told ``retry_after_s`` (about one round trip).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable

import anyio

from ..adaptive import AdaptiveLimit
from ..breakers import BreakerConfig
from ..contract import ErrorType
from ..events import ConcurrencyLimited, ConcurrencyLimitUpdated
from ..outcome import Outcome, failure
from . import Invocation, Next


class _Gate:
    """One key's places and its settings, looked up once per call."""

    __slots__ = ("config", "places")

    def __init__(self, config: BreakerConfig) -> None:
        self.config = config
        assert config.max_concurrent != "adaptive"
        self.places = anyio.Semaphore(config.max_concurrent)

    @property
    def in_flight(self) -> int:
        assert self.config.max_concurrent != "adaptive"
        return self.config.max_concurrent - self.places.value


class _AdaptiveGate:
    """One key's adaptive limit and the calls holding its places."""

    __slots__ = ("config", "freed", "in_flight", "limit")

    def __init__(self, config: BreakerConfig) -> None:
        self.config = config
        self.limit = AdaptiveLimit(config.adaptive_min, config.adaptive_max)
        self.in_flight = 0
        self.freed: anyio.Event | None = None
        """Set (and dropped) when a place is given back, for calls waiting for one."""

    def release(self) -> None:
        self.in_flight -= 1
        freed, self.freed = self.freed, None
        if freed is not None:
            freed.set()


class Bulkhead:
    __slots__ = ("_config_for", "_gates", "_held", "_tenants")

    def __init__(
        self,
        config_for: Callable[[str], BreakerConfig],
        held: Callable[[str], int] | None = None,
    ) -> None:
        """``held(key)``: places of an adaptive key held outside the bulkhead (worker
        threads abandoned at a deadline and still running)."""
        self._config_for = config_for
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
        held = self._held(key) if self._held else 0
        return gate.in_flight + held < gate.limit.limit

    def __call__(self, call_next: Next, inv: Invocation) -> Awaitable[Outcome]:
        key = inv.key
        assert key is not None and inv.tool is not None
        gate = self._gates.get(key)
        if gate is None:
            config = self._config_for(key)
            adaptive = config.max_concurrent == "adaptive"
            gate = self._gates[key] = _AdaptiveGate(config) if adaptive else _Gate(config)
        share = gate.config.max_concurrent_per_tenant
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
            return await self._admit(call_next, inv, gate)
        finally:
            left = self._tenants[tenant] - 1
            if left:
                self._tenants[tenant] = left
            else:
                del self._tenants[tenant]

    def _admit(
        self, call_next: Next, inv: Invocation, gate: _Gate | _AdaptiveGate
    ) -> Awaitable[Outcome]:
        if isinstance(gate, _AdaptiveGate):
            return self._adapt(call_next, inv, gate)
        return self._fixed(call_next, inv, gate)

    async def _fixed(self, call_next: Next, inv: Invocation, gate: _Gate) -> Outcome:
        assert inv.tool is not None
        places = gate.places
        try:
            places.acquire_nowait()
        except anyio.WouldBlock:
            entered = time.perf_counter()
            limit = min(gate.config.bulkhead_wait_s, inv.deadline - anyio.current_time())
            acquired = False
            if limit > 0:
                with anyio.move_on_after(limit):
                    await places.acquire()
                    acquired = True
            if not acquired:
                return failure(
                    ErrorType.OVERLOADED,
                    f"{inv.tool.decl.name} is busy: {inv.key} already has "
                    f"{gate.config.max_concurrent} calls in flight",
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
        if gate.in_flight + (held(key) if held else 0) >= limit.limit:
            entered = time.perf_counter()
            wait = min(gate.config.bulkhead_wait_s, inv.deadline - anyio.current_time())
            with anyio.move_on_after(max(0.0, wait)):
                while gate.in_flight + (held(key) if held else 0) >= limit.limit:
                    if gate.freed is None:
                        gate.freed = anyio.Event()
                    await gate.freed.wait()
            if gate.in_flight + (held(key) if held else 0) >= limit.limit:
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
