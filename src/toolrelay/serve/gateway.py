"""The MCP server in front of the dispatcher, on the MCP SDK's low-level ``Server``.

* ``tools/list`` is ``dispatcher.specs(profile, format="mcp")`` for the caller's profile, so
  tools whose breaker is open are not offered.
* ``tools/call`` runs ``dispatcher.dispatch(...)`` and answers with
  :func:`~toolrelay.serve.answers.answer` for the tool as the registry declares it now (its
  ``outputSchema`` decides what may be ``structuredContent``); a client's
  ``notifications/cancelled`` cancels the dispatch (the SDK cancels the handler, the
  cancellation reaches the tool).
* ``subscriptions/listen`` (2026-era clients) and ``notifications/tools/list_changed``
  (2025-era clients) come from the :class:`~toolrelay.serve.watch.ToolListWatcher`.

Both protocol eras are served, over stdio (:meth:`Gateway.run_stdio`) and streamable HTTP
(:meth:`Gateway.http_app`, stateful sessions for the 2025 handshake, single exchanges for
2026-era requests).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any, cast

import anyio
import mcp.types as types
from mcp.server._otel import OpenTelemetryMiddleware  # the SDK's, replaced by ours
from mcp.server.auth.middleware.auth_context import AuthContextMiddleware
from mcp.server.auth.middleware.bearer_auth import (
    AuthenticatedUser,
    BearerAuthBackend,
    RequireAuthMiddleware,
    authorization_context,
)
from mcp.server.auth.provider import TokenVerifier
from mcp.server.connection import Connection
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.models import InitializationOptions
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER, StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.dispatcher import coerce_request_id
from mcp.shared.message import SessionMessage
from mcp.types.version import MODERN_PROTOCOL_VERSIONS
from opentelemetry import metrics, trace
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import __version__
from ..dispatcher import Dispatcher
from ..registry import CompiledTool
from .answers import answer
from .approvals import ElicitingApprover
from .auth import is_loopback
from .callers import Callers
from .client_limits import ClientLimits
from .fast_lane import FastLane
from .limits import BodyLimit, bounded_stdin
from .metrics import CANCELLED, UNKNOWN_TOOL, GatewayMetrics, RefusalReason
from .settings import DEFAULT_MAX_REQUEST_BYTES, DEFAULT_MAX_SESSIONS, DEFAULT_SESSION_IDLE_S
from .tracing import McpServerTelemetry
from .watch import ToolListWatcher

__all__ = ["Gateway", "transport_security"]

log = logging.getLogger(__name__)

INSTRUCTIONS = (
    "Tool calls run through toolrelay. A failed call is an isError result whose first text "
    "content is the answer envelope as JSON {ok: false, error_type, message, retryable, "
    "retry_after_s?} (also its structuredContent when the tool declares no outputSchema); "
    "retry only when retryable is true, after retry_after_s if given."
)


class _Held:
    """A request the fast lane serves outside its session's transport."""

    __slots__ = ("by_client", "request_id", "scope")

    def __init__(self, request_id: types.RequestId) -> None:
        self.request_id = request_id
        self.scope = anyio.CancelScope()
        self.by_client = False
        """Whether the client cancelled it (``notifications/cancelled``)."""


class _SessionManager(StreamableHTTPSessionManager):
    """The SDK's session manager, with sessions shared fairly between clients.

    A client (its bearer token's client name, or its peer address without tokens) has at
    most ``per_client`` sessions open: one more is refused with 429. When ``max_sessions``
    are open, the least recently used session with no request in flight (no open GET
    stream) is closed to make room; only when every session is busy is a new one refused
    with 503. Both refusals carry a JSON-RPC error body and are counted in ``metrics``.

    Only the opening of a session (a request without ``Mcp-Session-Id``) is changed; it
    reuses the SDK's own admission and serving, under its session-creation lock.

    A client that goes away while a POST on its session is open (its answer's SSE stream
    ends with ``http.disconnect``) has that POST's requests cancelled, as its own
    ``notifications/cancelled`` would: the 2025-era wire has no other signal, and an
    abandoned call would otherwise run to its deadline, holding its bulkhead slot.
    """

    def __init__(self, *, per_client: int, metrics: GatewayMetrics, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.per_client = per_client
        self.metrics = metrics
        self._client_of: dict[str, str] = {}
        self._last_used: dict[str, float] = {}
        self._held: dict[str, set[_Held]] = {}
        metrics.count_sessions(lambda: len(self._server_instances))

    @contextlib.asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        async with super().run():
            try:
                yield
            finally:  # the SDK cancels its sessions' tasks; the fast lane's calls too
                for calls in list(self._held.values()):
                    for held in calls:
                        held.scope.cancel()

    @contextlib.contextmanager
    def hold(
        self,
        session_id: str,
        transport: StreamableHTTPServerTransport,
        request_id: types.RequestId,
    ) -> Iterator[_Held]:
        """Serve request ``request_id`` of ``session_id`` outside its transport (the fast
        lane): the session counts as used now and busy until the block ends (as the
        transport counts its own requests), and the block is cancelled when the session
        is closed, the manager stops, or the client cancels the request
        (:meth:`cancel_held`); then the scope's ``cancelled_caught`` is set."""
        if session_id in self._last_used:
            self._last_used[session_id] = time.monotonic()
        held = _Held(coerce_request_id(request_id))
        calls = self._held.setdefault(session_id, set())
        calls.add(held)
        idle, timeout = transport.idle_scope, transport._idle_timeout
        transport._requests_in_flight += 1
        if idle is not None:
            idle.deadline = math.inf
        try:
            with held.scope:
                yield held
        finally:
            calls.discard(held)
            if not calls:
                self._held.pop(session_id, None)
            transport._requests_in_flight -= 1
            if idle is not None and timeout is not None and not transport._requests_in_flight:
                idle.deadline = anyio.current_time() + timeout

    def cancel_held(self, session_id: str, request_id: types.RequestId) -> None:
        """Cancel the fast lane's calls of ``session_id`` with ``request_id``, as the
        SDK's dispatcher cancels its own on ``notifications/cancelled``."""
        key = coerce_request_id(request_id)
        for held in self._held.get(session_id, ()):
            if held.request_id == key:
                held.by_client = True
                held.scope.cancel()

    async def _handle_stateful_request(self, scope: Scope, receive: Receive, send: Send) -> None:
        session_id = Headers(scope=scope).get(MCP_SESSION_ID_HEADER)
        if session_id is not None:
            if session_id in self._last_used:
                self._last_used[session_id] = time.monotonic()
            if scope.get("method") != "POST":
                await super()._handle_stateful_request(scope, receive, send)
                return
            watched = _WatchedPost(receive)
            await super()._handle_stateful_request(scope, watched.receive, send)
            if watched.disconnected:
                await self._cancel_abandoned(session_id, watched.request_ids())
            return
        user = scope.get("user")
        requestor = authorization_context(user) if isinstance(user, AuthenticatedUser) else None
        client = _client_key(scope)
        refusal: tuple[RefusalReason, int, str] | None = None
        transport = None
        async with self._session_creation_lock:
            if sum(1 for c in self._client_of.values() if c == client) >= self.per_client:
                refusal = ("client_limit", 429, "Too many open sessions for this client")
            elif not await self._make_room():
                refusal = ("full", 503, "Too many open sessions")
            else:
                transport = self._admit_session(requestor)
                if transport is None:  # pragma: no cover - room was just made
                    refusal = ("full", 503, "Too many open sessions")
                else:
                    assert transport.mcp_session_id is not None
                    self._client_of[transport.mcp_session_id] = client
                    self._last_used[transport.mcp_session_id] = time.monotonic()
        if refusal is not None:
            reason, status, message = refusal
            log.warning("refusing a new MCP session for %s: %s", client, reason)
            self.metrics.refused(reason)
            await _jsonrpc_error(message, status)(scope, receive, send)
            return
        assert transport is not None
        await self._serve_opening_request(transport, scope, receive, send)

    async def _cancel_abandoned(self, session_id: str, request_ids: list[types.RequestId]) -> None:
        """Cancel the requests of a POST whose client disconnected (a request already
        answered is not in flight any more, and the server ignores its cancellation)."""
        transport = self._server_instances.get(session_id)
        writer = None if transport is None else transport._read_stream_writer
        if writer is None or transport is None or transport.is_terminated:
            return
        for request_id in request_ids:
            cancel = types.JSONRPCNotification(
                jsonrpc="2.0",
                method="notifications/cancelled",
                params={"requestId": request_id, "reason": "the client disconnected"},
            )
            try:
                await writer.send(SessionMessage(cancel))
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                return
        if request_ids:
            log.info("cancelled %d call(s) of a disconnected MCP client", len(request_ids))

    async def _make_room(self) -> bool:
        """Whether a session can be opened, closing the least recently used idle one if
        every place is taken (called under the session-creation lock)."""
        if self.max_sessions is None or len(self._server_instances) < self.max_sessions:
            return True
        idle = [
            (self._last_used.get(sid, 0.0), sid)
            for sid, transport in self._server_instances.items()
            if not transport._requests_in_flight and not transport.is_terminated
        ]
        if not idle:
            return False
        _, oldest = min(idle)
        log.info("closing idle MCP session %s to admit a new one", oldest[:8])
        await self._discard_session(oldest, self._server_instances[oldest])
        self.metrics.reaped()
        return True

    async def _discard_session(
        self, session_id: str, transport: StreamableHTTPServerTransport
    ) -> None:
        self._client_of.pop(session_id, None)
        self._last_used.pop(session_id, None)
        for held in self._held.get(session_id, ()):
            held.scope.cancel()
        await super()._discard_session(session_id, transport)


class _WatchedPost:
    """A POST's ``receive``, noting its body (already bounded by ``BodyLimit``) and
    whether the client disconnected."""

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._body = bytearray()
        self.disconnected = False

    async def receive(self) -> Message:
        message = await self._receive()
        if message["type"] == "http.request":
            self._body += message.get("body", b"")
        elif message["type"] == "http.disconnect":
            self.disconnected = True
        return message

    def request_ids(self) -> list[types.RequestId]:
        """The ids of the JSON-RPC requests in the body (one message or a batch)."""
        try:
            parsed = json.loads(self._body)
        except ValueError:
            return []
        messages = parsed if isinstance(parsed, list) else [parsed]
        return [
            m["id"]
            for m in messages
            if isinstance(m, dict)
            and isinstance(m.get("method"), str)
            and isinstance(m.get("id"), int | str)
            and not isinstance(m.get("id"), bool)
        ]


def _client_key(scope: Scope) -> str:
    """Who opens a session: the verified token's client name, else the peer address."""
    user = scope.get("user")
    if isinstance(user, AuthenticatedUser):
        return f"client:{user.access_token.client_id}"
    peer = scope.get("client")
    return f"peer:{peer[0]}" if peer else "peer:unknown"


def _jsonrpc_error(message: str, status: int) -> Response:
    error = {"code": types.INTERNAL_ERROR, "message": message}
    body = {"jsonrpc": "2.0", "id": None, "error": error}
    return JSONResponse(body, status_code=status)


class _GatewayServer(Server[Any]):
    """The low-level server, advertising ``tools.listChanged`` on every transport.

    The streamable HTTP session manager builds its initialization options with no
    arguments, so the default is changed here rather than at each call site.
    """

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options or NotificationOptions(tools_changed=True),
            experimental_capabilities,
            extensions,
        )


def _peer_key(ctx: ServerRequestContext[Any, Any]) -> str:
    """Names a handshake-era connection: its HTTP session id, or ``stdio``."""
    headers = getattr(ctx.request, "headers", None)
    session_id = None if headers is None else headers.get(MCP_SESSION_ID_HEADER)
    return f"http:{session_id}" if session_id else "stdio"


def _connection_of(ctx: ServerRequestContext[Any, Any]) -> Connection | None:
    """The request's connection. SDK 2.3 hands the low-level handlers no public way to
    it (``ServerRequestContext`` has no ``connection`` yet), so the session's is read."""
    connection = getattr(ctx.session, "_connection", None)
    return connection if isinstance(connection, Connection) else None


class _PeerTracker:
    """Server middleware: remembers each 2025-era connection once it is initialized, and
    forgets it when the connection's exit stack unwinds."""

    def __init__(self, watcher: ToolListWatcher, callers: Callers) -> None:
        self._watcher = watcher
        self._callers = callers
        self.connections: dict[str, Connection] = {}
        """The initialized HTTP sessions' connections, by session id (for the fast lane)."""

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        result = await call_next(ctx)
        if (
            ctx.method == "notifications/initialized"
            and ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS
        ):
            key = _peer_key(ctx)
            caller = self._callers.current()
            self._watcher.add_peer(key, ctx.session, caller.profile, caller.name)
            connection = _connection_of(ctx)
            if connection is not None:
                connection.exit_stack.callback(self._watcher.remove_peer, key)
                if key.startswith("http:"):
                    session_id = key.removeprefix("http:")
                    self.connections[session_id] = connection
                    connection.exit_stack.callback(self.connections.pop, session_id, None)
        return result


def _server_telemetry(dispatcher: Dispatcher) -> McpServerTelemetry:
    """Spans and durations for the requests served, on the dispatcher's providers (none
    with its telemetry off: the client's trace context is still passed on upstream)."""
    telemetry = dispatcher.telemetry
    if telemetry is None:
        return McpServerTelemetry(trace.NoOpTracerProvider(), metrics.NoOpMeterProvider())
    return McpServerTelemetry(telemetry.provider, telemetry.genai.provider)


def transport_security(host: str) -> TransportSecuritySettings:
    """DNS-rebinding protection for the HTTP transport bound to ``host``."""
    if host in ("0.0.0.0", "::", ""):
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    hosts = ["127.0.0.1:*", "localhost:*", "[::1]:*"]
    if not is_loopback(host):
        hosts.append(f"[{host}]:*" if ":" in host else f"{host}:*")
    origins = [f"{scheme}://{entry}" for entry in hosts for scheme in ("http", "https")]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins
    )


class Gateway:
    """The dispatcher's tools as an MCP server."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        callers: Callers,
        watcher: ToolListWatcher,
        metrics: GatewayMetrics,
        *,
        name: str = "toolrelay",
        limits: ClientLimits | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        self.callers = callers
        self.watcher = watcher
        self.metrics = metrics
        self.limits = limits or ClientLimits()
        """Per-client limits (default: none), applied to ``tools/call`` and ``tools/list``."""
        self.fast_lane = True
        """Serve plain ``tools/call`` POSTs without the SDK's session machinery
        (:mod:`toolrelay.serve.fast_lane`: the same checks, the same answers).
        ``False``: every request goes through the SDK (read per request)."""
        self.lane: FastLane | None = None
        """The fast lane of the last :meth:`http_app` that keeps sessions."""
        self.server = _GatewayServer(
            name,
            version=__version__,
            instructions=INSTRUCTIONS,
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_subscriptions_listen=self._listen,
        )
        # our spans and durations stand for the SDK's (which see only the global provider)
        self.telemetry = _server_telemetry(dispatcher)
        self._peers = _PeerTracker(watcher, callers)
        self.server.middleware[:] = [
            self.telemetry,
            *(m for m in self.server.middleware if not isinstance(m, OpenTelemetryMiddleware)),
            self._peers,
        ]

    # -- handlers -----------------------------------------------------------------------------
    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        caller = self.callers.current()
        refusal = self.limits.check(caller.name)
        if refusal is not None:
            raise refusal.error()
        specs = self.dispatcher.specs(caller.profile, format="mcp")
        return types.ListToolsResult(tools=[types.Tool.model_validate(spec) for spec in specs])

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        return await self.call_tool(params.name, params.arguments, ctx.request_id)

    async def call_tool(
        self, name: str, arguments: dict[str, Any] | None, request_id: types.RequestId | None
    ) -> types.CallToolResult:
        """Serve one ``tools/call`` for the current caller (per-client limits, metrics,
        the answer for the tool as declared now)."""
        caller = self.callers.current()
        label = name if self.dispatcher.registry.owns(name) else UNKNOWN_TOOL
        call_id = None if request_id is None else str(request_id)
        limits = self.limits  # the same object admits and releases, across a reload
        refusal = limits.enter(caller.name)
        if refusal is not None:
            refused = answer(refusal.result(name, call_id), self._tool(name))
            self.metrics.call(label, refused.outcome)
            return refused.result
        try:
            result = await self.dispatcher.dispatch(
                name, arguments or {}, caller.ctx, profile=caller.profile, call_id=call_id
            )
        except anyio.get_cancelled_exc_class():
            self.metrics.call(label, CANCELLED)
            raise
        finally:
            limits.leave(caller.name)
        answered = answer(result, self._tool(name))
        self.metrics.call(label, answered.outcome)
        return answered.result

    def _lane_open(self) -> bool:
        """Whether the fast lane may serve a call now: it is on, and the server middleware
        is only the gateway's own (the lane runs the same steps without the chain; the
        approver cannot ask a client the lane serves — JSON mode, or no ``elicitation``
        capability — so skipping it changes nothing)."""
        if not self.fast_lane:
            return False
        for middleware in self.server.middleware:
            owner = getattr(middleware, "__self__", middleware)
            ours = owner is self.telemetry or owner is self._peers
            if not ours and not isinstance(owner, ElicitingApprover):
                return False
        return True

    def _tool(self, name: str) -> CompiledTool | None:
        """The tool as declared now, whose ``outputSchema`` clients validate against."""
        try:
            return self.dispatcher.registry.resolve(name)
        except Exception:  # a plugin declaring it invalidly now: no schema is listed for it
            return None

    async def _listen(
        self, ctx: ServerRequestContext[Any], params: types.SubscriptionsListenRequestParams
    ) -> types.SubscriptionsListenResult:
        handler = self.watcher.listen_handler(self.callers.current().profile)
        return await handler(ctx, params)

    # -- transports ---------------------------------------------------------------------------
    async def run_stdio(self, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> None:
        """Serve one client over this process's stdin and stdout until stdin closes.

        A line over ``max_request_bytes`` is dropped as it is read and answered with a
        JSON-RPC error; the next one is served as usual."""
        streams: list[Any] = []

        async def refuse(error: dict[str, Any]) -> None:
            message = types.JSONRPCError.model_validate(error)
            await streams[0].send(SessionMessage(message))

        async with (
            bounded_stdin(max_request_bytes, refuse) as stdin,
            # the SDK only iterates its stdin: bounded lines stand in for the file
            stdio_server(stdin=cast("anyio.AsyncFile[str]", stdin)) as (read_stream, write_stream),
        ):
            streams.append(write_stream)
            options = self.server.create_initialization_options()
            await self.server.run(read_stream, write_stream, options)

    def http_app(
        self,
        *,
        host: str,
        path: str,
        verifier: TokenVerifier | None = None,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        max_sessions_per_client: int | None = None,
        session_idle_s: float = DEFAULT_SESSION_IDLE_S,
        json_response: bool = False,
        stateless: bool = False,
    ) -> tuple[Starlette, StreamableHTTPSessionManager]:
        """The streamable HTTP app (serving ``path``) and its session manager.

        Run the manager (``async with manager.run():``) while the app serves. With a
        ``verifier`` every request needs a bearer token it accepts (401 otherwise), and a
        session can only be used with the token that opened it. At most ``max_sessions``
        sessions are open (the least recently used idle one is closed for a new one), at
        most ``max_sessions_per_client`` (default: a tenth of them) per client, and a
        session idle for ``session_idle_s`` is closed.
        ``json_response`` answers each request with a JSON body instead of an SSE stream;
        ``stateless`` serves each request without a session (the SDK's two modes).
        """
        if max_sessions_per_client is None:
            max_sessions_per_client = max(1, max_sessions // 10)
        manager = _SessionManager(
            app=self.server,
            security_settings=transport_security(host),
            session_idle_timeout=session_idle_s,
            max_sessions=max_sessions,
            per_client=min(max_sessions_per_client, max_sessions),
            metrics=self.metrics,
            json_response=json_response,
            stateless=stateless,
        )
        endpoint: ASGIApp = StreamableHTTPASGIApp(manager)
        if not stateless:
            endpoint = self.lane = FastLane(
                endpoint,
                manager,
                self.call_tool,
                self.telemetry,
                self._peers.connections,
                self._lane_open,
            )
        middleware: list[Middleware] = []
        if verifier is not None:
            endpoint = RequireAuthMiddleware(endpoint, [])
            middleware = [
                Middleware(AuthenticationMiddleware, backend=BearerAuthBackend(verifier)),
                Middleware(AuthContextMiddleware),
            ]
        middleware.insert(0, Middleware(BodyLimit, limit=max_request_bytes))
        app = Starlette(routes=[Route(path, endpoint=endpoint)], middleware=middleware)
        return app, manager
