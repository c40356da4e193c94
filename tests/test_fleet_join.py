"""A fleet through a real redis-server: a replica joins before it decides (its first call on
a key waits, bounded, for the fleet's breaker state, pin and retry budget), and a client's
rate is the fleet's, not each replica's."""

from __future__ import annotations

import logging
import os
import signal
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis as redis_py
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from helpers import wait_until
from redis_server import RedisServer
from toolrelay import (
    AuthContext,
    BreakerOptions,
    BudgetOptions,
    Dispatcher,
    DispatcherOptions,
    ErrorType,
    KeyPolicy,
    RetryOptions,
    StorageOptions,
    ToolError,
    ToolRegistry,
)
from toolrelay.events import StorageJoined
from toolrelay.serve.client_limits import ClientLimit, ClientLimits
from toolrelay.storage import RedisLink

pytestmark = [pytest.mark.anyio, pytest.mark.servers]

POLICY = KeyPolicy(
    breaker=BreakerOptions(fail_max=3, reset_timeout_s=60), retry=RetryOptions(max_attempts=1)
)


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def key() -> str:
    """A key of this test's own (the module's Redis outlives it)."""
    return uuid.uuid4().hex[:8]


class Failing:
    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, args: dict[str, Any], ctx: AuthContext) -> Any:
        self.calls += 1
        raise ToolError("upstream 503", retryable=True)


def shared(redis: RedisServer, name: str) -> dict[str, str]:
    """The hash ``name`` (a key's state; ``<key>:counts``) as Redis has it."""
    client = redis_py.Redis.from_url(redis.url, decode_responses=True)
    try:
        return client.hgetall(f"toolrelay:{name}")  # type: ignore[return-value]
    finally:
        client.close()


def replica(
    url: str, key: str, policy: KeyPolicy = POLICY, spans: Any = None, **storage: Any
) -> tuple[Dispatcher, Failing, list[Any]]:
    """A new replica (dispatcher) of ``key``: its tool always fails; the events it saw
    (``spans``: an exporter its calls' spans go to)."""
    registry = ToolRegistry()
    tool = Failing()
    registry.tool(name="pay", parameters={"type": "object"}, breaker_key=key)(tool)  # type: ignore[arg-type]
    events: list[Any] = []
    options = DispatcherOptions(keys={key: policy}, storage=StorageOptions(url=url, **storage))
    provider = TracerProvider()
    if spans is not None:
        provider.add_span_processor(SimpleSpanProcessor(spans))
    dispatcher = Dispatcher(
        registry,
        options,
        audit=None,
        observers=[lambda inv, e: events.append(e)],
        tracer_provider=provider,
    )
    return dispatcher, tool, events


async def test_a_new_replica_refuses_its_first_call_to_a_key_the_fleet_holds_open(
    redis: RedisServer, key: str
) -> None:
    first, _, _ = replica(redis.url, key)
    for _ in range(3):
        await first.dispatch("pay", {})
    assert first.breakers.state(key) == "open"
    await first.aclose()  # hands its decision to Redis: a replica started now must see it
    assert shared(redis, key)["state"] == "open"

    spans = InMemorySpanExporter()
    late, tool, events = replica(redis.url, key, spans=spans)
    result = await late.dispatch("pay", {})
    assert result.error_type is ErrorType.CIRCUIT_OPEN
    assert tool.calls == 0  # the dead service got nothing from the new replica
    (span,) = spans.get_finished_spans()
    assert span.attributes is not None and span.attributes["toolrelay.breaker.joined"] == "fleet"
    joined = [e for e in events if isinstance(e, StorageJoined)]
    assert len(joined) == 1 and not joined[0].alone and joined[0].waited_s < 1.0
    result = await late.dispatch("pay", {})
    assert result.error_type is ErrorType.CIRCUIT_OPEN and tool.calls == 0
    assert len([e for e in events if isinstance(e, StorageJoined)]) == 1  # joined once
    await late.aclose()


async def test_a_new_replica_keeps_a_pin_and_the_fleets_retry_budget(
    redis: RedisServer, key: str
) -> None:
    operator, _, _ = replica(redis.url, key)
    operator.breakers.force_open(key)
    budgeted = KeyPolicy(
        breaker=BreakerOptions(fail_max=1000),
        retry=RetryOptions(max_attempts=3, backoff_initial_s=0.001, backoff_max_s=0.001),
        budget=BudgetOptions(share=0.0, min_per_s=0.2),  # two retries per 10 s, fleet-wide
    )
    spender, spent, _ = replica(redis.url, f"{key}-mail", budgeted, sync_interval_s=0.05)
    await spender.dispatch("pay", {})  # 1 call + 2 retries: the fleet's budget is spent
    assert spent.calls == 3
    await operator.aclose()
    assert shared(redis, key)["pinned"] == "1"
    budget = f"{spender.storage_link.replica}|budget"  # type: ignore[union-attr]
    counts = f"{key}-mail:counts"
    await wait_until(lambda: shared(redis, counts).get(budget, "0,0").split(",")[1] == "2")

    late, tool, _ = replica(redis.url, key)
    result = await late.dispatch("pay", {})
    assert result.error_type is ErrorType.CIRCUIT_OPEN and "paused" in result.message
    assert tool.calls == 0
    other, tool, events = replica(redis.url, f"{key}-mail", budgeted)
    result = await other.dispatch("pay", {})
    assert result.error_type is ErrorType.TOOL_ERROR
    assert tool.calls == 1  # no retry: the fleet spent the budget before this replica started
    assert any(type(e).__name__ == "RetryBudgetExhausted" for e in events)
    for dispatcher in (late, other, spender):
        await dispatcher.aclose()


@pytest.mark.serial
async def test_with_redis_paused_the_first_call_waits_no_longer_than_the_bound(
    redis: RedisServer, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="toolrelay")
    bound = 0.05
    assert redis.proc is not None
    os.kill(redis.proc.pid, signal.SIGSTOP)
    try:
        late, tool, events = replica(redis.url, key, join_timeout_s=bound, timeout_s=0.5)
        started = time.perf_counter()
        result = await late.dispatch("pay", {})
        took = time.perf_counter() - started
        assert result.error_type is ErrorType.TOOL_ERROR and tool.calls == 1  # decided alone
        assert bound <= took < bound + 0.25, took
        joined = [e for e in events if isinstance(e, StorageJoined)]
        assert len(joined) == 1 and joined[0].alone
        assert any("decides alone" in r.getMessage() for r in caplog.records)
        started = time.perf_counter()
        await late.dispatch("pay", {})
        assert time.perf_counter() - started < bound  # later calls never wait
        late.close()
    finally:
        os.kill(redis.proc.pid, signal.SIGCONT)


# -- one rate per client for the fleet -------------------------------------------------------
def test_two_replicas_give_a_client_its_rate_not_twice_it(redis: RedisServer, key: str) -> None:
    """Two gateways' limits sharing one Redis, a client's requests spread over both at 400/s
    for 1.6 s: after the first buckets (full at start), the fleet admits the client's rate."""
    rate = 20.0
    replicas = []
    for _ in range(2):
        link = RedisLink(redis.url, sync_interval_s=0.05, prefix=f"{key}:")
        limits = ClientLimits(ClientLimit(rate_per_s=rate))
        limits.share_with(link)
        replicas.append((link, limits))
    admitted: list[float] = []
    started = time.monotonic()
    index = 0
    while (now := time.monotonic()) - started < 1.6:
        link, limits = replicas[index % 2]
        index += 1
        if limits.enter("agent") is None:
            limits.leave("agent")
            admitted.append(now - started)
        time.sleep(0.0025)
    for link, _ in replicas:
        link.close()
    steady = [at for at in admitted if 0.6 <= at < 1.6]  # one second, buckets long emptied
    assert 0.7 * rate <= len(steady) <= 1.4 * rate, (len(steady), len(admitted))
