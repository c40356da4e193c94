"""A fast lane for ``tools/call`` over streamable HTTP in JSON-response mode.

In ``json_response`` mode the MCP SDK serves one ``tools/call`` POST through its whole
session machinery: a pydantic JSON-RPC parse, a memory stream to the session's task, a
``ServerRequestContext``, the server middleware, the ``CallToolResult`` model, and a
memory stream back. :class:`FastLane` serves the common case in the request's own task
instead, with the same checks and the same answer, byte for byte.

It serves a POST only when all of these hold, and hands anything else to the SDK
untouched (the body it read is replayed):

* the session manager answers JSON (``json_response``), keeps sessions (not
  ``stateless``), and the gateway's server middleware is only its own (spans, peer
  tracking, the approver, which cannot ask a client in this mode anyway);
* the request passes the transport's own checks: DNS-rebinding protection (``Host``,
  ``Origin``) and ``Content-Type`` (the SDK's ``transport_security``), an ``Accept`` with
  ``application/json``, an ``MCP-Protocol-Version`` that is absent or a handshake-era
  version, and the SDK's own body limit;
* its ``Mcp-Session-Id`` names a session the manager holds, not terminated nor expiring,
  that was opened with the same bearer token, and whose client finished the handshake
  (``notifications/initialized``: the gateway then knows its negotiated version);
* the body is exactly one JSON-RPC request (``jsonrpc``, ``id``, ``method``, ``params``
  and nothing else) with ``method == "tools/call"`` and params the SDK's own validation
  accepts for that version.

The call itself is :meth:`Gateway.call_tool` (what the SDK's handler runs too) under
:meth:`McpServerTelemetry.serving` (the same span and duration); while it runs the session
counts as busy, so it is neither reaped for a new session nor closed as idle. A session
closed while a call is in flight (``DELETE``, the manager shutting down) cancels the call
and answers as the SDK does then: HTTP 500, "Session terminated before the request
completed".
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

import mcp.types as types
import pydantic_core
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser, authorization_context
from mcp.server.connection import Connection
from mcp.server.streamable_http import (
    MCP_SESSION_ID_HEADER,
    check_accept_headers,
)
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp.types.version import HANDSHAKE_PROTOCOL_VERSIONS
from mcp_types import methods
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .tracing import McpServerTelemetry

if TYPE_CHECKING:
    from .gateway import _SessionManager

__all__ = ["FastLane"]

log = logging.getLogger(__name__)

CallTool = Callable[[str, dict[str, Any] | None, types.RequestId], Awaitable[types.CallToolResult]]
_REQUEST_KEYS = frozenset({"jsonrpc", "id", "method", "params"})
_JSON = "application/json"


class FastLane:
    """ASGI endpoint: serves plain ``tools/call`` POSTs itself, the rest through ``app``."""

    def __init__(
        self,
        app: ASGIApp,
        manager: _SessionManager,
        call_tool: CallTool,
        telemetry: McpServerTelemetry,
        connections: dict[str, Connection],
        enabled: Callable[[], bool],
    ) -> None:
        self.app = app
        self.manager = manager
        self.call_tool = call_tool
        self.telemetry = telemetry
        self.connections = connections
        self.enabled = enabled
        self.served = 0
        """How many calls the lane has answered."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        manager = self.manager
        if scope["method"] != "POST" or not manager.json_response or manager.stateless:
            await self.app(scope, receive, send)
            return
        body, replay = await _read_body(receive)
        if body is None or not await self._serve(scope, body, send):
            await self.app(scope, replay, send)

    async def _serve(self, scope: Scope, body: bytes, send: Send) -> bool:
        """Serve the request if it is one for the lane; ``False`` (nothing sent) if not."""
        manager = self.manager
        request = Request(scope)
        headers = request.headers
        session_id = headers.get(MCP_SESSION_ID_HEADER)
        if session_id is None or not self.enabled():
            return False
        transport = manager._server_instances.get(session_id)
        connection = self.connections.get(session_id)
        if transport is None or connection is None or transport.is_terminated:
            return False
        if transport.idle_scope is not None and transport.idle_scope.cancel_called:
            return False
        user = scope.get("user")
        requestor = authorization_context(user) if isinstance(user, AuthenticatedUser) else None
        if requestor != manager._session_owners.get(session_id):
            return False
        version_header = headers.get(MCP_PROTOCOL_VERSION_HEADER)
        if version_header is not None and version_header not in HANDSHAKE_PROTOCOL_VERSIONS:
            return False
        if await transport._security.validate_request(request, is_post=True) is not None:
            return False
        if not check_accept_headers(request)[0] or not transport._check_content_type(request):
            return False
        if len(body) > manager.max_request_body_size:
            return False
        message = _tools_call(body)
        if message is None:
            return False
        request_id, params = message
        version = connection.protocol_version
        try:
            methods.validate_client_request("tools/call", version, params)
        except (ValidationError, KeyError, ValueError):
            return False
        name: str = params["name"]
        arguments: dict[str, Any] | None = params.get("arguments")
        meta = params.get("_meta")
        held = manager.hold(session_id, transport)
        with (
            held as cancel_scope,
            self.telemetry.serving(
                "tools/call", version, request_id, scope, session_id, name, meta
            ) as outcome,
        ):
            result = await self.call_tool(name, arguments, request_id)
            outcome.tool_error = result.is_error
        if cancel_scope.cancelled_caught:
            response = transport._create_error_response(
                "Session terminated before the request completed",
                HTTPStatus.INTERNAL_SERVER_ERROR,
                types.INTERNAL_ERROR,
            )
        else:
            dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
            wire = methods.serialize_server_result("tools/call", version, dumped)
            answer = {"jsonrpc": "2.0", "id": request_id, "result": wire}
            response = Response(
                pydantic_core.to_json(answer),
                headers={"Content-Type": _JSON, MCP_SESSION_ID_HEADER: session_id},
            )
        self.served += 1
        await response(scope, _no_receive, send)
        return True


def _tools_call(body: bytes) -> tuple[types.RequestId, dict[str, Any]] | None:
    """The id and params of a body that is exactly one ``tools/call`` request, else None."""
    try:
        message = json.loads(body)
    except ValueError:
        return None
    if (
        not isinstance(message, dict)
        or message.get("method") != "tools/call"
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
    """The whole body (``BodyLimit`` has bounded it) and a ``receive`` that replays it;
    ``None`` when the client went away first."""
    chunks: list[bytes] = []
    messages: list[Message] = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            body = None
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            body = b"".join(chunks)
            break
    messages.reverse()

    async def replayed() -> Message:
        return messages.pop() if messages else await receive()

    return body, replayed


async def _no_receive() -> Message:  # pragma: no cover - a response never reads the body
    return {"type": "http.disconnect"}
