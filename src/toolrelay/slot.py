"""The model slot: one generation at a time, with a time budget its tool calls respect."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager

import anyio


class SlotLease:
    """One hold of the slot. Tool deadlines are capped by :meth:`remaining`."""

    __slots__ = ("budget_s", "deadline", "released_at", "started_at")

    def __init__(self, budget_s: float) -> None:
        self.budget_s = budget_s
        self.started_at = anyio.current_time()
        self.deadline = self.started_at + budget_s
        self.released_at: float | None = None

    def remaining(self) -> float:
        """Seconds of budget left (never negative)."""
        return max(0.0, self.deadline - anyio.current_time())

    def elapsed(self) -> float:
        end = anyio.current_time() if self.released_at is None else self.released_at
        return end - self.started_at


SlotListener = Callable[[SlotLease], None]


class ModelSlot:
    """A capacity-one slot with a time budget per hold.

    ``async with slot.hold() as lease:`` waits for the slot, then hands out a lease that
    ``dispatch(..., slot=lease)`` uses to cap every tool deadline by the budget left.
    Listeners are called with the lease when it is released (telemetry records hold time).
    """

    def __init__(self, budget_s: float = 30.0, *, listeners: Sequence[SlotListener] = ()):
        if not budget_s > 0:
            raise ValueError("budget_s must be positive")
        self.budget_s = float(budget_s)
        self.listeners: list[SlotListener] = list(listeners)
        self._lock = anyio.Lock()

    @asynccontextmanager
    async def hold(self, budget_s: float | None = None) -> AsyncIterator[SlotLease]:
        async with self._lock:
            lease = SlotLease(self.budget_s if budget_s is None else float(budget_s))
            try:
                yield lease
            finally:
                lease.released_at = anyio.current_time()
                for listener in self.listeners:
                    listener(lease)
