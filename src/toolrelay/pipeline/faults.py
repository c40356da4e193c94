"""Faults: chaos faults, injected inside the breaker as a real service failure would be.

Off unless a fault is in force: the dispatcher leaves the stage out of the chain while
there is none (``on_change`` tells it when that flips). Faults target a tool name
or a breaker key, each with a ``rate``; draws come from one seeded ``random.Random`` so a
run with the same seed and the same calls injects the same faults.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Awaitable, Callable, Iterable

import anyio

from ..contract import ToolError
from ..events import FaultInjected
from ..faults import Fault, InjectedFault
from ..outcome import Outcome, error_outcome, timeout_outcome
from . import Invocation, Next


class FaultInjector:
    """The faults in force. Change them at run time: ``add``, ``remove``, ``clear``, ``seed``."""

    def __init__(
        self,
        faults: Iterable[Fault] = (),
        seed: int | None = None,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        """``on_change()`` is called when the first fault comes in force or the last goes."""
        self._ids = itertools.count(1)
        self._faults: dict[int, Fault] = {next(self._ids): fault for fault in faults}
        self.random = random.Random(seed)
        self.on_change = on_change

    def add(self, fault: Fault) -> int:
        """Put a fault in force; returns its id."""
        fault_id = next(self._ids)
        self._faults[fault_id] = fault
        if len(self._faults) == 1 and self.on_change is not None:
            self.on_change()
        return fault_id

    def remove(self, fault_id: int) -> bool:
        removed = self._faults.pop(fault_id, None) is not None
        if removed and not self._faults and self.on_change is not None:
            self.on_change()
        return removed

    def clear(self) -> None:
        if self._faults:
            self._faults.clear()
            if self.on_change is not None:
                self.on_change()

    def seed(self, seed: int | None) -> None:
        """Restart the random source: the same seed and calls give the same injections."""
        self.random.seed(seed)

    def list(self) -> dict[int, Fault]:
        return dict(self._faults)

    def __bool__(self) -> bool:
        return bool(self._faults)

    def __call__(self, call_next: Next, inv: Invocation) -> Awaitable[Outcome]:
        if not self._faults:
            return call_next(inv)
        return self._inject(call_next, inv)

    async def _inject(self, call_next: Next, inv: Invocation) -> Outcome:
        assert inv.tool is not None and inv.key is not None
        name, key = inv.tool.decl.name, inv.key
        for fault in list(self._faults.values()):
            if not fault.matches(name, key) or self.random.random() >= fault.rate:
                continue
            if inv.observers:
                inv.emit(FaultInjected(fault.kind, key))
            if fault.kind == "latency":
                delay = fault.latency_s + self.random.uniform(0, fault.jitter_s)
                with anyio.CancelScope(deadline=inv.deadline) as scope:
                    await anyio.sleep(delay)
                if scope.cancel_called:
                    return timeout_outcome(inv)
                continue
            if fault.kind == "hang":
                with anyio.CancelScope(deadline=inv.deadline):
                    await anyio.sleep_forever()
                return timeout_outcome(inv)
            if fault.kind == "error":
                error = ToolError(
                    fault.message, error_type=fault.error_type, retryable=fault.retryable
                )
                return error_outcome(inv, error)
            if fault.kind == "exception":
                return error_outcome(inv, InjectedFault(fault.message))
            output = {"injected": float("nan")} if fault.output is None else fault.output
            return Outcome(True, output, request=inv)
        return await call_next(inv)
