"""Adaptive concurrency (``max_concurrent = "adaptive"``) through ``Dispatcher``, on both
backends: the limit follows a saturating service, refusals answer ``overloaded`` with
``retry_after_s`` and are not charged to the breaker, per-tenant shares still bind,
cancellations move nothing, hedges respect the current limit; and the settings."""

from __future__ import annotations

import threading
import time
from typing import Any

import anyio
import pytest

from helpers import key_policy, wait_until
from toolrelay import (
    AuthContext,
    BreakerOptions,
    BulkheadOptions,
    Dispatcher,
    DispatcherOptions,
    ErrorType,
    HedgeOptions,
    KeyPolicy,
    RetryOptions,
    ToolRegistry,
)
from toolrelay.config import parse_config
from toolrelay.events import ConcurrencyLimited, ConcurrencyLimitUpdated, Event, HedgeEnded
from toolrelay.result import ToolResult
from toolrelay.settings import ConfigError, SettingsError

pytestmark = pytest.mark.anyio


class Crowded:
    """A service of ``capacity`` places: ``base`` seconds up to that many calls in flight,
    ``base × (n / capacity)²`` past it (counted at arrival). Async or sync (threads)."""

    def __init__(self, capacity: int, base: float) -> None:
        self.capacity = capacity
        self.base = base
        self.in_flight = 0
        self.peak = 0
        self.calls = 0
        self.lock = threading.Lock()

    def _enter(self) -> float:
        with self.lock:
            self.in_flight += 1
            self.calls += 1
            self.peak = max(self.peak, self.in_flight)
            return self.base * max(1.0, self.in_flight / self.capacity) ** 2

    def _leave(self) -> None:
        with self.lock:
            self.in_flight -= 1

    async def run_async(self, args: dict[str, Any], ctx: AuthContext) -> dict[str, int]:
        delay = self._enter()
        try:
            await anyio.sleep(delay)
        finally:
            self._leave()
        return {"ok": 1}

    def run_sync(self, args: dict[str, Any], ctx: AuthContext) -> dict[str, int]:
        delay = self._enter()
        try:
            time.sleep(delay)
        finally:
            self._leave()
        return {"ok": 1}


def build(handler: Any, **config: Any) -> tuple[Dispatcher, list[Event]]:
    registry = ToolRegistry()
    registry.tool(
        name="svc_call", parameters={"type": "object"}, breaker_key="svc", timeout_s=10.0
    )(handler)
    events: list[Event] = []
    settings = {"max_concurrent": "adaptive", "max_attempts": 1, "fail_max": 1, **config}
    dispatcher = Dispatcher(
        registry,
        DispatcherOptions(keys={"svc": key_policy(**settings)}, telemetry=False),
        audit=None,
        observers=[lambda inv, event: events.append(event)],
    )
    return dispatcher, events


def limits(events: list[Event]) -> list[int]:
    return [e.limit for e in events if isinstance(e, ConcurrencyLimitUpdated)]


async def hammer(dispatcher: Dispatcher, callers: int, seconds: float) -> list[ToolResult]:
    """``callers`` callers calling back to back for ``seconds``; a refused caller waits
    its ``retry_after_s`` as a well-behaved agent would."""
    results: list[ToolResult] = []
    end = anyio.current_time() + seconds

    async def caller(n: int) -> None:
        ctx = AuthContext(user_id=f"u{n}", tenant_id=f"t{n}")
        while anyio.current_time() < end:
            result = await dispatcher.dispatch("svc_call", {}, ctx)
            results.append(result)
            await anyio.sleep(result.retry_after_s or 0.001)

    async with anyio.create_task_group() as tg:
        for n in range(callers):
            tg.start_soon(caller, n)
    return results


@pytest.mark.serial  # the limit follows latency measured in ms
@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
async def test_the_limit_falls_when_the_service_saturates(anyio_backend: str, sync: bool) -> None:
    # 8 places at 10 ms; the limit starts at 20, where a call takes 6× as long. Windows
    # last ~50 ms: on a quiet machine the limit is down to 10-13 after ~0.5 s; on one loaded
    # 6× over (a baseline probed slow) it falls more slowly, and 1.2 s once left it at 16
    service = Crowded(capacity=8, base=0.01)
    dispatcher, events = build(
        service.run_sync if sync else service.run_async, adaptive_min=2, adaptive_max=40
    )
    results = await hammer(dispatcher, callers=30, seconds=2.0)
    seen = limits(events)
    assert seen and seen[0] <= 20
    assert max(seen[-5:]) <= 15, seen  # it settled near the service's capacity
    refused = [r for r in results if r.error_type is ErrorType.OVERLOADED]
    assert refused and all(r.ok for r in results if r.error_type is not ErrorType.OVERLOADED)
    assert all(r.retryable and r.retry_after_s is not None for r in refused)
    assert all(0 < r.retry_after_s <= 2.0 for r in refused if r.retry_after_s is not None)
    model = refused[-1].to_model()
    assert model["error_type"] == "overloaded" and model["retry_after_s"] > 0
    assert "adaptive limit" in model["message"]
    assert any(isinstance(e, ConcurrencyLimited) for e in events)
    # load shedding is not a failure of the service: fail_max=1 and the breaker is closed
    breaker = dispatcher.breakers.get("svc")
    assert breaker.state == "closed" and breaker.failures_recorded == 0
    assert service.peak <= 40 and service.in_flight == 0
    assert dispatcher.bulkhead.in_flight()["svc"] == 0  # every place given back


@pytest.mark.serial  # the limit follows latency measured in ms
async def test_the_limit_stays_up_for_a_service_with_room(anyio_backend: str) -> None:
    service = Crowded(capacity=1000, base=0.05)  # never crowded: latency stays flat
    dispatcher, events = build(service.run_async, adaptive_min=2, adaptive_max=40)
    # windows of ~0.1 s after a probe at 2, about one place more each: 25-30 after 1.5 s
    results = await hammer(dispatcher, callers=30, seconds=1.5)
    seen = limits(events)
    assert seen and max(seen[-3:]) > 20, seen  # it grew towards the callers' 30
    assert all(r.ok or r.error_type is ErrorType.OVERLOADED for r in results)


async def test_per_tenant_shares_still_bind(anyio_backend: str) -> None:
    release = anyio.Event()

    async def wait(args: dict[str, Any], ctx: AuthContext) -> dict[str, int]:
        await release.wait()
        return {"ok": 1}

    dispatcher, _ = build(wait, adaptive_min=4, adaptive_max=10, max_concurrent_per_tenant=2)
    a = AuthContext(user_id="a", tenant_id="A")
    b = AuthContext(user_id="b", tenant_id="B")
    results: list[ToolResult] = []

    async def call(ctx: AuthContext) -> None:
        results.append(await dispatcher.dispatch("svc_call", {}, ctx))

    async with anyio.create_task_group() as tg:
        tg.start_soon(call, a)
        tg.start_soon(call, a)
        await anyio.wait_all_tasks_blocked()
        third = await dispatcher.dispatch("svc_call", {}, a)
        assert third.error_type is ErrorType.OVERLOADED
        assert "your 2 calls" in third.to_model()["message"]
        tg.start_soon(call, b)  # another tenant still has room under the key's limit
        await anyio.wait_all_tasks_blocked()
        assert dispatcher.bulkhead.in_flight()["svc"] == 3
        release.set()
    assert len(results) == 3 and all(r.ok for r in results)


async def test_the_key_limit_binds_across_tenants(anyio_backend: str) -> None:
    release = anyio.Event()

    async def wait(args: dict[str, Any], ctx: AuthContext) -> dict[str, int]:
        await release.wait()
        return {"ok": 1}

    # the first window probes the baseline at adaptive_min: 3 places
    dispatcher, events = build(wait, adaptive_min=3, adaptive_max=10)
    async with anyio.create_task_group() as tg:
        for n in range(3):
            tg.start_soon(dispatcher.dispatch, "svc_call", {}, AuthContext(tenant_id=f"t{n}"))
        await anyio.wait_all_tasks_blocked()
        refused = await dispatcher.dispatch("svc_call", {}, AuthContext(tenant_id="t9"))
        release.set()
    assert refused.error_type is ErrorType.OVERLOADED and refused.retry_after_s is not None
    assert [(e.limit, e.in_flight) for e in events if isinstance(e, ConcurrencyLimited)] == [(3, 3)]


async def test_cancellations_do_not_move_the_limit(anyio_backend: str) -> None:
    slow = anyio.Event()

    async def handler(args: dict[str, Any], ctx: AuthContext) -> dict[str, int]:
        if args.get("hang"):
            await slow.wait()
        return {"ok": 1}

    dispatcher, events = build(handler, adaptive_min=5, adaptive_max=10)
    for _ in range(6):  # 30 cancelled calls: three windows' worth, if they counted
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                for _ in range(5):
                    tg.start_soon(dispatcher.dispatch, "svc_call", {"hang": True})
                await anyio.wait_all_tasks_blocked()
                scope.cancel()
    assert limits(events) == []
    assert dispatcher.bulkhead.in_flight()["svc"] == 0  # every place given back
    assert dispatcher.bulkhead.limits()["svc"] == 5  # still probing its baseline
    breaker = dispatcher.breakers.get("svc")
    assert breaker.failures_recorded == 0 and breaker.state == "closed"
    # answers do count: enough of them end the probe window
    with anyio.fail_after(5):
        while not limits(events):
            assert (await dispatcher.dispatch("svc_call", {})).ok
    assert limits(events)[0] == 10  # the start (20) within adaptive_max


async def test_timeouts_cut_the_limit(anyio_backend: str) -> None:
    hang = True

    async def handler(args: dict[str, Any], ctx: AuthContext) -> dict[str, int]:
        if hang:
            await anyio.sleep(5)
        return {"ok": 1}

    registry = ToolRegistry()
    registry.tool(
        name="svc_call", parameters={"type": "object"}, breaker_key="svc", timeout_s=0.02
    )(handler)
    events: list[Event] = []
    config = KeyPolicy(
        breaker=BreakerOptions(fail_max=10_000),
        retry=RetryOptions(max_attempts=1),
        bulkhead=BulkheadOptions(max_concurrent="adaptive", adaptive_min=2, adaptive_max=40),
    )
    dispatcher = Dispatcher(
        registry,
        DispatcherOptions(keys={"svc": config}, telemetry=False),
        audit=None,
        observers=[lambda inv, event: events.append(event)],
    )

    async def caller() -> None:
        for _ in range(30):
            result = await dispatcher.dispatch("svc_call", {})
            assert result.error_type in (ErrorType.TIMEOUT, ErrorType.OVERLOADED)

    async with anyio.create_task_group() as tg:
        tg.start_soon(caller)
        tg.start_soon(caller)
    assert limits(events) and set(limits(events)) == {2}  # still probing, at the minimum
    hang = False
    with anyio.fail_after(5):
        while len(set(limits(events))) == 1:
            assert (await dispatcher.dispatch("svc_call", {})).ok
    # each window of timeouts cut the limit (20 at the start) by 10 %
    assert 2 < limits(events)[-1] < 18, limits(events)


async def test_a_hedge_needs_a_place_under_the_current_limit(anyio_backend: str) -> None:
    requests = 0
    events: list[Event] = []

    def hedged_or_skipped() -> bool:
        return requests > 1 or any(
            isinstance(e, HedgeEnded) and e.result == "skipped" for e in events
        )

    async def slow(args: dict[str, Any], ctx: AuthContext) -> dict[str, int]:
        nonlocal requests
        requests += 1
        await wait_until(hedged_or_skipped)  # the primary outlasts the hedge's delay
        return {"ok": 1}

    registry = ToolRegistry()
    registry.tool(
        name="svc_call", parameters={"type": "object"}, breaker_key="svc", idempotent=True
    )(slow)
    for places, expected in ((1, 1), (2, 2)):
        requests = 0
        events.clear()
        config = KeyPolicy(
            retry=RetryOptions(max_attempts=1),
            hedge=HedgeOptions(after_s=0.05),
            bulkhead=BulkheadOptions(
                max_concurrent="adaptive", adaptive_min=places, adaptive_max=places
            ),
        )
        dispatcher = Dispatcher(
            registry,
            DispatcherOptions(keys={"svc": config}, telemetry=False),
            audit=None,
            observers=[lambda inv, event: events.append(event)],
        )
        result = await dispatcher.dispatch("svc_call", {})
        assert result.ok and requests == expected


def test_adaptive_settings() -> None:
    options = BulkheadOptions(max_concurrent="adaptive", adaptive_min=3, adaptive_max=30)
    assert options.max_places == 30
    assert BulkheadOptions(max_concurrent=7).max_places == 7
    with pytest.raises(SettingsError, match="adaptive_max must be ≥ adaptive_min"):
        BulkheadOptions(max_concurrent="adaptive", adaptive_min=10, adaptive_max=5)
    with pytest.raises(SettingsError, match="max_concurrent"):
        BulkheadOptions(max_concurrent="auto")  # type: ignore[arg-type]
    with pytest.raises(SettingsError, match="adaptive_min"):
        BulkheadOptions(adaptive_min=0)


def test_adaptive_in_the_config_file() -> None:
    data = {"keys": {"svc": {"bulkhead": {"max_concurrent": "adaptive", "adaptive_max": 50}}}}
    config = parse_config(data, None)
    svc = config.keys["svc"].bulkhead
    assert svc.max_concurrent == "adaptive" and (svc.adaptive_min, svc.adaptive_max) == (2, 50)
    bulkhead = {"max_concurrent": "adaptive", "adaptive_min": 9, "adaptive_max": 3}
    with pytest.raises(ConfigError, match=r"keys\.svc\.bulkhead\.adaptive_max"):
        parse_config({"keys": {"svc": {"bulkhead": bulkhead}}}, None)
