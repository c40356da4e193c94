"""Spans (SDK in-memory exporter) and Prometheus metrics after known calls."""

from __future__ import annotations

import gc
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from helpers import OBJ, key_policy, wait_until
from toolrelay import (
    AuthContext,
    BreakerOptions,
    BulkheadOptions,
    Dispatcher,
    DispatcherOptions,
    KeyPolicy,
    RetryOptions,
    ToolCall,
    ToolError,
    ToolRegistry,
)
from toolrelay.telemetry import metrics as telemetry_metrics
from toolrelay.telemetry import serve_metrics
from toolrelay.telemetry.metrics import DURATION_BUCKETS, ExemplarGate

pytestmark = pytest.mark.anyio


class Service:
    def __init__(self) -> None:
        self.script: list[str] = []
        self.entered = 0

    async def __call__(self, args: dict[str, Any], ctx: AuthContext) -> Any:
        self.entered += 1
        step = self.script.pop(0) if self.script else "ok"
        if step == "fail":
            raise ToolError("upstream 503", retryable=True)
        if step == "hang":
            await anyio.sleep(30)
        if step == "slow":
            await anyio.sleep(0.35)  # past a slow_call_s of 0.3 s
        return {"city": args.get("city", "Oslo")}


def build(
    capture_content: bool = False,
) -> tuple[Dispatcher, Service, InMemorySpanExporter, CollectorRegistry]:
    registry = ToolRegistry()
    service = Service()
    registry.tool(
        name="get_weather",
        description="Current weather for a city.",
        parameters={"type": "object", "properties": {"city": {"type": "string"}}},
        breaker_key="open-meteo",
        # short for the tests of timeouts, yet long enough for an answer and a retry (fail,
        # fail) on a loaded machine (a stall of 0.5 s was seen there)
        timeout_s=1.0,
    )(service)  # type: ignore[arg-type]
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    metrics = CollectorRegistry()
    policy = KeyPolicy(
        breaker=BreakerOptions(fail_max=3),
        retry=RetryOptions(max_attempts=2, backoff_initial_s=0.001),
        bulkhead=BulkheadOptions(max_concurrent=4),
    )
    dispatcher = Dispatcher(
        registry,
        DispatcherOptions(keys={"open-meteo": policy}, capture_content=capture_content),
        tracer_provider=provider,
        metrics_registry=metrics,
    )
    return dispatcher, service, exporter, metrics


def value(metrics: CollectorRegistry, name: str, **labels: str) -> float:
    found = metrics.get_sample_value(name, labels)
    return 0.0 if found is None else found


def only(spans: tuple[ReadableSpan, ...]) -> ReadableSpan:
    assert len(spans) == 1, spans
    return spans[0]


# -- spans ------------------------------------------------------------------------------------
async def test_success_span_follows_genai_conventions() -> None:
    dispatcher, _, exporter, _ = build()
    provider_tracer = dispatcher.telemetry.tracer  # type: ignore[union-attr]
    with provider_tracer.start_as_current_span("host turn") as host:
        result = await dispatcher.dispatch("get_weather", '{"city": "Oslo"}', call_id="call_7")
    assert result.ok
    span = next(s for s in exporter.get_finished_spans() if s.name.startswith("execute_tool"))
    assert span.name == "execute_tool get_weather"
    assert span.kind is SpanKind.INTERNAL
    assert dict(span.attributes or {}) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "get_weather",
        "gen_ai.tool.call.id": "call_7",
        "gen_ai.tool.type": "function",
        "gen_ai.tool.description": "Current weather for a city.",
        "toolrelay.breaker_key": "open-meteo",
        "toolrelay.attempts": 1,
        "toolrelay.outcome": "ok",
    }
    assert span.status.status_code is StatusCode.UNSET
    assert span.parent is not None
    assert span.parent.span_id == host.get_span_context().span_id  # child of the host's span


async def test_handler_spans_are_children_of_the_call_span_and_the_context_is_restored() -> None:
    from opentelemetry import trace

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("plugin")
    registry = ToolRegistry()

    @registry.tool(name="fetch_async", parameters=OBJ)
    async def fetch_async(args: dict[str, Any], ctx: AuthContext) -> Any:
        with tracer.start_as_current_span("http GET async"):
            await anyio.sleep(0.001)
        return {}

    @registry.tool(name="fetch_sync", parameters=OBJ)
    def fetch_sync(args: dict[str, Any], ctx: AuthContext) -> Any:
        with tracer.start_as_current_span("http GET sync"):  # on a worker thread
            return {}

    dispatcher = Dispatcher(
        registry, tracer_provider=provider, metrics_registry=CollectorRegistry()
    )
    before = trace.get_current_span()
    for name in ("fetch_async", "fetch_sync"):
        assert (await dispatcher.dispatch(name, "{}")).ok
        assert trace.get_current_span() is before  # the call's span is no longer current
    spans = {s.name: s for s in exporter.get_finished_spans()}
    for kind in ("async", "sync"):
        call = spans[f"execute_tool fetch_{kind}"]
        child = spans[f"http GET {kind}"]
        assert child.parent is not None
        assert child.parent.span_id == call.context.span_id
        assert child.context.trace_id == call.context.trace_id


async def test_failure_span_has_error_type_status_and_retry_events() -> None:
    dispatcher, service, exporter, _ = build()
    service.script = ["fail", "fail"]
    result = await dispatcher.dispatch("get_weather", "{}", call_id="c1")
    assert result.error_type == "tool_error" and result.attempts == 2
    span = only(exporter.get_finished_spans())
    attributes = dict(span.attributes or {})
    assert attributes["error.type"] == "tool_error"
    assert attributes["toolrelay.outcome"] == "tool_error"
    assert attributes["toolrelay.attempts"] == 2
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == result.message
    names = [e.name for e in span.events]
    assert names == ["toolrelay.retry", "toolrelay.attempt"]
    assert dict(span.events[0].attributes or {})["toolrelay.attempt"] == 1


async def test_breaker_transition_and_unknown_tool_spans() -> None:
    dispatcher, service, exporter, _ = build()
    service.script = ["fail"] * 4
    await dispatcher.dispatch("get_weather", "{}")
    await dispatcher.dispatch("get_weather", "{}")  # third failure (across attempts) opens it
    tripping = exporter.get_finished_spans()[-1]
    assert [e.name for e in tripping.events][-1] == "toolrelay.breaker.transition"
    assert dict(tripping.events[-1].attributes or {})["toolrelay.breaker.to"] == "open"
    await dispatcher.dispatch("made_up_" + "x" * 500, "{}")
    unknown = exporter.get_finished_spans()[-1]
    assert unknown.name == "execute_tool _unknown"
    assert len(str(dict(unknown.attributes or {})["gen_ai.tool.name"])) <= 128


async def test_abandoned_worker_event() -> None:
    registry = ToolRegistry()
    release = threading.Event()

    # The deadline leaves a loaded machine time to start the thread: a job whose thread
    # starts after its deadline is skipped, not abandoned.
    @registry.tool(name="legacy", parameters=OBJ, timeout_s=0.5)
    def legacy(args: dict[str, Any], ctx: AuthContext) -> None:
        release.wait(10)

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    metrics = CollectorRegistry()
    dispatcher = Dispatcher(registry, tracer_provider=provider, metrics_registry=metrics)
    try:
        await dispatcher.dispatch("legacy", "{}")
        span = only(exporter.get_finished_spans())
        assert [e.name for e in span.events] == ["toolrelay.worker.abandoned"]
        assert value(metrics, "toolrelay_abandoned_workers", breaker_key="legacy") == 1
    finally:
        release.set()
    await wait_until(
        lambda: value(metrics, "toolrelay_abandoned_workers", breaker_key="legacy") == 0
    )


async def test_content_only_when_opted_in() -> None:
    dispatcher, _, exporter, _ = build()
    await dispatcher.dispatch("get_weather", '{"city": "Oslo"}')
    assert "gen_ai.tool.call.arguments" not in dict(
        exporter.get_finished_spans()[0].attributes or {}
    )
    opted, _, exporter2, _ = build(capture_content=True)
    await opted.dispatch("get_weather", '{"city": "Oslo"}')
    attributes = dict(exporter2.get_finished_spans()[0].attributes or {})
    assert attributes["gen_ai.tool.call.arguments"] == '{"city": "Oslo"}'
    assert attributes["gen_ai.tool.call.result"] == '{"city": "Oslo"}'


# -- metrics --------------------------------------------------------------------------------------
async def test_metric_values_after_known_calls() -> None:
    dispatcher, service, _, metrics = build()
    service.script = ["ok", "fail", "fail", "hang"]
    await dispatcher.dispatch("get_weather", "[]")
    assert (await dispatcher.dispatch("get_weather", "{}")).ok
    assert (await dispatcher.dispatch("get_weather", "{}")).error_type == "tool_error"
    assert (await dispatcher.dispatch("get_weather", "{}")).error_type == "timeout"
    await dispatcher.dispatch("nope", "{}")

    def calls(tool: str, outcome: str) -> float:
        return value(metrics, "toolrelay_tool_calls_total", tool=tool, outcome=outcome)

    assert calls("get_weather", "ok") == 1
    assert calls("get_weather", "tool_error") == 1
    assert calls("get_weather", "timeout") == 1
    assert calls("get_weather", "invalid_arguments") == 1
    assert calls("_unknown", "unknown_tool") == 1
    assert "nope" not in generate_latest(metrics).decode()
    count = "toolrelay_tool_call_duration_seconds_count"
    assert value(metrics, count, tool="get_weather", outcome="timeout") == 1
    assert (
        value(metrics, "toolrelay_tool_attempts_total", tool="get_weather", result="tool_error")
        == 2
    )
    assert value(metrics, "toolrelay_tool_attempts_total", tool="get_weather", result="ok") == 1
    assert value(metrics, "toolrelay_tool_retries_total", tool="get_weather") == 1
    assert value(metrics, "toolrelay_tool_inflight", tool="get_weather") == 0
    assert value(metrics, "toolrelay_deadline_overrun_seconds_count") == 1
    # in seconds (a bound of a few ms on overruns is test_cancellation's, a serial test)
    assert 0 <= value(metrics, "toolrelay_deadline_overrun_seconds_sum") < 1


async def test_breaker_metrics() -> None:
    dispatcher, service, _, metrics = build()
    service.script = ["fail"] * 3

    def states() -> dict[str, float]:
        return {
            s: value(metrics, "toolrelay_breaker_state", breaker_key="open-meteo", state=s)
            for s in ("closed", "open", "half_open")
        }

    await dispatcher.dispatch("get_weather", "{}")
    assert states() == {"closed": 1.0, "open": 0.0, "half_open": 0.0}
    await dispatcher.dispatch("get_weather", "{}")  # opens
    await dispatcher.dispatch("get_weather", "{}")  # rejected
    assert states() == {"closed": 0.0, "open": 1.0, "half_open": 0.0}
    assert (
        value(
            metrics,
            "toolrelay_breaker_transitions_total",
            breaker_key="open-meteo",
            from_state="closed",
            to_state="open",
        )
        == 1
    )
    assert value(metrics, "toolrelay_breaker_rejected_total", breaker_key="open-meteo") == 1
    dispatcher.breakers.force_close("open-meteo")
    assert states() == {"closed": 1.0, "open": 0.0, "half_open": 0.0}


async def test_bulkhead_rejections_and_slot_hold() -> None:
    dispatcher, service, _, metrics = build()
    service.script = ["hang"] * 4
    results = await dispatcher.dispatch_many([ToolCall("get_weather", "{}") for _ in range(6)])
    assert sorted(str(r.error_type) for r in results).count("overloaded") == 2
    assert value(metrics, "toolrelay_bulkhead_rejected_total", breaker_key="open-meteo") == 2
    async with dispatcher.model_slot(budget_s=7).hold():
        pass
    assert value(metrics, "toolrelay_slot_hold_seconds_count") == 1
    assert value(metrics, "toolrelay_slot_budget_seconds") == 7


async def test_registries_are_shared_and_exemplars_carry_trace_ids() -> None:
    dispatcher, _, _, metrics = build()
    other = Dispatcher(dispatcher.registry, metrics_registry=metrics)  # no duplicate error
    await dispatcher.dispatch("get_weather", "{}")
    await other.dispatch("get_weather", "{}")
    assert value(metrics, "toolrelay_tool_calls_total", tool="get_weather", outcome="ok") == 2
    text = generate_openmetrics(metrics).decode()
    assert '# {trace_id="' in text  # exemplar from the recording span


EXEMPLAR = re.compile(
    r'^toolrelay_tool_call_duration_seconds_bucket\{le="([^"]+)",outcome="([^"]+)",tool="[^"]+"\}'
    r' \S+ # \{trace_id="([0-9a-f]{32})"\}',
    re.M,
)


def exemplars(metrics: CollectorRegistry) -> dict[tuple[str, str], str]:
    """(outcome, bucket ``le``) → the trace id of the exemplar Prometheus would scrape."""
    text = generate_openmetrics(metrics).decode()
    return {(outcome, le): trace for le, outcome, trace in EXEMPLAR.findall(text)}


def trace_ids(exporter: InMemorySpanExporter) -> list[str]:
    return [format(s.context.trace_id, "032x") for s in exporter.get_finished_spans() if s.context]


def test_exemplar_gate_one_per_bucket_per_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(telemetry_metrics, "EXEMPLAR_INTERVAL_S", 1.0)
    gate = ExemplarGate()
    assert gate.due(0.004, now=100.0)  # a fresh bucket
    assert not gate.due(0.009, now=100.5)  # same bucket, within the interval
    assert not gate.due(DURATION_BUCKETS[0], now=100.9)  # ``le``: the bound is in it
    assert gate.due(0.011, now=100.9)  # the next bucket has had none
    assert gate.due(1e6, now=100.9)  # +Inf: slower than the last bound
    assert not gate.due(1e6, now=101.8)
    assert gate.due(0.001, now=101.0)  # the interval has passed
    assert not gate.due(0.001, now=101.5)
    assert gate.due(0.001, now=102.0)


async def test_exemplars_keep_the_first_call_of_a_bucket_within_the_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(telemetry_metrics, "EXEMPLAR_INTERVAL_S", 3600.0)
    dispatcher, service, exporter, metrics = build()
    for _ in range(5):
        assert (await dispatcher.dispatch("get_weather", "{}")).ok
    calls = trace_ids(exporter)
    found = exemplars(metrics)
    # every bucket keeps the first call that reached it: later ones attach no exemplar
    assert calls[0] in found.values()
    assert set(found.values()) <= set(calls)
    assert len(found) == len(set(found.values()))
    # a failure's outcome is a series of its own: its first call carries one at once
    service.script = ["fail", "fail"]
    assert (await dispatcher.dispatch("get_weather", "{}")).error_type == "tool_error"
    failed = [t for (outcome, _), t in exemplars(metrics).items() if outcome == "tool_error"]
    assert failed == [trace_ids(exporter)[-1]]
    assert exemplars(metrics).items() >= found.items()  # the ok series' are unchanged


async def test_exemplars_are_refreshed_after_the_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(telemetry_metrics, "EXEMPLAR_INTERVAL_S", 0.05)
    dispatcher, _, exporter, metrics = build()
    assert (await dispatcher.dispatch("get_weather", "{}")).ok
    await anyio.sleep(0.1)
    assert (await dispatcher.dispatch("get_weather", "{}")).ok
    assert trace_ids(exporter)[-1] in exemplars(metrics).values()


async def test_no_exemplar_without_a_recording_span() -> None:
    registry = ToolRegistry()
    registry.tool(name="t", parameters=OBJ)(Service())  # type: ignore[arg-type]
    metrics = CollectorRegistry()
    dispatcher = Dispatcher(registry, metrics_registry=metrics)  # no SDK: the API's no-op
    assert (await dispatcher.dispatch("t", "{}")).ok
    assert value(metrics, "toolrelay_tool_call_duration_seconds_count", tool="t", outcome="ok")
    assert exemplars(metrics) == {}


async def test_a_cancelled_call_ends_its_span_and_restores_the_context() -> None:
    from opentelemetry import trace

    dispatcher, service, exporter, metrics = build()
    service.script = ["hang"]
    before = trace.get_current_span()
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:
            tg.start_soon(dispatcher.dispatch, "get_weather", "{}")
            await wait_until(lambda: service.entered == 1)  # cancelled inside the handler
            scope.cancel()
    assert scope.cancelled_caught
    assert trace.get_current_span() is before
    span = only(exporter.get_finished_spans())  # ended, with no answer's attributes
    assert "toolrelay.outcome" not in dict(span.attributes or {})
    assert value(metrics, "toolrelay_tool_inflight", tool="get_weather") == 0
    assert "toolrelay_tool_calls_total{" not in generate_latest(metrics).decode()  # not counted


async def test_telemetry_can_be_switched_off() -> None:
    registry = ToolRegistry()
    registry.tool(name="t", parameters=OBJ)(Service())  # type: ignore[arg-type]
    metrics = CollectorRegistry()
    dispatcher = Dispatcher(registry, DispatcherOptions(telemetry=False), metrics_registry=metrics)
    assert (await dispatcher.dispatch("t", "{}")).ok
    assert dispatcher.telemetry is None
    assert "toolrelay_tool_calls_total" not in generate_latest(metrics).decode()


def test_serve_metrics_on_loopback() -> None:
    metrics = CollectorRegistry()
    registry = ToolRegistry()
    Dispatcher(registry, metrics_registry=metrics)
    server = serve_metrics(port=0, registry=metrics)
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        body = urllib.request.urlopen(url, timeout=5).read().decode()
        assert "toolrelay_breaker_storage_up 1.0" in body
    finally:
        server.shutdown()
        server.server_close()


WORKER = textwrap.dedent(
    """
    import anyio, sys
    from toolrelay import Dispatcher, ToolRegistry
    registry = ToolRegistry()

    @registry.tool(name="ping", parameters={"type": "object"})
    async def ping(args, ctx):
        return "pong"

    async def main():
        d = Dispatcher(registry)
        for _ in range(int(sys.argv[1])):
            await d.dispatch("ping", "{}")
    anyio.run(main)
    """
)
READER = textwrap.dedent(
    """
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    print(registry.get_sample_value("toolrelay_tool_calls_total",
                                    {"tool": "ping", "outcome": "ok"}))
    print(registry.get_sample_value("toolrelay_tool_inflight", {"tool": "ping"}))
    """
)


def test_multiprocess_mode_aggregates_two_processes(tmp_path: Path) -> None:
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(tmp_path))
    workers = [subprocess.Popen([sys.executable, "-c", WORKER, str(n)], env=env) for n in (7, 5)]
    assert [w.wait(60) for w in workers] == [0, 0]
    out = subprocess.run(
        [sys.executable, "-c", READER], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    assert float(out[0]) == 12.0
    assert out[1] in ("0.0", "None")  # livesum: dead processes drop out


ADDER_PIN = textwrap.dedent(
    """
    import sys
    from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
    from toolrelay.telemetry.metrics import adder

    def pin(registry, read):
        counter = Counter("pin", "Pinned.", ("l",), registry=registry).labels("a")
        gauge = Gauge(
            "pin_now", "Pinned.", ("l",), registry=registry, multiprocess_mode="livesum"
        ).labels("a")
        add_count, add_gauge = adder(counter), adder(gauge)
        fast = add_count != counter.inc and add_gauge != gauge.inc
        add_count(2)
        add_count(1.5)
        counter.inc()  # the public method and the fast path write the same value
        for amount in (1, 1, -1, 1, -1):
            add_gauge(amount)
        gauge.inc(2)
        text = generate_latest(read).decode()
        return fast, text

    if len(sys.argv) > 1:  # multiprocess mode: what the processes' files aggregate to
        from prometheus_client import multiprocess
        read = CollectorRegistry()
        multiprocess.MultiProcessCollector(read)
        fast, text = pin(None, read)
    else:
        registry = CollectorRegistry()
        fast, text = pin(registry, registry)
    print(fast)
    print(text)
    """
)


@pytest.mark.parametrize("mode", ["default", "multiprocess"])
def test_adder_writes_what_prometheus_client_reports(mode: str, tmp_path: Path) -> None:
    """Pins what ``adder`` (the dispatch path's fast ``inc``) relies on in prometheus-client:
    an amount added through it is the value a scrape reports, in both value modes."""
    env = dict(os.environ)
    env.pop("prometheus_multiproc_dir", None)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    argv = [sys.executable, "-c", ADDER_PIN]
    if mode == "multiprocess":
        env["PROMETHEUS_MULTIPROC_DIR"] = str(tmp_path)
        argv.append("multiprocess")
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout
    fast, text = out.split("\n", 1)
    assert 'pin_total{l="a"} 4.5' in text
    assert 'pin_now{l="a"} 3.0' in text
    # not a failure of behaviour, but of the measured speed-up: re-measure before removing it
    assert fast == "True", "prometheus-client moved its value store; adder now falls back"


# -- breaker window gauges (computed at scrape time) -------------------------------------------
def keyed(
    metrics: CollectorRegistry, **configs: KeyPolicy
) -> tuple[Dispatcher, dict[str, Service]]:
    """A dispatcher with one tool per breaker key (the tool is named after its key)."""
    registry = ToolRegistry()
    services = {key: Service() for key in configs}
    for key, service in services.items():
        registry.tool(name=key, parameters=OBJ, breaker_key=key, timeout_s=2)(service)  # type: ignore[arg-type]
    return Dispatcher(
        registry, DispatcherOptions(keys=configs), metrics_registry=metrics, audit=None
    ), services


def window(**kw: Any) -> KeyPolicy:
    return key_policy(
        **{"window": "count", "window_size": 10, "minimum_calls": 10, "max_attempts": 1, **kw}
    )


def sample(metrics: CollectorRegistry, name: str, key: str) -> float | None:
    return metrics.get_sample_value(f"toolrelay_breaker_{name}", {"breaker_key": key})


async def run(dispatcher: Dispatcher, service: Service, key: str, steps: list[str]) -> None:
    service.script = list(steps)
    for _ in steps:
        await dispatcher.dispatch(key, {})


async def test_window_rates_and_thresholds_are_read_at_scrape_time() -> None:
    metrics = CollectorRegistry()
    dispatcher, services = keyed(
        # slow_call_s well above what a loaded machine's stall adds to a quick call
        metrics,
        search=window(slow_call_s=0.3, slow_call_rate=0.9),
        legacy=KeyPolicy(),
    )
    await run(dispatcher, services["search"], "search", ["fail", "ok", "fail", "slow", "ok", "ok"])
    assert sample(metrics, "failure_rate", "search") == pytest.approx(2 / 6)
    assert sample(metrics, "slow_call_rate", "search") == pytest.approx(1 / 6)
    assert sample(metrics, "failure_rate_threshold", "search") == 0.5
    assert sample(metrics, "slow_call_rate_threshold", "search") == 0.9
    assert sample(metrics, "break_duration_seconds", "search") == 30.0
    assert sample(metrics, "break_duration_max_seconds", "search") is None  # cannot grow
    snapshot = dispatcher.breakers.snapshot()["search"]
    assert snapshot["failure_rate"] == pytest.approx(2 / 6, abs=1e-4)  # the same reading
    # the 10th call fills the window with 6 failures in 10: it opens, and a new window starts
    await run(dispatcher, services["search"], "search", ["fail"] * 4)
    assert value(metrics, "toolrelay_breaker_state", breaker_key="search", state="open") == 1
    assert sample(metrics, "failure_rate", "search") == 0.0
    # a consecutive-window key has a break but no rates
    await run(dispatcher, services["legacy"], "legacy", ["fail"])
    assert sample(metrics, "break_duration_seconds", "legacy") == 30.0
    for name in ("failure_rate", "slow_call_rate", "failure_rate_threshold"):
        assert sample(metrics, name, "legacy") is None, name


async def test_break_duration_doubles_after_each_failed_trial_up_to_its_maximum() -> None:
    metrics = CollectorRegistry()
    config = KeyPolicy(
        breaker=BreakerOptions(fail_max=1, reset_timeout_s=0.05, reset_timeout_max_s=0.2),
        retry=RetryOptions(max_attempts=1),
    )
    dispatcher, services = keyed(metrics, search=config)
    service = services["search"]

    def brk() -> float | None:
        return sample(metrics, "break_duration_seconds", "search")

    await run(dispatcher, service, "search", ["fail"])  # opens
    assert brk() == 0.05
    assert sample(metrics, "break_duration_max_seconds", "search") == 0.2
    for expected in (0.1, 0.2, 0.2):  # each failed trial doubles it, up to the maximum
        await anyio.sleep(brk() + 0.03)  # type: ignore[operator]
        await run(dispatcher, service, "search", ["fail"])
        assert value(metrics, "toolrelay_breaker_state", breaker_key="search", state="open") == 1
        assert brk() == expected
    await anyio.sleep(0.23)
    await run(dispatcher, service, "search", ["ok"])  # a successful trial closes it
    assert value(metrics, "toolrelay_breaker_state", breaker_key="search", state="closed") == 1
    assert brk() == 0.05


async def test_dispatchers_sharing_a_registry_are_all_reported_until_collected() -> None:
    metrics = CollectorRegistry()
    first, first_services = keyed(metrics, search=window())
    second, second_services = keyed(metrics, search=window(), mail=window(failure_rate=0.8))
    await run(first, first_services["search"], "search", ["fail", "ok", "ok", "ok"])
    await run(second, second_services["search"], "search", ["fail", "ok"])
    await run(second, second_services["mail"], "mail", ["ok"])
    assert sample(metrics, "failure_rate", "search") == 0.5  # a shared key: the highest
    assert sample(metrics, "failure_rate", "mail") == 0.0
    assert sample(metrics, "failure_rate_threshold", "mail") == 0.8
    del second, second_services
    gc.collect()
    assert sample(metrics, "failure_rate", "mail") is None
    assert sample(metrics, "break_duration_seconds", "mail") is None
    assert sample(metrics, "failure_rate", "search") == 0.25  # the first one's own window
    text = generate_latest(metrics).decode()
    assert "# TYPE toolrelay_breaker_failure_rate gauge" in text


async def test_time_window_rates_age_out_without_calls() -> None:
    metrics = CollectorRegistry()
    dispatcher, services = keyed(metrics, search=window(window="time", window_size=2))
    await run(dispatcher, services["search"], "search", ["fail"])
    assert sample(metrics, "failure_rate", "search") == 1.0
    await wait_until(lambda: sample(metrics, "failure_rate", "search") == 0.0, limit_s=4)
    await run(dispatcher, services["search"], "search", ["ok", "fail"])  # the window goes on
    assert sample(metrics, "failure_rate", "search") == 0.5


async def test_scraping_from_another_thread_while_calls_run() -> None:
    """A scrape only reads the breakers: racing the event loop, it never fails and keeps
    the rates in 0-1."""
    metrics = CollectorRegistry()
    dispatcher, services = keyed(
        metrics,
        counted=window(window_size=7, failure_rate=1.0),  # never opens: every third call is ok
        timed=window(window="time", window_size=1, failure_rate=1.0),
    )
    stop = threading.Event()
    problems: list[BaseException] = []
    readings: list[float] = []

    def scrape() -> None:
        while not stop.is_set():
            try:
                for key in ("counted", "timed"):
                    found = sample(metrics, "failure_rate", key)
                    if found is not None:
                        readings.append(found)
            except BaseException as exc:  # pragma: no cover - the failure we look for
                problems.append(exc)
                return

    thread = threading.Thread(target=scrape)
    thread.start()
    try:
        for i in range(300):
            key = "counted" if i % 2 else "timed"
            await run(dispatcher, services[key], key, ["fail" if i % 3 else "ok"])
    finally:
        stop.set()
        thread.join(5)
    assert problems == []
    assert readings and all(0.0 <= r <= 1.0 for r in readings)


BREAKER_WORKER = textwrap.dedent(
    """
    import sys, time
    import anyio
    import toolrelay.telemetry.breaker_gauges
    from toolrelay import (BreakerOptions, Dispatcher, DispatcherOptions, KeyPolicy,
                           RetryOptions, ToolError, ToolRegistry)

    toolrelay.telemetry.breaker_gauges.BREAKER_REFRESH_S = 0.05
    registry = ToolRegistry()
    failing = int(sys.argv[1])

    @registry.tool(name="search", parameters={"type": "object"}, breaker_key="search")
    async def search(args, ctx):
        if args.get("fail"):
            raise ToolError("503", retryable=True)
        return "ok"

    async def main():
        config = KeyPolicy(
            breaker=BreakerOptions(window="count", window_size=10, minimum_calls=10,
                                   reset_timeout_max_s=60),
            retry=RetryOptions(max_attempts=1))
        d = Dispatcher(registry, DispatcherOptions(keys={"search": config}), audit=None)
        for i in range(4):
            await d.dispatch("search", {"fail": i < failing})
        time.sleep(0.5)  # the refresher copies the readings into the gauges
    anyio.run(main)
    """
)
BREAKER_READER = textwrap.dedent(
    """
    from prometheus_client import CollectorRegistry, multiprocess
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    for name in ("failure_rate", "break_duration_seconds", "break_duration_max_seconds",
                 "failure_rate_threshold"):
        print(registry.get_sample_value("toolrelay_breaker_" + name, {"breaker_key": "search"}))
    """
)


def test_multiprocess_mode_breaker_gauges_take_the_worst_process(tmp_path: Path) -> None:
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(tmp_path))
    workers = [
        subprocess.Popen([sys.executable, "-c", BREAKER_WORKER, str(n)], env=env) for n in (1, 3)
    ]
    assert [w.wait(60) for w in workers] == [0, 0]
    out = subprocess.run(
        [sys.executable, "-c", BREAKER_READER], env=env, capture_output=True, text=True,
        check=True,
    ).stdout.split()  # fmt: skip
    assert [float(v) for v in out] == [0.75, 30.0, 60.0, 0.5]


# -- a blocking async handler -------------------------------------------------------------
async def test_an_async_handler_that_blocks_the_loop_is_counted_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``time.sleep`` (a sync client) in an ``async def`` holds the event loop: no deadline
    can fire. Its time is counted per tool, and the tool is named in the log once; a handler
    that waits as long without holding the loop is not counted."""
    registry = ToolRegistry()

    # The deadline passes while the loop is held; the checkpoint before must come ahead of
    # it, which on a loaded machine took over 0.05 s (the call was then cancelled there).
    @registry.tool(name="stall", parameters=OBJ, timeout_s=0.25)
    async def stall(args: dict[str, Any], ctx: AuthContext) -> str:
        await anyio.lowlevel.checkpoint()  # the second step holds the loop, not the first
        time.sleep(0.3)  # noqa: ASYNC251 - the blocking call under test
        return "late"

    @registry.tool(name="waits", parameters=OBJ)
    async def waits(args: dict[str, Any], ctx: AuthContext) -> str:
        await anyio.sleep(0.3)
        return "fine"

    metrics = CollectorRegistry()
    dispatcher = Dispatcher(registry, metrics_registry=metrics)
    quiet = Dispatcher(registry, DispatcherOptions(telemetry=False))
    with caplog.at_level("WARNING", logger="toolrelay"):
        answers = [await dispatcher.dispatch("stall", {}) for _ in range(2)]
        assert (await dispatcher.dispatch("waits", {})).data == "fine"
        await quiet.dispatch("stall", {})
    assert [a.data for a in answers] == ["late", "late"]  # answered, late: see deadlines.md
    blocked = value(metrics, "toolrelay_loop_blocked_seconds_total", tool="stall")
    assert 0.6 <= blocked < 1.2, blocked
    assert (
        metrics.get_sample_value("toolrelay_loop_blocked_seconds_total", {"tool": "waits"}) is None
    )
    logged = [r.getMessage() for r in caplog.records if "held the event loop" in r.getMessage()]
    assert len(logged) == 2 and all("stall" in line for line in logged), logged  # once each
