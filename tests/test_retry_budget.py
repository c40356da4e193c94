"""Retry budgets: the algorithm on a fake clock, the retry stage through ``Dispatcher``, and
a budget shared by replicas through a real redis-server."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from helpers import key_policy, wait_until
from redis_server import RedisServer
from toolrelay import (
    AuthContext,
    BudgetOptions,
    Dispatcher,
    DispatcherOptions,
    ErrorType,
    KeyPolicy,
    StorageOptions,
    ToolError,
    ToolRegistry,
)
from toolrelay.budget import OTHERS_TTL_S, WINDOW_S, KeyBudget, RetryBudgets
from toolrelay.events import Event, RetryBudgetExhausted


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# -- the algorithm ---------------------------------------------------------------------------
def test_the_floor_allows_min_per_s_times_the_window_with_no_calls() -> None:
    budget = KeyBudget(0.2, 0.5, clock=FakeClock())
    spent = sum(budget.try_spend() for _ in range(100))
    assert spent == int(0.5 * WINDOW_S)


def test_extras_are_at_most_the_ratio_of_calls() -> None:
    clock = FakeClock()
    budget = KeyBudget(0.2, 0.0, clock=clock)
    made = 0
    for _ in range(500):
        budget.deposit()
        made += budget.try_spend()  # every call wants a retry: a hard outage
    assert made == 100  # 20 % of 500, not one more
    assert budget.counts() == (500, 100)


def test_no_budget_no_retry_without_floor() -> None:
    budget = KeyBudget(0.2, 0.0, clock=FakeClock())
    for _ in range(4):
        budget.deposit()
    assert not budget.try_spend()  # 0.8 of a retry is not one
    budget.deposit()
    assert budget.try_spend()
    assert not budget.try_spend()


def test_calls_and_extras_leave_the_window() -> None:
    clock = FakeClock()
    budget = KeyBudget(0.5, 0.0, clock=clock)
    for _ in range(10):
        budget.deposit()
    assert sum(budget.try_spend() for _ in range(10)) == 5
    clock.now += WINDOW_S - 1
    assert not budget.try_spend()  # still inside the window
    assert budget.counts() == (10, 5)
    clock.now += 1
    assert budget.counts() == (0, 0)  # the first second fell out
    assert not budget.try_spend()  # nothing deposited, no floor
    budget.deposit()
    budget.deposit()
    assert budget.try_spend()


def test_buckets_slide_one_second_at_a_time() -> None:
    clock = FakeClock(0.0)
    budget = KeyBudget(1.0, 0.0, clock=clock)
    for second in range(WINDOW_S + 5):
        clock.now = second + 0.5
        budget.deposit()
        assert budget.counts()[0] == min(second + 1, WINDOW_S)


def test_other_replicas_counts_add_while_fresh() -> None:
    clock = FakeClock()
    budget = KeyBudget(0.2, 0.0, clock=clock)
    for _ in range(5):
        budget.deposit()
    budget.share(0, 1)  # another replica already spent the one retry five calls allow
    assert budget.totals() == (5, 1)
    assert not budget.try_spend()
    budget.share(100, 1)  # the fleet made 105 calls
    assert budget.try_spend()
    clock.now += OTHERS_TTL_S + 0.1  # no fresh reading: only local counts count
    assert budget.totals() == (5, 1)
    assert not budget.try_spend()


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="ratio ≥ 0"):
        KeyBudget(-0.1)
    with pytest.raises(ValueError, match="min_per_s ≥ 0"):
        KeyBudget(0.2, -1)


def test_budgets_exist_only_for_keys_that_set_one() -> None:
    options = {"a": BudgetOptions(share=0.25, min_per_s=0.0)}
    budgets = RetryBudgets(lambda key: options.get(key, BudgetOptions()))
    assert budgets.get("b") is None and budgets.known("b") is None
    budget = budgets.get("a")
    assert budget is not None and budget.ratio == 0.25 and budget.min_per_s == 0.0
    assert budgets.get("a") is budget and budgets.known("a") is budget


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError, match=r"BudgetOptions\.share"):
        BudgetOptions(share=1.5)
    with pytest.raises(ValueError, match=r"BudgetOptions\.min_per_s"):
        BudgetOptions(min_per_s=-1.0)


# -- through the dispatcher ------------------------------------------------------------------
class Down:
    """A service in a hard outage: every request fails, retryably."""

    def __init__(self) -> None:
        self.requests = 0

    async def __call__(self, args: dict[str, Any], ctx: AuthContext) -> Any:
        self.requests += 1
        raise ToolError("upstream 503", retryable=True)


def outage(
    config: KeyPolicy, storage: StorageOptions | None = None, **live: Any
) -> tuple[Dispatcher, Down, list[Event]]:
    registry = ToolRegistry()
    down = Down()
    registry.tool(name="lookup", parameters={"type": "object"}, breaker_key="svc")(down)
    events: list[Event] = []
    dispatcher = Dispatcher(
        registry,
        DispatcherOptions(keys={"svc": config}, storage=storage),
        audit=None,
        observers=[lambda inv, event: events.append(event)],
        **live,
    )
    return dispatcher, down, events


OUTAGE = dict(fail_max=10_000, max_attempts=3, backoff_initial_s=0.0, backoff_max_s=0.0)


@pytest.mark.anyio
async def test_without_a_budget_every_call_makes_max_attempts(anyio_backend: str) -> None:
    dispatcher, down, events = outage(key_policy(**OUTAGE))
    results = [await dispatcher.dispatch("lookup", {}) for _ in range(50)]
    assert all(r.error_type is ErrorType.TOOL_ERROR and r.attempts == 3 for r in results)
    assert down.requests == 150
    assert not [e for e in events if isinstance(e, RetryBudgetExhausted)]


@pytest.mark.anyio
async def test_a_spent_budget_answers_with_the_failure_and_no_retry(anyio_backend: str) -> None:
    config = key_policy(**OUTAGE, retry_budget=0.2, retry_budget_min_per_s=0.0)
    dispatcher_metrics = CollectorRegistry()
    dispatcher, down, events = outage(config, metrics_registry=dispatcher_metrics)
    results = [await dispatcher.dispatch("lookup", {}) for _ in range(50)]
    # every call is answered, with the failure it had
    assert len(results) == 50
    assert all(r.error_type is ErrorType.TOOL_ERROR and r.retryable for r in results)
    assert all(r.to_model()["message"] == "upstream 503" for r in results)
    assert down.requests == 50 + 10  # 20 % of 50 calls retried
    assert sum(r.attempts for r in results) == 60
    exhausted = [e for e in events if isinstance(e, RetryBudgetExhausted)]
    # 40 calls found no budget for a first retry, the 10 retried ones none for a second
    assert len(exhausted) == 50 and {(e.breaker_key, e.kind) for e in exhausted} == {
        ("svc", "retry")
    }
    refused = dispatcher_metrics.get_sample_value(
        "toolrelay_retry_budget_exhausted_total", {"breaker_key": "svc", "kind": "retry"}
    )
    assert refused == 50


@pytest.mark.anyio
async def test_a_budget_does_not_stop_retries_that_succeed(anyio_backend: str) -> None:
    registry = ToolRegistry()
    seen = {"n": 0}

    @registry.tool(breaker_key="svc")
    async def flaky(args: dict[str, Any], ctx: AuthContext) -> Any:
        seen["n"] += 1
        if seen["n"] % 4 == 1:  # a quarter of the requests fail: within a 0.5 budget
            raise ToolError("blip", retryable=True)
        return {"ok": True}

    # the floor lets the very first call retry (half a call's budget is no retry)
    config = key_policy(**OUTAGE, retry_budget=0.5, retry_budget_min_per_s=0.1)
    dispatcher = Dispatcher(registry, DispatcherOptions(keys={"svc": config}), audit=None)
    results = [await dispatcher.dispatch("flaky", {}) for _ in range(40)]
    assert all(r.ok for r in results)
    retried = sum(r.attempts == 2 for r in results)
    assert seen["n"] == 40 + retried and retried == (seen["n"] + 3) // 4  # each failure


# -- shared by replicas ----------------------------------------------------------------------
@pytest.fixture
def redis() -> Any:
    with RedisServer() as server:
        yield server


@pytest.mark.anyio
@pytest.mark.servers
async def test_replicas_share_one_budget(anyio_backend: str, redis: RedisServer) -> None:
    config = key_policy(**OUTAGE, retry_budget=0.2, retry_budget_min_per_s=0.0)
    here, here_down, _ = outage(config, StorageOptions(url=redis.url, sync_interval_s=0.02))
    there, there_down, _ = outage(config, StorageOptions(url=redis.url, sync_interval_s=0.02))
    try:
        # 40 calls on one replica earn 8 retries; it spends them all
        for _ in range(40):
            await there.dispatch("lookup", {})
        assert there_down.requests == 48
        budget = here.budgets.get("svc")
        assert budget is not None
        here.breakers.get("svc")
        await wait_until(lambda: budget.totals() == (40, 8))
        # the other replica's first calls find the fleet's budget spent: no retries
        for _ in range(4):
            await here.dispatch("lookup", {})
        assert here_down.requests == 4
        # a fifth call makes 45 fleet-wide: one more retry (9 ≤ 0.2 × 45)
        await here.dispatch("lookup", {})
        assert here_down.requests == 6
    finally:
        await here.aclose()
        await there.aclose()
