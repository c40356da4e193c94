"""Stage 8: at most ``max_concurrent`` calls in flight per breaker key.

Above that the answer is ``overloaded`` at once, or after at most ``bulkhead_wait_s``
(never past the call's deadline). Load shedding is not a service failure: the breaker
ignores it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import anyio

from ..breakers import BreakerConfig
from ..contract import ErrorType
from ..outcome import Outcome, failure
from . import Invocation, Next


class _Gate:
    """One key's places and its settings, looked up once per call."""

    __slots__ = ("config", "places")

    def __init__(self, config: BreakerConfig) -> None:
        self.config = config
        self.places = anyio.Semaphore(config.max_concurrent)


class Bulkhead:
    __slots__ = ("_config_for", "_gates", "_tenants")

    def __init__(self, config_for: Callable[[str], BreakerConfig]) -> None:
        self._config_for = config_for
        self._gates: dict[str, _Gate] = {}
        self._tenants: dict[tuple[str, str | None], int] = {}

    def in_flight(self) -> dict[str, int]:
        """Calls holding a place, per key."""
        return {
            key: gate.config.max_concurrent - gate.places.value for key, gate in self._gates.items()
        }

    def __call__(self, call_next: Next, inv: Invocation) -> Awaitable[Outcome]:
        key = inv.key
        assert key is not None and inv.tool is not None
        gate = self._gates.get(key)
        if gate is None:
            gate = self._gates[key] = _Gate(self._config_for(key))
        share = gate.config.max_concurrent_per_tenant
        if share is None:
            return self._admit(call_next, inv, gate)
        return self._share(call_next, inv, gate, key, share)

    async def _share(
        self, call_next: Next, inv: Invocation, gate: _Gate, key: str, share: int
    ) -> Outcome:
        assert inv.tool is not None
        tenant = (key, inv.ctx.tenant_id)
        held = self._tenants.get(tenant, 0)
        if held >= share:
            return failure(
                ErrorType.OVERLOADED,
                f"{inv.tool.decl.name} is busy: your {share} calls to {key} are still running",
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

    async def _admit(self, call_next: Next, inv: Invocation, gate: _Gate) -> Outcome:
        assert inv.tool is not None
        places = gate.places
        try:
            places.acquire_nowait()
        except anyio.WouldBlock:
            limit = min(gate.config.bulkhead_wait_s, inv.deadline - anyio.current_time())
            acquired = False
            if limit > 0:
                with anyio.move_on_after(limit):
                    await places.acquire()
                    acquired = True
                    inv.started = time.perf_counter()  # queueing is not the service's time
            if not acquired:
                return failure(
                    ErrorType.OVERLOADED,
                    f"{inv.tool.decl.name} is busy: {inv.key} already has "
                    f"{gate.config.max_concurrent} calls in flight",
                    retryable=True,
                )
        try:
            return await call_next(inv)
        finally:
            places.release()
