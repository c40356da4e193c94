"""The gateway's fast lane for ``tools/call`` (JSON-response HTTP mode) answers exactly as
the MCP SDK's server path does.

Each scenario runs twice against a real gateway on uvicorn, once with the lane and once
without (``Gateway.fast_lane = False``: every request through the SDK), over raw HTTP
(httpx, the wire the SDK's client speaks) after a real ``initialize`` handshake; statuses,
headers, bodies and server spans must match, and the lane must have served the calls it
should (``gateway.lane.served``). The SDK's own client checks the lane end to end.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.server.auth.provider import AccessToken
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from toolrelay import AuthContext, Dispatcher, ToolRegistry
from toolrelay.serve.callers import Callers
from toolrelay.serve.client_limits import ClientLimit, ClientLimits
from toolrelay.serve.gateway import Gateway
from toolrelay.serve.http import HttpService
from toolrelay.serve.metrics import GatewayMetrics
from toolrelay.serve.watch import ToolListWatcher

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.parametrize("anyio_backend", ["asyncio"]),  # the gateway serves on uvicorn
]

VERSION = "2025-06-18"
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
BURST = 8
"""Calls a client may make before its (never refilling) token bucket refuses it."""
TOKENS = {"token-a": "alice", "token-b": "bob"}


class Verifier:
    """Bearer tokens of two clients (the SDK's ``TokenVerifier`` protocol)."""

    async def verify_token(self, token: str) -> AccessToken | None:
        client = TOKENS.get(token)
        if client is None:
            return None
        return AccessToken(token=token, client_id=client, scopes=[], expires_at=None)


def tools() -> ToolRegistry:
    registry = ToolRegistry()
    params = {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
        "additionalProperties": False,
    }

    @registry.tool(name="echo", parameters=params)
    def echo(args: dict[str, Any], ctx: AuthContext) -> dict[str, Any]:
        return {"text": args["text"], "caller": ctx.user_id}

    @registry.tool(name="shout", parameters=params, output_schema={"type": "object"})
    def shout(args: dict[str, Any], ctx: AuthContext) -> str:
        return args["text"].upper() + " ünïcode"  # breaks its output schema

    @registry.tool(name="boom", parameters={"type": "object"})
    def boom(args: dict[str, Any], ctx: AuthContext) -> None:
        raise RuntimeError("the tool failed")

    @registry.tool(name="slow", parameters={"type": "object"}, timeout_s=30)
    async def slow(args: dict[str, Any], ctx: AuthContext) -> str:
        await anyio.sleep(float(args.get("s", 0.5)))
        return "done"

    return registry


class Gw:
    """A gateway on in-memory span and metric exporters, serving over loopback HTTP."""

    def __init__(self, *, lane: bool, limited: bool = False) -> None:
        self.spans = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.dispatcher = Dispatcher(
            tools(),
            metrics_registry=CollectorRegistry(),
            tracer_provider=provider,
            meter_provider=MeterProvider(metric_readers=[self.reader]),
        )
        self.metrics = GatewayMetrics(CollectorRegistry())
        # a bucket that never refills (a fixed clock): BURST calls pass, then each is refused
        limits = ClientLimits(
            ClientLimit(rate_per_s=0.5, burst=BURST) if limited else ClientLimit(),
            clock=lambda: 1000.0,
        )
        watcher = ToolListWatcher(self.dispatcher, [None], self.metrics)
        self.gateway = Gateway(self.dispatcher, Callers(None), watcher, self.metrics, limits=limits)
        self.gateway.fast_lane = lane
        self.url = ""

    @property
    def served(self) -> int:
        assert self.gateway.lane is not None
        return self.gateway.lane.served

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())

    def durations(self) -> list[HistogramDataPoint]:
        data = self.reader.get_metrics_data()
        assert data is not None
        return [
            point
            for resource in data.resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
            if metric.name == "mcp.server.operation.duration"
            for point in metric.data.data_points
            if isinstance(point, HistogramDataPoint)
        ]


@asynccontextmanager
async def serving(gw: Gw, **options: Any) -> AsyncIterator[Gw]:
    app, manager = gw.gateway.http_app(host="127.0.0.1", path="/mcp", json_response=True, **options)
    async with anyio.create_task_group() as tg, manager.run():
        service = HttpService(app, "127.0.0.1", 0)
        await service.start(tg)
        gw.url = f"{service.url}/mcp"
        try:
            yield gw
        finally:
            await service.aclose()
            tg.cancel_scope.cancel()


async def handshake(http: httpx.AsyncClient, url: str, token: str | None = None) -> str:
    """Open a session (``initialize`` + ``notifications/initialized``): its id."""
    headers = dict(HEADERS)
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    init = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": VERSION,
            "capabilities": {},
            "clientInfo": {"name": "lane-test", "version": "1"},
        },
    }
    opened = await http.post(url, json=init, headers=headers)
    assert opened.status_code == 200, opened.text
    session_id = opened.headers["mcp-session-id"]
    headers |= {"mcp-session-id": session_id, "mcp-protocol-version": VERSION}
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert (await http.post(url, json=note, headers=headers)).status_code == 202
    return session_id


def call(request_id: int | str, name: str, arguments: Any = None, **params: Any) -> bytes:
    body: dict[str, Any] = {"name": name, **params}
    if arguments is not None:
        body["arguments"] = arguments
    message = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": body}
    return json.dumps(message).encode()


Exchange = tuple[int, list[tuple[str, str]], bytes]


async def post(
    http: httpx.AsyncClient,
    url: str,
    session_id: str | None,
    body: bytes,
    headers: Mapping[str, str] | None = None,
    token: str | None = None,
) -> Exchange:
    """One POST; its status, headers (the session's id as ``<sid>``) and body."""
    sent = {**HEADERS, "mcp-protocol-version": VERSION}
    if session_id is not None:
        sent["mcp-session-id"] = session_id
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    sent |= headers or {}
    sent = {k: v for k, v in sent.items() if v}
    response = await http.post(url, content=body, headers=sent)
    shown = [
        (k, "<sid>" if session_id is not None and v == session_id else v)
        for k, v in response.headers.multi_items()
        if k != "date"
    ]
    return response.status_code, shown, response.content


def shape(span: ReadableSpan) -> dict[str, Any]:
    """What a server span says, without what differs from run to run."""
    attributes = {
        k: v
        for k, v in (span.attributes or {}).items()
        if k not in ("client.port", "mcp.session.id")
    }
    parent = span.parent
    return {
        "name": span.name,
        "kind": span.kind,
        "status": (span.status.status_code, span.status.description),
        "attributes": attributes,
        "session": "mcp.session.id" in (span.attributes or {}),
        "parent": None if parent is None else (parent.trace_id, parent.span_id),
        "children": [],
    }


def server_spans(gw: Gw) -> list[dict[str, Any]]:
    spans = gw.finished()
    shown = []
    for span in spans:
        if span.attributes and "mcp.method.name" in span.attributes:
            entry = shape(span)
            entry["children"] = sorted(
                child.name
                for child in spans
                if child.parent is not None and child.parent.span_id == span.context.span_id
            )
            if span.attributes["mcp.method.name"] == "tools/call":
                shown.append(entry)
    return shown


CALLS: list[tuple[str, bytes]] = [
    ("success", call(1, "echo", {"text": "hi"})),
    ("string id", call("req-2", "echo", {"text": "ünï"})),
    ("tool error", call(3, "boom", {})),
    ("invalid output", call(4, "shout", {"text": "x"})),
    ("unknown tool", call(5, "nope", {})),
    ("bad arguments", call(6, "echo", {"text": 7})),
    ("no arguments", call(7, "boom")),
    ("traceparent", call(8, "echo", {"text": "t"}, _meta={"traceparent": TRACEPARENT})),
    ("over the limit", call(9, "echo", {"text": "late"})),
]
"""Calls the lane serves (the first BURST-and-more pass the client limit, the last not)."""

FALLS_THROUGH: list[tuple[str, bytes, dict[str, str]]] = [
    ("arguments not an object", call(20, "echo", [1, 2]), {}),
    ("name missing", json.dumps({"jsonrpc": "2.0", "id": 21, "method": "tools/call",
                                 "params": {"arguments": {}}}).encode(), {}),
    ("name not a string", call(22, 5, {}), {}),
    ("params missing", b'{"jsonrpc":"2.0","id":23,"method":"tools/call"}', {}),
    ("extra key", b'{"jsonrpc":"2.0","id":24,"method":"tools/call","params":{"name":"echo"'
                  b',"arguments":{"text":"a"}},"x":1}', {}),
    ("batch", b'[' + call(25, "echo", {"text": "a"}) + b']', {}),
    ("malformed JSON", b'{"jsonrpc":"2.0","id":26,', {}),
    ("a float id", b'{"jsonrpc":"2.0","id":2.5,"method":"tools/call","params":{}}', {}),
    ("a notification", b'{"jsonrpc":"2.0","method":"tools/call","params":{"name":"echo"}}', {}),
    ("not tools/call", b'{"jsonrpc":"2.0","id":27,"method":"tools/list"}', {}),
    ("no JSON accepted", call(28, "echo", {"text": "a"}), {"Accept": "text/event-stream"}),
    ("wrong content type", call(29, "echo", {"text": "a"}), {"Content-Type": "text/plain"}),
    ("foreign Host", call(30, "echo", {"text": "a"}), {"Host": "evil.example:80"}),
    ("foreign Origin", call(31, "echo", {"text": "a"}), {"Origin": "http://evil.example"}),
    ("unknown protocol version", call(32, "echo", {"text": "a"}),
     {"mcp-protocol-version": "1999-01-01"}),
    ("unknown session", call(33, "echo", {"text": "a"}), {"mcp-session-id": "nope"}),
]  # fmt: skip
"""Requests the lane must leave to the SDK (each answered as the SDK answers it)."""


async def run_calls(lane: bool) -> tuple[list[Exchange], list[dict[str, Any]], Gw]:
    async with (
        serving(Gw(lane=lane, limited=True)) as gw,
        httpx.AsyncClient(timeout=30) as http,
    ):
        session_id = await handshake(http, gw.url)
        answers = [await post(http, gw.url, session_id, body) for _, body in CALLS]
        over = [await post(http, gw.url, session_id, body) for body in [CALLS[-1][1]] * 2]
        return answers + over, server_spans(gw), gw


async def test_calls_are_answered_byte_for_byte_as_the_sdk_answers_them() -> None:
    sdk, sdk_spans, sdk_gw = await run_calls(lane=False)
    fast, fast_spans, fast_gw = await run_calls(lane=True)
    assert sdk_gw.served == 0
    assert fast_gw.served == len(CALLS) + 2  # every call went through the lane
    for (label, _), want, got in zip(CALLS, sdk, fast, strict=False):
        assert got == want, label
    assert fast == sdk
    # the answers are what each case is about (not two equal failures)
    bodies = [json.loads(body) for _, _, body in fast]
    assert bodies[0]["result"]["structuredContent"] == {"text": "hi", "caller": None}
    assert bodies[1]["id"] == "req-2"
    envelopes = [json.loads(b["result"]["content"][0]["text"]) for b in bodies[2:]]
    kinds = [e.get("error_type") for e in envelopes]
    assert kinds[:4] == ["tool_error", "invalid_output", "unknown_tool", "validation_error"]
    assert kinds[4] == "tool_error" and kinds[5] is None
    assert [e["error_type"] for e in envelopes[-3:]] == ["overloaded"] * 3
    assert envelopes[-1]["retry_after_s"] > 0
    # the same server spans (parents, attributes, children, statuses) ...
    assert fast_spans == sdk_spans
    traced = [span for span in fast_spans if span["attributes"].get("jsonrpc.request.id") == "8"]
    assert traced[0]["parent"] == (
        int("4bf92f3577b34da6a3ce929d0e0e4736", 16),
        int("00f067aa0ba902b7", 16),
    )
    assert traced[0]["children"] == ["execute_tool echo"]
    assert all(span["session"] for span in fast_spans)
    assert {s["status"][0].name for s in fast_spans} == {"UNSET", "ERROR"}

    # ... and the same duration observations
    def observed(gw: Gw) -> list[tuple[Any, int]]:
        points = gw.durations()
        return sorted(
            (sorted((p.attributes or {}).items()), p.count)
            for p in points
            if (p.attributes or {}).get("mcp.method.name") == "tools/call"
        )

    assert observed(fast_gw) == observed(sdk_gw) != []


async def fallthrough_answers(lane: bool) -> tuple[list[Exchange], Gw]:
    async with serving(Gw(lane=lane)) as gw, httpx.AsyncClient(timeout=30) as http:
        session_id = await handshake(http, gw.url)
        answers = [
            await post(http, gw.url, session_id, body, headers)
            for _, body, headers in FALLS_THROUGH
        ]
        # and after all that the session still serves, through the lane when it is on
        answers.append(await post(http, gw.url, session_id, call(40, "echo", {"text": "a"})))
        return answers, gw


async def test_everything_else_is_left_to_the_sdk() -> None:
    sdk, _ = await fallthrough_answers(lane=False)
    fast, gw = await fallthrough_answers(lane=True)
    assert gw.served == 1  # only the last, plain call
    for (label, _, _), want, got in zip(FALLS_THROUGH, sdk, fast, strict=False):
        assert got == want, label
    assert fast[-1] == sdk[-1] and fast[-1][0] == 200
    statuses = {label: got[0] for (label, _, _), got in zip(FALLS_THROUGH, fast, strict=False)}
    assert statuses["foreign Host"] == 421 and statuses["foreign Origin"] == 403
    assert statuses["no JSON accepted"] == 406 and statuses["unknown session"] == 404
    invalid = json.loads(fast[0][2])
    assert invalid["id"] == 20 and invalid["error"]["code"] == -32602


async def test_a_session_is_served_only_with_the_token_that_opened_it() -> None:
    async with (
        serving(Gw(lane=True), verifier=Verifier()) as gw,
        httpx.AsyncClient(timeout=30) as http,
    ):
        session_id = await handshake(http, gw.url, token="token-a")
        body = call(1, "echo", {"text": "hi"})
        status, _, answered = await post(http, gw.url, session_id, body, token="token-a")
        assert status == 200 and gw.served == 1
        assert json.loads(answered)["result"]["structuredContent"]["text"] == "hi"
        status, _, answered = await post(http, gw.url, session_id, body, token="token-b")
        assert status == 404 and b"Session not found" in answered
        status, _, _ = await post(http, gw.url, session_id, body)
        assert status == 401
        assert gw.served == 1


OPEN = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": VERSION,
        "capabilities": {},
        "clientInfo": {"name": "other", "version": "1"},
    },
}


async def slow_call(
    http: httpx.AsyncClient,
    url: str,
    sid: str,
    s: float,
    out: list[Exchange],
    token: str | None = None,
) -> None:
    out.append(await post(http, url, sid, call(1, "slow", {"s": s}), token=token))


@pytest.mark.parametrize("lane", [True, False])
async def test_a_session_with_a_call_in_flight_is_not_reaped(lane: bool) -> None:
    async with (
        serving(Gw(lane=lane), max_sessions=1, verifier=Verifier()) as gw,
        httpx.AsyncClient(timeout=30) as http,
    ):
        busy = await handshake(http, gw.url, token="token-a")
        other = {**HEADERS, "Authorization": "Bearer token-b"}
        answers: list[Exchange] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(slow_call, http, gw.url, busy, 1.0, answers, "token-a")
            await anyio.sleep(0.3)
            refused = await http.post(gw.url, json=OPEN, headers=other)
        assert refused.status_code == 503
        status, _, body = answers[0]
        assert status == 200 and json.loads(body)["result"]["content"][0]["text"] == "done"
        assert gw.served == (1 if lane else 0)
        # idle again (its call answered), it is the one closed to make room
        assert (await http.post(gw.url, json=OPEN, headers=other)).status_code == 200


async def closed_mid_call(lane: bool) -> tuple[int, dict[str, Any]]:
    async with serving(Gw(lane=lane)) as gw, httpx.AsyncClient(timeout=30) as http:
        session_id = await handshake(http, gw.url)
        answers: list[Exchange] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(slow_call, http, gw.url, session_id, 20.0, answers)
            await anyio.sleep(0.3)
            headers = {**HEADERS, "mcp-session-id": session_id, "mcp-protocol-version": VERSION}
            assert (await http.delete(gw.url, headers=headers)).status_code == 200
        assert gw.served == (1 if lane else 0)
        labels = {"tool": "slow", "outcome": "cancelled"}
        cancelled = gw.metrics.registry.get_sample_value("toolrelay_mcp_tool_calls_total", labels)
        assert cancelled == 1
        status, _, body = answers[0]
        return status, json.loads(body)


async def test_closing_the_session_cancels_a_call_as_the_sdk_does() -> None:
    sdk = await closed_mid_call(lane=False)
    fast = await closed_mid_call(lane=True)
    assert fast == sdk
    assert fast[0] == 500
    assert fast[1]["error"]["message"] == "Session terminated before the request completed"


async def test_the_sdk_client_calls_through_the_lane() -> None:
    async with (
        serving(Gw(lane=True)) as gw,
        httpx2.AsyncClient(timeout=30) as http,
        streamable_http_client(gw.url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        ok = await session.call_tool("echo", {"text": "hi"})
        failed = await session.call_tool("boom", {})
        assert ok.structured_content == {"text": "hi", "caller": None}
        assert failed.is_error and "tool_error" in str(failed.content[0])
        assert gw.served == 2
