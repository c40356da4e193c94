"""The gateway's fast lane for ``tools/call`` answers exactly as the MCP SDK's server path
does, in both HTTP answer modes (``json_response`` and the SDK's default, SSE).

Each scenario runs twice against a real gateway on uvicorn, once with the lane and once
without (``Gateway.fast_lane = False``: every request through the SDK), over raw HTTP
(httpx, the wire the SDK's client speaks) after a real ``initialize`` handshake; statuses,
headers, bodies and server spans must match, and the lane must have served the calls it
should (``gateway.lane.served``). The SDK's own client checks the lane end to end.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from datetime import datetime
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

from helpers import wait_until
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
MODES = pytest.mark.parametrize("json_response", [True, False], ids=["json", "sse"])

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


def tools(started: list[str] | None = None) -> ToolRegistry:
    """The gateway's tools; ``slow`` appends to ``started`` as it starts (the call is in
    flight at the gateway)."""
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
        if started is not None:
            started.append("slow")
        await anyio.sleep(float(args.get("s", 0.5)))
        return "done"

    return registry


class Gw:
    """A gateway on in-memory span and metric exporters, serving over loopback HTTP."""

    def __init__(self, *, lane: bool, json_response: bool, limited: bool = False) -> None:
        self.json_response = json_response
        self.spans = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.started: list[str] = []  # the ``slow`` calls that reached their tool
        self.dispatcher = Dispatcher(
            tools(self.started),
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
    app, manager = gw.gateway.http_app(
        host="127.0.0.1", path="/mcp", json_response=gw.json_response, **options
    )
    async with anyio.create_task_group() as tg, manager.run():
        service = HttpService(app, "127.0.0.1", 0)
        await service.start(tg)
        gw.url = f"{service.url}/mcp"
        try:
            yield gw
        finally:
            await service.aclose()
            tg.cancel_scope.cancel()


async def handshake(
    http: httpx.AsyncClient,
    url: str,
    token: str | None = None,
    capabilities: dict[str, Any] | None = None,
) -> str:
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
            "capabilities": capabilities or {},
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


def message(body: bytes) -> Any:
    """The JSON-RPC message of an answer: a JSON body, or an SSE stream's one event."""
    if not body.startswith(b"event: "):
        return json.loads(body)
    events = [e for e in body.split(b"\r\n\r\n") if e.startswith(b"event: message")]
    assert len(events) == 1, body
    return json.loads(events[0].split(b"\r\ndata: ", 1)[1])


async def post(
    http: httpx.AsyncClient,
    url: str,
    session_id: str | None,
    body: bytes,
    headers: Mapping[str, str] | None = None,
    token: str | None = None,
) -> Exchange:
    """One POST; its status, headers (the session's id as ``<sid>``, not the process's
    ``toolrelay-replica`` tag) and body."""
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
        if k not in ("date", "toolrelay-replica")
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


async def run_calls(
    lane: bool, json_response: bool
) -> tuple[list[Exchange], list[dict[str, Any]], Gw]:
    async with (
        serving(Gw(lane=lane, json_response=json_response, limited=True)) as gw,
        httpx.AsyncClient(timeout=30) as http,
    ):
        session_id = await handshake(http, gw.url)
        answers = [await post(http, gw.url, session_id, body) for _, body in CALLS]
        over = [await post(http, gw.url, session_id, body) for body in [CALLS[-1][1]] * 2]
        return answers + over, server_spans(gw), gw


@MODES
async def test_calls_are_answered_byte_for_byte_as_the_sdk_answers_them(
    json_response: bool,
) -> None:
    sdk, sdk_spans, sdk_gw = await run_calls(False, json_response)
    fast, fast_spans, fast_gw = await run_calls(True, json_response)
    assert sdk_gw.served == 0
    assert fast_gw.served == len(CALLS) + 2  # every call went through the lane
    for (label, _), want, got in zip(CALLS, sdk, fast, strict=False):
        assert got == want, label
    assert fast == sdk
    # the answers are what each case is about (not two equal failures)
    assert all(status == 200 for status, _, _ in fast)
    kind = "application/json" if json_response else "text/event-stream"
    assert all(dict(headers)["content-type"] == kind for _, headers, _ in fast)
    bodies = [message(body) for _, _, body in fast]
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


def falls_through(json_response: bool) -> list[tuple[str, bytes, dict[str, str]]]:
    if json_response:
        return FALLS_THROUGH
    return [*FALLS_THROUGH, ("no SSE accepted", call(34, "echo", {"text": "a"}), ACCEPT_JSON)]


ACCEPT_JSON = {"Accept": "application/json"}


async def fallthrough_answers(lane: bool, json_response: bool) -> tuple[list[Exchange], Gw]:
    gw = Gw(lane=lane, json_response=json_response)
    async with serving(gw), httpx.AsyncClient(timeout=30) as http:
        session_id = await handshake(http, gw.url)
        answers = [
            await post(http, gw.url, session_id, body, headers)
            for _, body, headers in falls_through(json_response)
        ]
        # and after all that the session still serves, through the lane when it is on
        answers.append(await post(http, gw.url, session_id, call(40, "echo", {"text": "a"})))
        return answers, gw


@MODES
async def test_everything_else_is_left_to_the_sdk(json_response: bool) -> None:
    sdk, _ = await fallthrough_answers(False, json_response)
    fast, gw = await fallthrough_answers(True, json_response)
    assert gw.served == 1  # only the last, plain call
    cases = falls_through(json_response)
    for (label, _, _), want, got in zip(cases, sdk, fast, strict=False):
        assert got == want, label
    assert fast[-1] == sdk[-1] and fast[-1][0] == 200
    statuses = {label: got[0] for (label, _, _), got in zip(cases, fast, strict=False)}
    assert statuses["foreign Host"] == 421 and statuses["foreign Origin"] == 403
    assert statuses["no JSON accepted"] == 406 and statuses["unknown session"] == 404
    assert statuses.get("no SSE accepted", 406) == 406
    invalid = message(fast[0][2])
    assert invalid["id"] == 20 and invalid["error"]["code"] == -32602


@MODES
async def test_a_session_is_served_only_with_the_token_that_opened_it(
    json_response: bool,
) -> None:
    async with (
        serving(Gw(lane=True, json_response=json_response), verifier=Verifier()) as gw,
        httpx.AsyncClient(timeout=30) as http,
    ):
        session_id = await handshake(http, gw.url, token="token-a")
        body = call(1, "echo", {"text": "hi"})
        status, _, answered = await post(http, gw.url, session_id, body, token="token-a")
        assert status == 200 and gw.served == 1
        assert message(answered)["result"]["structuredContent"]["text"] == "hi"
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


@MODES
@pytest.mark.parametrize("lane", [True, False])
async def test_a_session_with_a_call_in_flight_is_not_reaped(
    lane: bool, json_response: bool
) -> None:
    gw = Gw(lane=lane, json_response=json_response)
    async with (
        serving(gw, max_sessions=1, verifier=Verifier()),
        httpx.AsyncClient(timeout=30) as http,
    ):
        busy = await handshake(http, gw.url, token="token-a")
        other = {**HEADERS, "Authorization": "Bearer token-b"}
        answers: list[Exchange] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(slow_call, http, gw.url, busy, 1.0, answers, "token-a")
            await wait_until(lambda: gw.started == ["slow"])  # the call is in flight
            refused = await http.post(gw.url, json=OPEN, headers=other)
        assert refused.status_code == 503
        status, _, body = answers[0]
        assert status == 200 and message(body)["result"]["content"][0]["text"] == "done"
        assert gw.served == (1 if lane else 0)
        # idle again (its call answered), it is the one closed to make room
        assert (await http.post(gw.url, json=OPEN, headers=other)).status_code == 200


def cancelled_calls(gw: Gw) -> float | None:
    """How many ``slow`` calls the gateway counted as cancelled."""
    labels = {"tool": "slow", "outcome": "cancelled"}
    return gw.metrics.registry.get_sample_value("toolrelay_mcp_tool_calls_total", labels)


async def closed_mid_call(lane: bool, json_response: bool) -> Exchange:
    gw = Gw(lane=lane, json_response=json_response)
    async with serving(gw), httpx.AsyncClient(timeout=30) as http:
        session_id = await handshake(http, gw.url)
        answers: list[Exchange] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(slow_call, http, gw.url, session_id, 20.0, answers)
            await wait_until(lambda: gw.started == ["slow"])  # the call is in flight
            headers = {**HEADERS, "mcp-session-id": session_id, "mcp-protocol-version": VERSION}
            assert (await http.delete(gw.url, headers=headers)).status_code == 200
        assert gw.served == (1 if lane else 0)
        assert cancelled_calls(gw) == 1
        return answers[0]


@MODES
async def test_closing_the_session_cancels_a_call_as_the_sdk_does(json_response: bool) -> None:
    sdk = await closed_mid_call(False, json_response)
    fast = await closed_mid_call(True, json_response)
    assert fast == sdk
    status, headers, body = fast
    if json_response:
        assert status == 500
        assert (
            message(body)["error"]["message"] == "Session terminated before the request completed"
        )
    else:  # the stream was open: it ends with no event
        assert status == 200 and dict(headers)["content-type"] == "text/event-stream"
        assert b"event:" not in body


@MODES
async def test_the_sdk_client_calls_through_the_lane(json_response: bool) -> None:
    async with (
        serving(Gw(lane=True, json_response=json_response)) as gw,
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


async def elicitation_capable(lane: bool, json_response: bool) -> tuple[list[Exchange], Gw]:
    gw = Gw(lane=lane, json_response=json_response)
    async with serving(gw), httpx.AsyncClient(timeout=30) as http:
        session_id = await handshake(http, gw.url, capabilities={"elicitation": {}})
        answers = [await post(http, gw.url, session_id, body) for _, body in CALLS[:3]]
        return answers, gw


@MODES
async def test_a_client_that_can_be_asked_is_served_by_the_sdk_over_sse(
    json_response: bool,
) -> None:
    """An approval may ask such a client mid-call, on the call's own SSE stream: the SDK
    serves it. In JSON mode nothing can ride the answer, so the lane serves it there."""
    sdk, _ = await elicitation_capable(False, json_response)
    fast, gw = await elicitation_capable(True, json_response)
    assert fast == sdk and all(status == 200 for status, _, _ in fast)
    assert gw.served == (3 if json_response else 0)


PING = re.compile(rb": ping - (\S+ \S+)\r\n\r\n")


async def long_call(lane: bool) -> bytes:
    gw = Gw(lane=lane, json_response=False)
    async with serving(gw), httpx.AsyncClient(timeout=30) as http:
        session_id = await handshake(http, gw.url)
        _, _, body = await post(http, gw.url, session_id, call(1, "slow", {"s": 0.7}))
        assert gw.served == (1 if lane else 0)
        return body


async def test_a_long_call_keeps_its_sse_stream_alive_with_the_sdks_pings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sse_starlette import EventSourceResponse

    from toolrelay.serve import fast_lane

    monkeypatch.setattr(fast_lane, "PING_S", 0.2)
    monkeypatch.setattr(EventSourceResponse, "DEFAULT_PING_INTERVAL", 0.2)
    for body in (await long_call(lane=False), await long_call(lane=True)):
        pings = PING.findall(body)
        assert len(pings) >= 2, body  # 0.7 s at one ping per 0.2 s
        assert all(datetime.fromisoformat(p.decode()).tzinfo is not None for p in pings)
        rest = PING.sub(b"", body)
        assert rest.startswith(b"event: message\r\ndata: ") and rest.endswith(b"\r\n\r\n")
        assert message(rest)["result"]["content"][0]["text"] == "done"


def cancel(request_id: int | str) -> bytes:
    params = {"requestId": request_id, "reason": "the user stopped it"}
    return json.dumps({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params})


async def cancelled_by_the_client(lane: bool, json_response: bool) -> tuple[Exchange, list[int]]:
    """A slow call the client cancels (``notifications/cancelled``) after another session,
    and another client on its session, tried to cancel the same request id: the answer,
    and the statuses of those two attempts."""
    gw = Gw(lane=lane, json_response=json_response)
    async with serving(gw, verifier=Verifier()), httpx.AsyncClient(timeout=30) as http:
        session_id = await handshake(http, gw.url, token="token-a")
        other = await handshake(http, gw.url, token="token-a")
        answers: list[Exchange] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(slow_call, http, gw.url, session_id, 20.0, answers, "token-a")
            await wait_until(lambda: gw.started == ["slow"])  # the call is in flight
            attempts = [
                await post(http, gw.url, other, cancel(1), token="token-a"),
                await post(http, gw.url, session_id, cancel(1), token="token-b"),
            ]
            await anyio.sleep(0.2)
            assert not answers  # neither touched the call
            status, _, _ = await post(http, gw.url, session_id, cancel("1"), token="token-a")
            assert status == 202  # "1" is request 1, as the SDK correlates ids
        assert gw.served == (1 if lane else 0)
        assert cancelled_calls(gw) == 1
        return answers[0], [status for status, _, _ in attempts]


@MODES
async def test_a_call_the_client_cancels_is_cancelled_and_answered_as_the_sdk_does(
    json_response: bool,
) -> None:
    sdk = await cancelled_by_the_client(False, json_response)
    with anyio.fail_after(10):  # the call sleeps 20 s unless cancelled
        fast = await cancelled_by_the_client(True, json_response)
    assert fast == sdk
    (status, _, body), attempts = fast
    assert status == 200 and attempts[0] == 202 and attempts[1] >= 400
    error = message(body)["error"]
    assert error == {"code": -32800, "message": "Request cancelled"}
