"""Hedge: a slow attempt of an idempotent tool gets a twin; the first good answer wins.

Between retry and breaker: each hedged attempt goes through the breaker, the bulkhead,
faults and invoke on its own. The delay is ``HedgeOptions.after_s`` or, with
``"adaptive"``, the key's p95 (:class:`LatencyWindow`); a hedge is skipped, never queued,
without the time, a bulkhead place or the retry budget for it. The algorithm step by step:
``docs/hedging.md``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import ClassVar, Literal

import anyio
from pydantic.dataclasses import dataclass

from ..budget import RetryBudgets
from ..events import HedgeEnded, RetryBudgetExhausted
from ..outcome import Outcome
from ..settings import DATACLASS, Count, Positive, one_line_errors
from . import Invocation, Next

MIN_SAMPLES = 20
"""An adaptive delay needs this many attempt latencies of the key before hedging starts."""
WINDOW_SAMPLES = 256
"""How many recent attempt latencies an adaptive delay is computed from."""
RECOMPUTE_EVERY = 16
"""The p95 is recomputed after this many new samples (a sort of at most 256 floats)."""


@one_line_errors("HedgeOptions.{}")
@dataclass(frozen=True, slots=True, kw_only=True, config=DATACLASS)
class HedgeOptions:
    """Hedging of a key's idempotent tools: ``after_s`` (seconds, or ``"adaptive"``: the
    key's observed p95, at least ``after_min_s``; ``None``, the default: never) starts up
    to ``max_hedges`` extra attempts of a slow call. Reloadable."""

    RELOADABLE: ClassVar[bool] = True
    """Whether a hot reload may change these settings of a key already in use."""

    after_s: Positive | Literal["adaptive"] | None = None
    after_min_s: Positive = 0.01
    max_hedges: Count = 1


class LatencyWindow:
    """The last :data:`WINDOW_SAMPLES` attempt latencies of a key and their p95.

    Samples are successful attempts' latencies and, for an attempt cancelled because
    another answered first, the time it had run (a lower bound of its latency: without it
    the slow tail that hedging cuts off would vanish from the window, and the delay would
    sink towards the fast answers)."""

    __slots__ = ("_p95", "_ring", "_since")

    def __init__(self) -> None:
        self._ring: deque[float] = deque(maxlen=WINDOW_SAMPLES)
        self._since = 0
        self._p95: float | None = None

    def add(self, seconds: float) -> None:
        self._ring.append(seconds)
        self._since += 1

    def p95(self) -> float | None:
        """The 95th percentile (nearest rank), or ``None`` with fewer than
        :data:`MIN_SAMPLES` samples."""
        if len(self._ring) < MIN_SAMPLES:
            return None
        if self._p95 is None or self._since >= RECOMPUTE_EVERY:
            ordered = sorted(self._ring)
            self._p95 = ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]
            self._since = 0
        return self._p95


class Hedge:
    __slots__ = ("_budgets", "_has_place", "_options_for", "_windows")

    def __init__(
        self,
        options_for: Callable[[str], HedgeOptions],
        budgets: RetryBudgets,
        has_place: Callable[[str], bool],
    ) -> None:
        self._options_for = options_for
        self._budgets = budgets
        self._has_place = has_place
        self._windows: dict[str, LatencyWindow] = {}

    def window(self, key: str) -> LatencyWindow:
        window = self._windows.get(key)
        if window is None:
            window = self._windows[key] = LatencyWindow()
        return window

    def delay(self, key: str) -> float | None:
        """How long an attempt of ``key`` may run before it is hedged (``None``: never)."""
        options = self._options_for(key)
        after = options.after_s
        if after is None:
            return None
        if after == "adaptive":
            p95 = self.window(key).p95()
            return None if p95 is None else max(p95, options.after_min_s)
        return after

    def __call__(self, call_next: Next, inv: Invocation) -> Awaitable[Outcome]:
        assert inv.tool is not None and inv.key is not None
        options = self._options_for(inv.key)
        if options.after_s is None or not inv.tool.decl.is_idempotent:
            return call_next(inv)
        delay = self.delay(inv.key)
        window = self.window(inv.key) if options.after_s == "adaptive" else None
        if delay is None or anyio.current_time() + delay >= inv.deadline:
            return call_next(inv) if window is None else self._timed(call_next, inv, window)
        return self._race(call_next, inv, options, delay, window)

    @staticmethod
    async def _timed(call_next: Next, inv: Invocation, window: LatencyWindow) -> Outcome:
        started = time.perf_counter()
        out = await call_next(inv)
        if out.ok:
            window.add(time.perf_counter() - started)
        return out

    def _refusal(self, inv: Invocation, delay: float) -> bool:
        """Is the hedge due now to be skipped? Spends the budget when it is not."""
        key = inv.key
        assert key is not None
        if inv.deadline - anyio.current_time() < delay or not self._has_place(key):
            return True
        budget = self._budgets.get(key)
        if budget is not None and not budget.try_spend():
            if inv.observers:
                inv.emit(RetryBudgetExhausted(key, "hedge"))
            return True
        return False

    async def _race(
        self,
        call_next: Next,
        inv: Invocation,
        options: HedgeOptions,
        delay: float,
        window: LatencyWindow | None,
    ) -> Outcome:
        key = inv.key
        assert key is not None
        send, receive = anyio.create_memory_object_stream[tuple[int, Outcome]](
            options.max_hedges + 1
        )
        deciding = True  # an attempt cancelled after this is over is a loser

        async def attempt(number: int, this: Invocation) -> None:
            started = time.perf_counter()
            try:
                out = await call_next(this)
            except BaseException:
                if window is not None and not deciding:
                    window.add(time.perf_counter() - started)  # a censored sample
                raise
            if window is not None and out.ok:
                window.add(time.perf_counter() - started)
            send.send_nowait((number, out))

        primary = made = inv.attempts
        hedges: list[int] = []
        hedges_left = options.max_hedges
        running = 1
        answer: Outcome | None = None
        winner = primary
        async with anyio.create_task_group() as tg:
            tg.start_soon(attempt, primary, inv)
            next_at = anyio.current_time() + delay
            while answer is None:
                got: tuple[int, Outcome] | None = None
                with anyio.move_on_after(next_at - anyio.current_time() if hedges_left else None):
                    got = await receive.receive()
                if got is None:  # the delay passed without an answer: hedge
                    hedges_left -= 1
                    next_at = anyio.current_time() + delay
                    if self._refusal(inv, delay):
                        if inv.observers:
                            inv.emit(HedgeEnded(key, made + 1, "skipped", 0))
                        hedges_left = 0
                        continue
                    made += 1
                    hedges.append(made)
                    running += 1
                    tg.start_soon(attempt, made, inv.attempt(made))
                    continue
                number, out = got
                running -= 1
                if out.ok or running == 0:
                    answer, winner = out, number
            deciding = False
            tg.cancel_scope.cancel()
        assert answer is not None  # the loop ends with one
        if inv.observers:
            for number in hedges:
                won = number == winner and answer.ok
                inv.emit(HedgeEnded(key, number, "won" if won else "lost", winner))
        if made != winner and answer.request is not None:  # the call made `made` attempts
            answer = dataclasses.replace(answer, request=answer.request.attempt(made))
        return answer
