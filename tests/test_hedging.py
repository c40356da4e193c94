"""Hedging: the latency window on its own, and the hedge stage through ``Dispatcher``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from helpers import key_policy, wait_until
from toolrelay import (
    AuthContext,
    BudgetOptions,
    Dispatcher,
    DispatcherOptions,
    ErrorType,
    HedgeOptions,
    KeyPolicy,
    ToolError,
    ToolRegistry,
)
from toolrelay.budget import RetryBudgets
from toolrelay.events import Event, HedgeEnded, RetryBudgetExhausted
from toolrelay.pipeline.hedge import MIN_SAMPLES, WINDOW_SAMPLES, Hedge, LatencyWindow


# -- the adaptive delay ----------------------------------------------------------------------
def test_no_p95_before_enough_samples() -> None:
    window = LatencyWindow()
    for _ in range(MIN_SAMPLES - 1):
        window.add(0.01)
    assert window.p95() is None
    window.add(0.01)
    assert window.p95() == 0.01


def test_p95_is_the_nearest_rank_of_the_recent_samples() -> None:
    window = LatencyWindow()
    for ms in range(1, 101):  # 1 … 100 ms
        window.add(ms / 1000)
    assert window.p95() == 0.095
    for _ in range(WINDOW_SAMPLES):  # the old samples roll out
        window.add(0.5)
    assert window.p95() == 0.5


def test_adaptive_delay_has_a_floor_and_fixed_delay_is_as_set() -> None:
    options = {
        "adaptive": HedgeOptions(after_s="adaptive", after_min_s=0.05),
        "fixed": HedgeOptions(after_s=0.2),
        "off": HedgeOptions(),
    }
    budgets = RetryBudgets(lambda key: BudgetOptions())
    hedge = Hedge(options.__getitem__, budgets, lambda key: True)
    assert hedge.delay("off") is None and hedge.delay("fixed") == 0.2
    assert hedge.delay("adaptive") is None  # no samples yet: no hedging
    for _ in range(MIN_SAMPLES):
        hedge.window("adaptive").add(0.001)
    assert hedge.delay("adaptive") == 0.05  # the floor
    for _ in range(WINDOW_SAMPLES):
        hedge.window("adaptive").add(0.3)
    assert hedge.delay("adaptive") == 0.3


def test_hedge_settings_are_validated() -> None:
    with pytest.raises(ValueError, match=r"HedgeOptions\.after_s"):
        HedgeOptions(after_s="soon")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"HedgeOptions\.max_hedges"):
        HedgeOptions(max_hedges=0)


# -- through the dispatcher ------------------------------------------------------------------
HEDGED = "until the next request has started"
AFTER_HEDGE = "until the next request has ended"
SKIPPED = "until a hedge was skipped"


class Scripted:
    """Request ``i`` waits ``delays[i]`` seconds (0 past the list), or for what happens to
    the hedge (:data:`HEDGED`, :data:`AFTER_HEDGE`, :data:`SKIPPED`: an order of events
    that a loaded machine's stalls cannot swap, as they can two delays), and then answers;
    it records requests, answers and the cancellations it saw."""

    def __init__(self, *delays: float | str, fail: tuple[int, ...] = ()) -> None:
        self.delays = delays
        self.fail = fail
        self.requests = 0
        self.cancelled: list[int] = []
        self.answered: list[int] = []
        self.ended: list[int] = []
        self.events: list[Event] = []  # the dispatcher's (set by build)

    def _until(self, n: int, what: str) -> Callable[[], bool]:
        if what == HEDGED:
            return lambda: self.requests > n + 1
        if what == AFTER_HEDGE:
            return lambda: n + 1 in self.ended
        return lambda: any(e.result == "skipped" for e in self.events if isinstance(e, HedgeEnded))

    async def __call__(self, args: dict[str, Any], ctx: AuthContext) -> Any:
        n = self.requests
        self.requests += 1
        delay = self.delays[n] if n < len(self.delays) else 0
        try:
            if isinstance(delay, str):
                await wait_until(self._until(n, delay))
            else:
                await anyio.sleep(delay)
        except anyio.get_cancelled_exc_class():
            self.cancelled.append(n)
            self.ended.append(n)
            raise
        self.ended.append(n)
        if n in self.fail:
            raise ToolError(f"request {n} failed", retryable=True)
        self.answered.append(n)
        return {"request": n}


def build(
    handler: Scripted, idempotent: bool | None = None, timeout_s: float = 5.0, **config: Any
) -> tuple[Dispatcher, list[Event], CollectorRegistry]:
    registry = ToolRegistry()
    registry.tool(
        name="lookup", parameters={"type": "object"}, breaker_key="svc", timeout_s=timeout_s,
        idempotent=idempotent,
    )(handler)  # fmt: skip
    events: list[Event] = handler.events
    metrics = CollectorRegistry()
    settings = {"window": "count", "max_attempts": 1, **config}
    dispatcher = Dispatcher(
        registry,
        DispatcherOptions(keys={"svc": key_policy(**settings)}),
        audit=None,
        observers=[lambda inv, event: events.append(event)],
        metrics_registry=metrics,
    )
    return dispatcher, events, metrics


def hedges(events: list[Event]) -> list[tuple[int, str, int]]:
    return [(e.attempt, e.result, e.winner) for e in events if isinstance(e, HedgeEnded)]


pytestmark = pytest.mark.anyio


async def test_the_first_good_answer_wins_and_the_loser_is_cancelled(anyio_backend: str) -> None:
    handler = Scripted(30.0, 0.0)
    dispatcher, events, metrics = build(handler, hedge_after_s=0.05)
    result = await dispatcher.dispatch("lookup", {})
    assert result.ok and result.data == {"request": 1} and result.attempts == 2
    assert handler.cancelled == [0] and handler.answered == [1]
    # the breaker saw one call, a success: the cancelled loser is not charged
    assert dispatcher.breakers.get("svc").window_counts(others=False) == (1, 0, 0)
    assert hedges(events) == [(2, "won", 2)]
    won = metrics.get_sample_value("toolrelay_hedges_total", {"breaker_key": "svc", "hedge": "won"})
    assert won == 1


async def test_hedging_turned_on_and_off_by_a_reload(anyio_backend: str) -> None:
    # no key hedges at first: the dispatcher leaves the stage out of its chain, and puts it
    # back when a reload turns hedging on
    handler = Scripted(0.3, 30.0, 0.0, 0.0)
    dispatcher, events, _ = build(handler)
    result = await dispatcher.dispatch("lookup", {})
    assert result.ok and result.data == {"request": 0} and result.attempts == 1
    hedged = DispatcherOptions(keys={"svc": key_policy(max_attempts=1, hedge_after_s=0.05)})
    dispatcher.reconfigure(hedged)
    result = await dispatcher.dispatch("lookup", {})
    assert result.ok and result.data == {"request": 2} and result.attempts == 2
    assert hedges(events) == [(2, "won", 2)]
    dispatcher.reconfigure(DispatcherOptions(keys={"svc": key_policy(max_attempts=1)}))
    result = await dispatcher.dispatch("lookup", {})
    assert result.ok and result.data == {"request": 3} and result.attempts == 1


async def test_the_primary_wins_when_it_answers_before_the_hedge(anyio_backend: str) -> None:
    handler = Scripted(HEDGED, 30.0)
    dispatcher, events, _ = build(handler, hedge_after_s=0.05)
    result = await dispatcher.dispatch("lookup", {})
    assert result.ok and result.data == {"request": 0} and result.attempts == 2
    assert handler.cancelled == [1]
    assert hedges(events) == [(2, "lost", 1)]
    assert dispatcher.breakers.get("svc").window_counts(others=False) == (1, 0, 0)


async def test_a_failed_attempt_waits_for_the_others(anyio_backend: str) -> None:
    handler = Scripted(AFTER_HEDGE, 0.0, fail=(1,))  # the hedge fails fast; the primary answers
    dispatcher, events, _ = build(handler, hedge_after_s=0.05)
    result = await dispatcher.dispatch("lookup", {})
    assert result.ok and result.data == {"request": 0}
    assert hedges(events) == [(2, "lost", 1)]
    handler = Scripted(AFTER_HEDGE, 0.0, fail=(0, 1))  # both fail: the last failure answers
    dispatcher, events, _ = build(handler, hedge_after_s=0.05)
    result = await dispatcher.dispatch("lookup", {})
    assert result.error_type is ErrorType.TOOL_ERROR
    assert result.to_model()["message"] == "request 0 failed"
    assert handler.cancelled == []


async def test_a_fast_failure_is_not_hedged(anyio_backend: str) -> None:
    handler = Scripted(fail=(0,))
    dispatcher, events, _ = build(handler, hedge_after_s=0.05, max_attempts=2,
                                  backoff_initial_s=0.0)  # fmt: skip
    result = await dispatcher.dispatch("lookup", {})
    assert result.ok and result.attempts == 2 and handler.requests == 2  # retried instead
    assert hedges(events) == []


async def test_tools_that_are_not_idempotent_are_never_hedged(anyio_backend: str) -> None:
    handler = Scripted(0.3)
    dispatcher, events, _ = build(handler, idempotent=False, hedge_after_s=0.01, max_hedges=3)
    result = await dispatcher.dispatch("lookup", {})
    assert result.ok and result.attempts == 1 and handler.requests == 1
    assert hedges(events) == []


async def test_hedges_stay_within_the_deadline(anyio_backend: str) -> None:
    handler = Scripted(30.0, 30.0, 30.0, 30.0, 30.0, 30.0)
    # a hedge is due at 0.3 s (it starts if it comes before 0.55 s: a loaded machine's slack)
    dispatcher, events, _ = build(handler, timeout_s=0.85, hedge_after_s=0.3, max_hedges=5)
    started = anyio.current_time()
    result = await dispatcher.dispatch("lookup", {})
    assert result.error_type is ErrorType.TIMEOUT
    assert anyio.current_time() - started < 2.5
    # hedges at 0.3 and 0.6 s; by then less than one delay is left: the rest is skipped
    assert handler.requests == 2
    skipped, lost = hedges(events)
    assert skipped == (3, "skipped", 0) and lost[:2] == (2, "lost")  # a timeout wins nothing
    assert sorted(handler.cancelled) == [0, 1]
    # a delay past the deadline: not even one hedge
    handler = Scripted(30.0)
    dispatcher, events, _ = build(handler, timeout_s=0.2, hedge_after_s=0.5)
    assert (await dispatcher.dispatch("lookup", {})).error_type is ErrorType.TIMEOUT
    assert handler.requests == 1 and hedges(events) == []


async def test_a_full_bulkhead_skips_the_hedge(anyio_backend: str) -> None:
    handler = Scripted(SKIPPED, 0.0)
    dispatcher, events, metrics = build(handler, hedge_after_s=0.05, max_concurrent=1)
    result = await dispatcher.dispatch("lookup", {})
    assert result.ok and result.data == {"request": 0} and result.attempts == 1
    assert handler.requests == 1
    assert hedges(events) == [(2, "skipped", 0)]
    skipped = metrics.get_sample_value(
        "toolrelay_hedges_total", {"breaker_key": "svc", "hedge": "skipped"}
    )
    assert skipped == 1


async def test_a_spent_budget_skips_the_hedge(anyio_backend: str) -> None:
    handler = Scripted(SKIPPED, 30.0, 0.0)
    dispatcher, events, _ = build(
        handler, hedge_after_s=0.05, retry_budget=0.5, retry_budget_min_per_s=0.0
    )
    first = await dispatcher.dispatch("lookup", {})  # 1 call: half a hedge is no hedge
    assert first.ok and first.data == {"request": 0} and handler.requests == 1
    assert hedges(events) == [(2, "skipped", 0)]
    assert [e.kind for e in events if isinstance(e, RetryBudgetExhausted)] == ["hedge"]
    events.clear()
    second = await dispatcher.dispatch("lookup", {})  # 2 calls: one hedge
    assert second.ok and second.data == {"request": 2}
    assert hedges(events) == [(2, "won", 2)]


async def test_a_host_cancellation_cancels_every_attempt(anyio_backend: str) -> None:
    handler = Scripted(30.0, 30.0)
    dispatcher, events, _ = build(handler, hedge_after_s=0.05)
    answered: list[Any] = []

    async def call() -> None:
        answered.append(await dispatcher.dispatch("lookup", {}))

    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            await wait_until(lambda: handler.requests == 2)  # the primary and its hedge run
            scope.cancel()
    assert scope.cancelled_caught and answered == []
    assert sorted(handler.cancelled) == [0, 1] and handler.answered == []
    assert dispatcher.breakers.get("svc").window_counts(others=False) == (0, 0, 0)
    assert hedges(events) == []  # no attempt won, none is reported


async def test_adaptive_hedging_follows_the_observed_latency(anyio_backend: str) -> None:
    handler = Scripted(*([0.0] * MIN_SAMPLES), 30.0, 0.0)
    dispatcher, events, _ = build(handler, hedge_after_s="adaptive", hedge_after_min_s=0.05)
    for _ in range(MIN_SAMPLES):
        assert (await dispatcher.dispatch("lookup", {})).ok
    assert hedges(events) == []
    started = anyio.current_time()
    result = await dispatcher.dispatch("lookup", {})
    assert result.ok and result.data == {"request": MIN_SAMPLES + 1}
    assert anyio.current_time() - started < 5.0
    assert hedges(events) == [(2, "won", 2)]


async def test_a_hedged_call_is_a_span_event(anyio_backend: str) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    registry = ToolRegistry()
    handler = Scripted(30.0, 0.0)
    registry.tool(name="lookup", parameters={"type": "object"}, breaker_key="svc")(handler)
    dispatcher = Dispatcher(
        registry,
        DispatcherOptions(keys={"svc": KeyPolicy(hedge=HedgeOptions(after_s=0.05))}),
        audit=None,
        tracer_provider=provider,
        metrics_registry=CollectorRegistry(),
    )
    assert (await dispatcher.dispatch("lookup", {})).ok
    (span,) = exporter.get_finished_spans()
    (event,) = [e for e in span.events if e.name == "toolrelay.hedge"]
    assert dict(event.attributes or {}) == {
        "toolrelay.attempt": 2,
        "toolrelay.hedge.result": "won",
        "toolrelay.hedge.winner": 2,
    }
    assert (span.attributes or {})["toolrelay.attempts"] == 2
