"""A fast lane for ``tools/call`` over streamable HTTP.

The MCP SDK serves one ``tools/call`` POST through its whole session machinery (pydantic
parses, memory streams to and from the session's task, its middleware, and in SSE mode
four tasks of ``sse_starlette``'s). :class:`FastLane` serves the common case in the
request's own task instead, with the same checks and the same answer, byte for byte;
anything it does not serve (the conditions: :meth:`FastLane._serve`, ``docs/serve.md``)
goes to the SDK untouched, its body replayed. The call is :meth:`Gateway.call_tool` under
:meth:`McpServerTelemetry.serving`, held by the session manager so the session counts as
busy and a closed session or a client's ``notifications/cancelled`` cancels it, answered
as the SDK answers then. Behaviour and measurements: ``docs/serve.md`` ("fast lane").
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any, Final

import anyio
import mcp.types as types
import pydantic_core
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser, authorization_context
from mcp.server.connection import Connection
from mcp.server.streamable_http import (
    MCP_SESSION_ID_HEADER,
    REQUEST_CANCELLED,
    StreamableHTTPServerTransport,
    check_accept_headers,
)
from mcp.shared.dispatcher import as_request_id
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp.types.version import HANDSHAKE_PROTOCOL_VERSIONS
from mcp_types import methods
from pydantic import ValidationError
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .._compat.mcp_server import (
    check_content_type,
    error_response,
    has_event_store,
    passes_security,
)
from .channels import LaneChannel, LogLevels, may_be_asked
from .sessions import HeldCall, SessionManager
from .tracing import McpServerTelemetry

CallTool = Callable[[str, dict[str, Any] | None, types.RequestId], Awaitable[types.CallToolResult]]
_REQUEST_KEYS = frozenset({"jsonrpc", "id", "method", "params"})
_JSON = "application/json"
PING_S: Final = 15.0
"""Seconds between the ``: ping`` comments of an SSE answer still waiting for its call
(``sse_starlette``'s default, which the SDK keeps)."""
_SSE_HEADERS: Final = [
    (b"cache-control", b"no-cache, no-transform"),
    (b"connection", b"keep-alive"),
    (b"content-type", b"text/event-stream"),
]


@dataclass(frozen=True, slots=True)
class _Call:
    """A ``tools/call`` the lane serves: its session, id, negotiated version and params."""

    session_id: str
    transport: StreamableHTTPServerTransport
    request_id: types.RequestId
    version: str
    params: dict[str, Any]
    log_level: str | None
    """The level the client asked for with ``logging/setLevel`` (``None``: every one)."""


class FastLane:
    """ASGI endpoint: serves plain ``tools/call`` POSTs itself, the rest through ``app``."""

    def __init__(
        self,
        app: ASGIApp,
        manager: SessionManager,
        call_tool: CallTool,
        telemetry: McpServerTelemetry,
        connections: dict[str, Connection],
        enabled: Callable[[], bool],
        levels: LogLevels,
    ) -> None:
        self.app = app
        self.manager = manager
        self.call_tool = call_tool
        self.telemetry = telemetry
        self.connections = connections
        self.enabled = enabled
        self.levels = levels
        self.served = 0
        """How many calls the lane has answered."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] != "POST":  # a stateless app has no lane (Gateway.http_app)
            await self.app(scope, receive, send)
            return
        body, replay = await _read_body(receive)
        message = None if body is None else _message(body)
        if body is None or message is None:
            await self.app(scope, replay, send)
        elif message.get("method") == "notifications/cancelled":
            await self._cancel(scope, message, replay, send)
        elif not await self._serve(scope, body, message, receive, send):
            await self.app(scope, replay, send)

    async def _cancel(
        self, scope: Scope, message: dict[str, Any], replay: Receive, send: Send
    ) -> None:
        """Hand a ``notifications/cancelled`` to the SDK (its checks, its answer); when
        it accepts it, cancel the lane's call with that id on that session too (the
        SDK's dispatcher knows only its own)."""
        accepted = False

        async def sent(event: Message) -> None:
            nonlocal accepted
            if event["type"] == "http.response.start":
                accepted = event["status"] == HTTPStatus.ACCEPTED
            await send(event)

        await self.app(scope, replay, sent)
        session_id = Headers(scope=scope).get(MCP_SESSION_ID_HEADER)
        params = message.get("params")
        request_id = as_request_id(params.get("requestId") if isinstance(params, dict) else None)
        if accepted and session_id is not None and request_id is not None:
            self.manager.cancel_held(session_id, request_id)

    async def _serve(
        self,
        scope: Scope,
        body: bytes,
        message: dict[str, Any],
        receive: Receive,
        send: Send,
    ) -> bool:
        """Serve the request if it is one for the lane; ``False`` (nothing sent) if not."""
        manager = self.manager
        request = Request(scope)
        headers = request.headers
        session_id = headers.get(MCP_SESSION_ID_HEADER)
        if session_id is None or not self.enabled():
            return False
        transport = manager.sessions.get(session_id)
        connection = self.connections.get(session_id)
        if transport is None or connection is None or transport.is_terminated:
            return False
        if transport.idle_scope is not None and transport.idle_scope.cancel_called:
            return False
        user = scope.get("user")
        requestor = authorization_context(user) if isinstance(user, AuthenticatedUser) else None
        if requestor != manager.session_owner(session_id):
            return False
        version_header = headers.get(MCP_PROTOCOL_VERSION_HEADER)
        if version_header is not None and version_header not in HANDSHAKE_PROTOCOL_VERSIONS:
            return False
        if not await passes_security(transport, request):
            return False
        sse = not manager.json_response
        has_json, has_sse = check_accept_headers(request)
        if not has_json or (sse and not has_sse) or not check_content_type(transport, request):
            return False
        if sse and (has_event_store(transport) or may_be_asked(connection.client_capabilities)):
            return False
        if len(body) > manager.max_request_body_size:
            return False
        parsed = _tools_call(message)
        if parsed is None:
            return False
        request_id, params = parsed
        version = connection.protocol_version
        try:
            methods.validate_client_request("tools/call", version, params)
        except (ValidationError, KeyError, ValueError):
            return False
        level = self.levels.of(connection) if sse else None  # JSON: no logs
        call = _Call(session_id, transport, request_id, version, params, level)
        if sse:
            await self._stream(scope, receive, send, call)
            return True
        held, result = await self._call(scope, call)
        if held.by_client or result is not None:
            body = (
                _cancelled(request_id) if result is None else _answer(result, request_id, version)
            )
            fields = {"Content-Type": _JSON, MCP_SESSION_ID_HEADER: session_id}
            response = Response(body, headers=fields)
        else:
            response = error_response(
                transport,
                "Session terminated before the request completed",
                HTTPStatus.INTERNAL_SERVER_ERROR,
                types.INTERNAL_ERROR,
            )
        self.served += 1
        await response(scope, receive, send)
        return True

    async def _call(
        self,
        scope: Scope,
        call: _Call,
        watch: Callable[[anyio.CancelScope], Coroutine[Any, Any, None]] | None = None,
        emit: Callable[[bytes], Awaitable[None]] | None = None,
    ) -> tuple[HeldCall, types.CallToolResult | None]:
        """Run the call held by the session manager, under the server span, with its
        channel to the client (``emit`` writes a notification on its stream); ``watch``
        (given the hold's scope) runs beside it. The result is ``None`` when the hold was
        cancelled (the session closed, the client cancelled or went away)."""
        result: types.CallToolResult | None = None
        session_id, request_id, params = call.session_id, call.request_id, call.params
        name, arguments = params["name"], params.get("arguments")
        with (
            self.manager.hold(session_id, call.transport, request_id) as held,
            self.telemetry.serving(
                "tools/call", call.version, request_id, scope, session_id, name, params.get("_meta")
            ) as outcome,
            LaneChannel(params.get("_meta"), emit, call.log_level),
        ):
            if watch is None:
                answered = await self.call_tool(name, arguments, request_id)
            else:
                async with anyio.create_task_group() as watching:
                    watching.start_soon(watch, held.scope)
                    answered = await self.call_tool(name, arguments, request_id)
                    watching.cancel_scope.cancel()
            outcome.tool_error = answered.is_error
            result = answered
        return held, result

    async def _stream(self, scope: Scope, receive: Receive, send: Send, call: _Call) -> None:
        """Answer as the SDK's SSE response does: its headers, then one ``message`` event
        and the end of the stream; the headers and a ``: ping`` comment every
        :data:`PING_S` while the call is still running, which a client going away
        (``http.disconnect``) cancels."""
        started = False

        async def start() -> None:
            nonlocal started
            if not started:
                started = True
                headers = [*_SSE_HEADERS, (b"mcp-session-id", call.session_id.encode())]
                headers.append((b"x-accel-buffering", b"no"))
                await send({"type": "http.response.start", "status": 200, "headers": headers})

        async def watch(call: anyio.CancelScope) -> None:
            while True:
                with anyio.move_on_after(PING_S):
                    if (await receive())["type"] == "http.disconnect":
                        call.cancel()
                        return
                    continue
                await start()
                ping = f": ping - {datetime.now(UTC)}\r\n\r\n".encode()
                await send({"type": "http.response.body", "body": ping, "more_body": True})

        async def emit(notification: bytes) -> None:
            await start()
            await send(
                {"type": "http.response.body", "body": _event(notification), "more_body": True}
            )

        held, result = await self._call(scope, call, watch, emit)
        if held.by_client:
            body = _event(_cancelled(call.request_id))
        elif result is None:  # the session closed mid-call: no event, as the SDK's stream
            body = b""
        else:
            body = _event(_answer(result, call.request_id, call.version))
        self.served += 1
        await start()
        await send({"type": "http.response.body", "body": body, "more_body": False})


def _event(data: bytes) -> bytes:
    """One SSE ``message`` event, framed as the SDK's stream frames it."""
    return b"event: message\r\ndata: " + data + b"\r\n\r\n"


def _answer(result: types.CallToolResult, request_id: types.RequestId, version: str) -> bytes:
    """The JSON-RPC response to a ``tools/call``, as the SDK writes it for ``version``."""
    dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    wire = methods.serialize_server_result("tools/call", version, dumped)
    return pydantic_core.to_json({"jsonrpc": "2.0", "id": request_id, "result": wire})


def _cancelled(request_id: types.RequestId) -> bytes:
    """The SDK's answer to a request its client cancelled, on the 2025-era wire (which
    ends a request's stream only with a response for its id)."""
    error = {"code": REQUEST_CANCELLED, "message": "Request cancelled"}
    return pydantic_core.to_json({"jsonrpc": "2.0", "id": request_id, "error": error})


def _message(body: bytes) -> dict[str, Any] | None:
    """The one JSON-RPC message of a body that holds exactly one, else None."""
    try:
        message = json.loads(body)
    except ValueError:
        return None
    return message if isinstance(message, dict) else None


def _tools_call(message: dict[str, Any]) -> tuple[types.RequestId, dict[str, Any]] | None:
    """The id and params of a message that is exactly a ``tools/call`` request, else None."""
    if (
        message.get("method") != "tools/call"
        or message.get("jsonrpc") != "2.0"
        or not _REQUEST_KEYS.issuperset(message)
    ):
        return None
    request_id = message.get("id")
    params = message.get("params")
    if not isinstance(request_id, int | str) or isinstance(request_id, bool):
        return None
    if not isinstance(params, dict) or not isinstance(params.get("name"), str):
        return None
    return request_id, params


async def _read_body(receive: Receive) -> tuple[bytes | None, Receive]:
    """The body, which ``BodyLimit`` has read whole and replays as one message (``None``
    for anything else: the SDK gets it), and a ``receive`` that replays it."""
    first: list[Message] = [await receive()]
    message = first[0]
    whole = message["type"] == "http.request" and not message.get("more_body", False)

    async def replayed() -> Message:
        return first.pop() if first else await receive()

    return message.get("body", b"") if whole else None, replayed
