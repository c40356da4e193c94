"""Chaos faults through the whole pipeline: every kind, seeds, runtime changes."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from helpers import dispatcher_with
from toolrelay import (
    AuthContext,
    BreakerOptions,
    Dispatcher,
    ErrorType,
    Fault,
    KeyPolicy,
    RetryOptions,
    ToolCall,
    ToolRegistry,
)

pytestmark = pytest.mark.anyio


def build(*faults: Fault, seed: int | None = 7, **kw: Any) -> tuple[Dispatcher, list[int]]:
    registry = ToolRegistry()
    calls: list[int] = []

    @registry.tool(name="search", parameters={"type": "object"}, breaker_key="searxng",
                   timeout_s=0.2)  # fmt: skip
    async def search(args: dict[str, Any], ctx: AuthContext) -> Any:
        calls.append(1)
        return {"hits": 1}

    @registry.tool(name="weather", parameters={"type": "object"}, breaker_key="open-meteo")
    async def weather(args: dict[str, Any], ctx: AuthContext) -> Any:
        calls.append(2)
        return {"temp": 3}

    dispatcher = dispatcher_with(
        registry,
        faults=faults,
        fault_seed=seed,
        keys={
            "searxng": KeyPolicy(
                breaker=BreakerOptions(fail_max=3), retry=RetryOptions(max_attempts=1)
            )
        },
        metrics_registry=CollectorRegistry(),
        **kw,
    )
    return dispatcher, calls


async def test_error_fault_is_answered_as_the_plugin_would_and_opens_the_breaker() -> None:
    fault = Fault(kind="error", breaker_key="searxng", error_type="tool_error",
                  message="upstream 503 (injected)", retryable=True)  # fmt: skip
    dispatcher, calls = build(fault)
    results = [await dispatcher.dispatch("search", "{}") for _ in range(4)]
    assert results[0].to_model() == {
        "ok": False,
        "error_type": "tool_error",
        "message": "upstream 503 (injected)",
        "retryable": True,
    }
    assert [r.error_type for r in results] == [ErrorType.TOOL_ERROR] * 3 + [ErrorType.CIRCUIT_OPEN]
    assert calls == []  # the handler never ran
    assert (await dispatcher.dispatch("weather", "{}")).ok  # another key is untouched
    counter = dispatcher.telemetry.metrics.faults  # type: ignore[union-attr]
    injected = {
        (s.labels["tool"], s.labels["fault"]): s.value
        for metric in counter.collect()
        for s in metric.samples
        if s.name.endswith("_total")
    }
    assert injected == {("search", "error"): 3}


async def test_exception_hang_latency_and_bad_output() -> None:
    dispatcher, calls = build(Fault(kind="exception", tool="weather"))
    result = await dispatcher.dispatch("weather", "{}")
    assert result.error_type is ErrorType.TOOL_ERROR
    assert result.message == "weather failed unexpectedly (InjectedFault)"

    dispatcher, calls = build(Fault(kind="hang", tool="search"))
    result = await dispatcher.dispatch("search", "{}")
    assert result.error_type is ErrorType.TIMEOUT and calls == []

    # weather: its deadline (10 s) leaves a loaded machine room for 0.05 s of latency
    dispatcher, calls = build(Fault(kind="latency", tool="weather", latency_s=0.05))
    assert (await dispatcher.dispatch("weather", "{}")).ok and calls == [2]
    assert (await dispatcher.dispatch("weather", "{}")).duration_s >= 0.05

    dispatcher, calls = build(Fault(kind="latency", tool="search", latency_s=5))
    assert (await dispatcher.dispatch("search", "{}")).error_type is ErrorType.TIMEOUT

    dispatcher, calls = build(Fault(kind="bad_output", tool="weather"))
    result = await dispatcher.dispatch("weather", "{}")
    assert result.error_type is ErrorType.INVALID_OUTPUT and calls == []


async def test_a_seed_reproduces_the_same_injections() -> None:
    def pattern(seed: int) -> list[bool]:
        return [r.ok for r in runs[seed]]

    runs = {}
    for seed in (1, 1, 2):
        fault = Fault(kind="error", tool="weather", rate=0.5, retryable=False)
        dispatcher, _ = build(fault, seed=seed)
        calls = [ToolCall("weather", "{}") for _ in range(40)]
        results = [await dispatcher.dispatch(c.name, c.arguments) for c in calls]
        if seed in runs:
            assert [r.ok for r in results] == pattern(seed)
        runs[seed] = results
    assert pattern(1) != pattern(2)
    assert 5 < sum(pattern(1)) < 35  # about half


async def test_faults_change_at_runtime() -> None:
    dispatcher, _ = build()
    assert not dispatcher.faults
    assert (await dispatcher.dispatch("weather", "{}")).ok
    fault_id = dispatcher.faults.add(Fault(kind="error", tool="weather", retryable=False))
    assert not (await dispatcher.dispatch("weather", "{}")).ok
    assert list(dispatcher.faults.list()) == [fault_id]
    assert dispatcher.faults.remove(fault_id) and not dispatcher.faults.remove(fault_id)
    assert (await dispatcher.dispatch("weather", "{}")).ok
    dispatcher.faults.add(Fault(kind="hang", breaker_key="open-meteo"))
    dispatcher.faults.clear()
    assert (await dispatcher.dispatch("weather", "{}")).ok


@pytest.mark.parametrize(
    "bad",
    [
        {"kind": "explode", "tool": "x"},
        {"kind": "error"},
        {"kind": "error", "tool": "x", "breaker_key": "y"},
        {"kind": "error", "tool": "x", "rate": 1.5},
        {"kind": "latency", "tool": "x", "latency_s": -1},
        {"kind": "error", "tool": "x", "error_type": "oops"},
    ],
)
def test_bad_faults_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 (each case has its own message)
        Fault.from_dict(bad)


def test_fault_round_trips_through_a_dict() -> None:
    fault = Fault(kind="latency", breaker_key="k", latency_s=0.5, jitter_s=0.1, rate=0.25)
    assert Fault.from_dict(fault.to_dict()) == fault
    with pytest.raises(ValueError, match="unknown fault settings"):
        Fault.from_dict({"kind": "hang", "tool": "x", "colour": "red"})


async def test_each_injection_is_a_span_event() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    fault = Fault(kind="latency", tool="weather", latency_s=0.001)
    dispatcher, _ = build(fault, tracer_provider=provider)
    assert (await dispatcher.dispatch("weather", "{}")).ok
    (span,) = exporter.get_finished_spans()
    (event,) = [e for e in span.events if e.name == "toolrelay.fault"]
    assert dict(event.attributes or {}) == {"toolrelay.fault": "latency"}
