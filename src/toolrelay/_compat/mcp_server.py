"""The MCP SDK's server-side internals toolrelay relies on (the gateway, :mod:`toolrelay.serve`).

Each name says what it relies on and why toolrelay needs it; ``tests/test_compat.py`` checks
that each still exists, with the shape used here, in the installed SDK. Where the SDK should
offer a public way, docs/architecture.md ("Third-party internals") writes the request down.
"""

from __future__ import annotations

import math
from http import HTTPStatus

import anyio

# The SDK adds its own span middleware to every server; the gateway serves its own spans
# (semantic conventions, a client's trace context) and takes the SDK's out so calls are not
# traced twice.
from mcp.server._otel import OpenTelemetryMiddleware as OpenTelemetryMiddleware
from mcp.server.auth.middleware.bearer_auth import AuthorizationContext
from mcp.server.connection import Connection
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.message import SessionMessage
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send


class SdkSessionManager(StreamableHTTPSessionManager):
    """The SDK's session manager with its session bookkeeping reachable under public names.

    The gateway shares sessions fairly between clients (a per-client limit, the least
    recently used idle session closed for a new one): the SDK has one global
    ``max_sessions`` and refuses the next. Subclasses override :meth:`handle_stateful` and
    :meth:`discard_session`; the SDK's own code calls them through the private names below.
    """

    @property
    def sessions(self) -> dict[str, StreamableHTTPServerTransport]:
        """The open sessions' transports by session id. Relies on ``_server_instances``."""
        return self._server_instances

    @property
    def creation_lock(self) -> anyio.Lock:
        """The lock the SDK opens sessions under. Relies on ``_session_creation_lock``."""
        return self._session_creation_lock

    def session_owner(self, session_id: str) -> AuthorizationContext | None:
        """Who opened ``session_id`` (its bearer token). Relies on ``_session_owners``: the
        fast lane refuses a request whose token is not the session's, as the SDK does."""
        return self._session_owners.get(session_id)

    def admit_session(
        self, requestor: AuthorizationContext | None
    ) -> StreamableHTTPServerTransport | None:
        """Register a new session's transport (``None`` at ``max_sessions``). Relies on
        ``_admit_session``: the gateway opens a session as the SDK does, after its checks."""
        return self._admit_session(requestor)

    async def serve_opening_request(
        self, transport: StreamableHTTPServerTransport, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """Start the session and answer its first request. Relies on ``_serve_opening_request``."""
        await self._serve_opening_request(transport, scope, receive, send)

    async def handle_stateful(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A request of a stateful manager, served by the SDK."""
        await StreamableHTTPSessionManager._handle_stateful_request(self, scope, receive, send)

    async def discard_session(
        self, session_id: str, transport: StreamableHTTPServerTransport
    ) -> None:
        """Forget ``session_id`` and terminate its transport, as the SDK does."""
        await StreamableHTTPSessionManager._discard_session(self, session_id, transport)

    # The SDK calls these two; overriding them is how a request and a closing session reach
    # the gateway (relies on ``_handle_request`` calling the first for every stateful request,
    # and on every session ending through the second).
    async def _handle_stateful_request(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.handle_stateful(scope, receive, send)

    async def _discard_session(
        self, session_id: str, transport: StreamableHTTPServerTransport
    ) -> None:
        await self.discard_session(session_id, transport)


def is_busy(transport: StreamableHTTPServerTransport) -> bool:
    """Whether a request (or an open GET stream) of the session is in flight. Relies on
    ``_requests_in_flight``: the gateway closes only idle sessions for a new one."""
    return bool(transport._requests_in_flight)


class busy:  # lowercase: called like a function, as contextlib.suppress
    """``with busy(transport):`` count a request the fast lane serves outside the transport
    as the transport counts its own: in flight, and the session's idle timer stopped until
    the last one ends (a class, not a generator: every call of the lane enters one).

    Relies on ``_requests_in_flight`` (read and written) and ``_idle_timeout`` with the public
    ``idle_scope``, as ``StreamableHTTPServerTransport.handle_request`` uses them: the fast
    lane halves the gateway's CPU per call, and a session must not expire under its calls.
    """

    __slots__ = ("_idle", "_transport")

    def __init__(self, transport: StreamableHTTPServerTransport) -> None:
        self._transport = transport
        self._idle = transport.idle_scope

    def __enter__(self) -> None:
        self._transport._requests_in_flight += 1
        if self._idle is not None:
            self._idle.deadline = math.inf

    def __exit__(self, *exc_info: object) -> None:
        transport, idle = self._transport, self._idle
        transport._requests_in_flight -= 1
        timeout = transport._idle_timeout
        if idle is not None and timeout is not None and not transport._requests_in_flight:
            idle.deadline = anyio.current_time() + timeout


async def send_to_session(
    transport: StreamableHTTPServerTransport, message: SessionMessage
) -> bool:
    """Deliver ``message`` to the session's server as if its client had sent it; ``False``
    when the session is not connected (or no longer is).

    Relies on ``_read_stream_writer``: a client that disconnects mid-POST gets its requests
    cancelled with a ``notifications/cancelled`` of its own (the 2025-era wire has no other
    signal; an abandoned call would hold its bulkhead slot until its deadline).
    """
    writer = transport._read_stream_writer
    if writer is None or transport.is_terminated:
        return False
    try:
        await writer.send(message)
    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
        return False
    return True


async def passes_security(transport: StreamableHTTPServerTransport, request: Request) -> bool:
    """Whether a POST passes the transport's DNS-rebinding checks (``Host``, ``Origin``,
    ``Content-Type``). Relies on ``_security.validate_request``: the fast lane runs the SDK's
    own checks before serving a call itself."""
    return await transport._security.validate_request(request, is_post=True) is None


def check_content_type(transport: StreamableHTTPServerTransport, request: Request) -> bool:
    """Whether the request's ``Content-Type`` is JSON, by the transport's own check. Relies
    on ``_check_content_type`` (the fast lane answers only what the SDK would)."""
    return transport._check_content_type(request)


def has_event_store(transport: StreamableHTTPServerTransport) -> bool:
    """Whether the transport keeps an event store (priming events, resumption: the fast lane
    then leaves SSE answers to the SDK). Relies on ``_event_store``."""
    return transport._event_store is not None


def error_response(
    transport: StreamableHTTPServerTransport, message: str, status: HTTPStatus, code: int
) -> Response:
    """The transport's own JSON-RPC error response. Relies on ``_create_error_response``:
    the fast lane answers a call cut short by a closing session byte for byte as the SDK."""
    return transport._create_error_response(message, status, code)


def connection_of(session: object) -> Connection | None:
    """The server session's connection. Relies on ``ServerSession._connection``: SDK 2.3
    hands the low-level handlers no public way to it (``ServerRequestContext`` has no
    ``connection``), and the gateway tracks 2025-era peers by it."""
    connection = getattr(session, "_connection", None)
    return connection if isinstance(connection, Connection) else None
