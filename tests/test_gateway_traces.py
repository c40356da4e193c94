"""One trace from an MCP client through ``toolrelay serve`` to an upstream MCP server, and
the semantic-convention histograms beside the Prometheus metrics.

The client is the MCP SDK's, sending ``traceparent`` in ``params._meta``; the upstream is a
real process (``servers/mcp_test_server.py``), which records the ``traceparent`` it is
sent. Over streamable HTTP the gateway runs in this process, on an SDK tracer provider
with an in-memory exporter and a meter provider with an in-memory reader; over stdio it is
``toolrelay serve`` as a subprocess, exporting its spans over OTLP/HTTP to a collector in
this test.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast

import anyio
import httpx2
import mcp.types as types
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client import CollectorRegistry

from toolrelay import Dispatcher, ToolRegistry
from toolrelay.serve.callers import Callers
from toolrelay.serve.gateway import Gateway
from toolrelay.serve.http import HttpService
from toolrelay.serve.metrics import GatewayMetrics
from toolrelay.serve.watch import ToolListWatcher
from toolrelay.sources.mcp import McpSource, McpSourceOptions

pytestmark = pytest.mark.anyio

SERVER = Path(__file__).parent / "servers" / "mcp_test_server.py"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"
TRACESTATE = "rojo=00f067aa0ba902b7"


def calls(record: Path) -> list[dict[str, Any]]:
    lines = record.read_text().splitlines() if record.exists() else []
    return [event for event in map(json.loads, lines) if event["event"] == "call"]


def parts(traceparent: str) -> tuple[str, str]:
    """The trace id and the parent span id of a W3C ``traceparent``."""
    version, trace_id, span_id, _flags = traceparent.split("-")
    assert version == "00"
    return trace_id, span_id


def meta() -> types.RequestParamsMeta:
    """``_meta`` with the client's trace context (an open map: the SDK passes it on)."""
    return cast("types.RequestParamsMeta", {"traceparent": TRACEPARENT, "tracestate": TRACESTATE})


# -- in process, over streamable HTTP --------------------------------------------------------
class InProcess:
    """A gateway on SDK providers with in-memory exporters, in front of an upstream."""

    def __init__(self, tmp: Path) -> None:
        self.record = tmp / "rec"
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.registry = ToolRegistry()
        self.dispatcher = Dispatcher(
            self.registry,
            metrics_registry=CollectorRegistry(),
            tracer_provider=self.tracer_provider,
            meter_provider=self.meter_provider,
        )
        metrics = GatewayMetrics(CollectorRegistry())
        callers = Callers(None)
        watcher = ToolListWatcher(self.dispatcher, [None], metrics)
        self.gateway = Gateway(self.dispatcher, callers, watcher, metrics)

    def histogram(self, name: str) -> list[HistogramDataPoint]:
        data = self.reader.get_metrics_data()
        assert data is not None
        return [
            point
            for resource in data.resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
            if metric.name == name
            for point in metric.data.data_points
            if isinstance(point, HistogramDataPoint)
        ]

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())


@asynccontextmanager
async def in_process(tmp: Path) -> AsyncIterator[tuple[InProcess, ClientSession]]:
    setup = InProcess(tmp)
    command = [sys.executable, str(SERVER), "--record", str(setup.record)]
    with (tmp / "upstream.err").open("a") as errlog:
        async with (
            McpSource.stdio(
                command, McpSourceOptions(breaker_key="up", prefix="up"), errlog=errlog
            ) as source,
            anyio.create_task_group() as tg,
        ):
            setup.registry.register(source)
            app, manager = setup.gateway.http_app(host="127.0.0.1", path="/mcp")
            async with manager.run():
                service = HttpService(app, "127.0.0.1", 0)
                await service.start(tg)
                try:
                    async with (
                        httpx2.AsyncClient(timeout=30.0) as http,
                        streamable_http_client(f"{service.url}/mcp", http_client=http) as (
                            read,
                            write,
                        ),
                        ClientSession(read, write) as session,
                    ):
                        await session.initialize()
                        yield setup, session
                finally:
                    await service.aclose()
                    tg.cancel_scope.cancel()


def by_name(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    found = [span for span in spans if span.name == name]
    assert len(found) == 1, [span.name for span in spans]
    return found[0]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the gateway serves on uvicorn
async def test_one_trace_runs_client_gateway_upstream_over_http(tmp_path: Path) -> None:
    async with in_process(tmp_path) as (setup, session):
        result = await session.call_tool("up__structured", {"n": 2}, meta=meta())
        assert result.is_error is not True
        listing = await session.list_tools()
        assert "up__structured" in {tool.name for tool in listing.tools}
    spans = setup.finished()
    server = by_name(spans, "tools/call up__structured")
    tool = by_name(spans, "execute_tool up__structured")
    # the server span continues the client's trace; execute_tool is its child
    assert server.kind is SpanKind.SERVER
    assert format(server.context.trace_id, "032x") == TRACE_ID
    assert server.parent is not None and server.parent.is_remote
    assert format(server.parent.span_id, "016x") == CLIENT_SPAN
    assert server.context.trace_state.get("rojo") == "00f067aa0ba902b7"
    assert tool.parent is not None and tool.parent.span_id == server.context.span_id
    assert tool.context.trace_id == server.context.trace_id
    attributes = dict(server.attributes or {})
    assert attributes["mcp.method.name"] == "tools/call"
    assert attributes["gen_ai.tool.name"] == "up__structured"
    assert attributes["gen_ai.operation.name"] == "execute_tool"
    assert attributes["network.transport"] == "tcp"
    assert attributes["network.protocol.name"] == "http"
    assert attributes["mcp.protocol.version"] == session.protocol_version
    assert isinstance(attributes["jsonrpc.request.id"], str)
    assert attributes["mcp.session.id"]  # a 2025-era session: the Mcp-Session-Id header
    assert "error.type" not in attributes
    assert server.status.status_code is StatusCode.UNSET
    # the upstream was sent the same trace, whose parent is a span of the gateway's
    (call,) = calls(setup.record)
    trace_id, parent = parts(call["trace"]["traceparent"])
    assert trace_id == TRACE_ID
    assert parent == format(tool.context.span_id, "016x")
    # other requests: spans named after the method, in no trace of the client's
    listed = [span for span in spans if span.name == "tools/list"]
    assert listed  # the client lists the tools itself too, for their output schemas
    for span in listed:
        assert span.kind is SpanKind.SERVER and span.parent is None
        assert "gen_ai.operation.name" not in dict(span.attributes or {})
    assert any(span.name == "initialize" for span in spans)
    # both histograms, with the conventions' attributes
    (tool_point,) = setup.histogram("gen_ai.execute_tool.duration")
    assert dict(tool_point.attributes or {}) == {
        "gen_ai.tool.name": "up__structured",
        "gen_ai.tool.type": "function",
    }
    assert tool_point.count == 1 and tool_point.explicit_bounds[0] == 0.01
    served = {
        (point.attributes or {})["mcp.method.name"]: point
        for point in setup.histogram("mcp.server.operation.duration")
    }
    assert {"initialize", "tools/call", "tools/list"} <= set(served)
    call_point = dict(served["tools/call"].attributes or {})
    assert call_point["gen_ai.tool.name"] == "up__structured"
    assert call_point["network.transport"] == "tcp"
    assert call_point["mcp.protocol.version"] == session.protocol_version
    assert "mcp.session.id" not in call_point and "jsonrpc.request.id" not in call_point
    assert "client.address" not in call_point
    assert served["tools/call"].count == 1
    assert served["tools/call"].sum >= tool_point.sum


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_failures_are_errors_on_the_spans_and_in_the_histograms(tmp_path: Path) -> None:
    async with in_process(tmp_path) as (setup, session):
        failed = await session.call_tool("up__fail", {}, meta=meta())
        assert failed.is_error is True
        unknown = await session.call_tool("nope", {}, meta=meta())
        assert unknown.is_error is True
        # a request the SDK refuses before any handler: a JSON-RPC error
        with pytest.raises(Exception, match=r"(?i)not found|invalid"):
            await session.send_request(
                types.GetPromptRequest(params=types.GetPromptRequestParams(name="p")),
                types.GetPromptResult,
            )
        # no traceparent: a trace of the gateway's own
        await session.call_tool("up__text", {"message": "hi"})
    spans = setup.finished()
    server = by_name(spans, "tools/call up__fail")
    assert dict(server.attributes or {})["error.type"] == "tool_error"
    assert "rpc.response.status_code" not in dict(server.attributes or {})
    assert server.status.status_code is StatusCode.ERROR
    tool = by_name(spans, "execute_tool up__fail")
    assert dict(tool.attributes or {})["error.type"] == "tool_error"
    assert format(server.context.trace_id, "032x") == TRACE_ID
    # a name nobody registered: the span's target is the client's name (capped), the
    # histogram's is the bounded label
    unknown_span = by_name(spans, "tools/call nope")
    assert dict(unknown_span.attributes or {})["error.type"] == "tool_error"
    prompt = by_name(spans, "prompts/get p")
    prompt_attributes = dict(prompt.attributes or {})
    assert prompt_attributes["gen_ai.prompt.name"] == "p"
    assert prompt_attributes["error.type"] == prompt_attributes["rpc.response.status_code"]
    assert prompt_attributes["error.type"] == str(types.METHOD_NOT_FOUND)
    assert prompt.status.status_code is StatusCode.ERROR
    own = by_name(spans, "tools/call up__text")
    assert own.parent is None and format(own.context.trace_id, "032x") != TRACE_ID
    (text_call,) = [call for call in calls(setup.record) if call["tool"] == "text"]
    assert parts(text_call["trace"]["traceparent"])[0] == format(own.context.trace_id, "032x")
    points = {
        (
            (point.attributes or {})["gen_ai.tool.name"],
            (point.attributes or {}).get("error.type"),
        ): point.count
        for point in setup.histogram("gen_ai.execute_tool.duration")
    }
    assert points == {
        ("up__fail", "tool_error"): 1,
        ("_unknown", "unknown_tool"): 1,
        ("up__text", None): 1,
    }
    served = [
        dict(point.attributes or {})
        for point in setup.histogram("mcp.server.operation.duration")
        if (point.attributes or {}).get("error.type") is not None
    ]
    assert {(s["mcp.method.name"], s["error.type"]) for s in served} == {
        ("tools/call", "tool_error"),
        ("prompts/get", str(types.METHOD_NOT_FOUND)),
    }


# -- toolrelay serve over stdio, spans over OTLP ----------------------------------------------
class Collector:
    """An OTLP/HTTP receiver: the spans and histograms ``toolrelay serve`` exports."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.histograms: dict[str, list[Any]] = {}
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path == "/v1/metrics":
                    metrics = ExportMetricsServiceRequest.FromString(body)
                    for resource_metrics in metrics.resource_metrics:
                        for scope_metrics in resource_metrics.scope_metrics:
                            for metric in scope_metrics.metrics:
                                points = collector.histograms.setdefault(metric.name, [])
                                points.extend(metric.histogram.data_points)
                else:
                    request = ExportTraceServiceRequest.FromString(body)
                    for resource in request.resource_spans:
                        for scope in resource.scope_spans:
                            collector.spans.extend(scope.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    @contextmanager
    def running(self) -> Iterator[Collector]:
        thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.server.shutdown()
            self.server.server_close()

    def exported(self) -> bool:
        """Has the tool call's span and histogram arrived (both are sent at shutdown)?"""
        return "gen_ai.execute_tool.duration" in self.histograms and any(
            span.name.startswith("execute_tool") for span in self.spans
        )

    def named(self, name: str) -> Any:
        found = [span for span in self.spans if span.name == name]
        assert len(found) == 1, [span.name for span in self.spans]
        return found[0]


def attributes_of(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in span.attributes:
        value = kv.value
        out[kv.key] = getattr(value, value.WhichOneof("value"))
    return out


async def test_one_trace_runs_client_gateway_upstream_over_stdio(tmp_path: Path) -> None:
    record = tmp_path / "rec"
    upstream = [sys.executable, str(SERVER), "--record", str(record)]
    with Collector().running() as collector:
        config = tmp_path / "toolrelay.toml"
        config.write_text(
            f"""
[telemetry]
otlp_endpoint = "{collector.url}/v1/traces"
otlp_metrics_endpoint = "{collector.url}/v1/metrics"
[serve]
transport = "stdio"
[serve.upstreams.test]
command = {json.dumps(upstream)}
breaker_key = "mcp-test"
prefix = "up"
"""
        )
        serve = [sys.executable, "-m", "toolrelay", "serve", "--config", str(config)]
        params = StdioServerParameters(command=serve[0], args=serve[1:], env=dict(os.environ))
        with (tmp_path / "serve.err").open("a") as errlog:
            async with (
                stdio_client(params, errlog=errlog) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                result = await session.call_tool("up__structured", {"n": 4}, meta=meta())
                assert result.is_error is not True
        # the gateway exits once stdin closes, exporting its spans on the way out
        with anyio.fail_after(20):
            while not collector.exported():  # noqa: ASYNC110
                await anyio.sleep(0.05)
    assert "Traceback" not in (tmp_path / "serve.err").read_text()
    server = collector.named("tools/call up__structured")
    tool = collector.named("execute_tool up__structured")
    assert server.trace_id.hex() == TRACE_ID and server.parent_span_id.hex() == CLIENT_SPAN
    assert server.kind == 2  # SPAN_KIND_SERVER
    assert tool.parent_span_id == server.span_id and tool.trace_id == server.trace_id
    attributes = attributes_of(server)
    assert attributes["network.transport"] == "pipe"
    assert attributes["mcp.method.name"] == "tools/call"
    assert attributes["gen_ai.tool.name"] == "up__structured"
    assert "mcp.session.id" not in attributes and "network.protocol.name" not in attributes
    (call,) = calls(record)
    assert parts(call["trace"]["traceparent"]) == (TRACE_ID, tool.span_id.hex())
    assert call["trace"]["tracestate"] == TRACESTATE
    (tool_point,) = collector.histograms["gen_ai.execute_tool.duration"]
    assert attributes_of(tool_point) == {
        "gen_ai.tool.name": "up__structured",
        "gen_ai.tool.type": "function",
    }
    served = {
        attributes_of(point)["mcp.method.name"]: attributes_of(point)
        for point in collector.histograms["mcp.server.operation.duration"]
    }
    assert served["tools/call"]["network.transport"] == "pipe"
    assert served["tools/call"]["gen_ai.tool.name"] == "up__structured"
    assert "initialize" in served
