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
(:meth:`Gateway.http_app`, stateful sessions for the 2025 handshake — shared between clients
by :mod:`toolrelay.serve.sessions` — and single exchanges for 2026-era requests).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any, cast

import anyio
import mcp.types as types
from mcp.server.auth.middleware.auth_context import AuthContextMiddleware
from mcp.server.auth.middleware.bearer_auth import BearerAuthBackend, RequireAuthMiddleware
from mcp.server.auth.provider import TokenVerifier
from mcp.server.connection import Connection
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.models import InitializationOptions
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPDeprecationWarning
from mcp.shared.message import SessionMessage
from mcp.types.version import MODERN_PROTOCOL_VERSIONS
from opentelemetry import metrics, trace
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.routing import Route
from starlette.types import ASGIApp

from .._compat.mcp_server import OpenTelemetryMiddleware, connection_of
from .._version import __version__
from ..catalog import Catalog
from ..dispatcher import Dispatcher
from ..registry import CompiledTool, ToolRegistry
from .answers import answer
from .approvals import ElicitingApprover
from .auth import transport_security
from .callers import Callers
from .channels import LogLevels, SessionChannel
from .client_limits import ClientLimits
from .fast_lane import FastLane
from .limits import BodyLimit, bounded_stdin
from .metrics import CANCELLED, UNKNOWN_TOOL, GatewayMetrics
from .relayed import as_stated, upstream_instructions
from .resources import Offerings
from .rounds import Rounds
from .sessions import SessionManager
from .settings import DEFAULT_MAX_REQUEST_BYTES, DEFAULT_MAX_SESSIONS, DEFAULT_SESSION_IDLE_S
from .tracing import McpServerTelemetry
from .watch import ToolListWatcher

INSTRUCTIONS = (
    "Tool calls run through toolrelay. A failed call is an isError result whose first text "
    "content is the answer envelope as JSON {ok: false, error_type, message, retryable, "
    "retry_after_s?} (also its structuredContent when the tool declares no outputSchema); "
    "retry only when retryable is true, after retry_after_s if given."
)


class _GatewayServer(Server[Any]):
    """The low-level server, advertising ``listChanged`` (tools; prompts and resources when
    served) on every transport.

    The streamable HTTP session manager builds its initialization options with no
    arguments, so the default is changed here rather than at each call site. Its
    ``instructions`` are the upstreams' (as they are now) followed by the gateway's own.
    """

    registry: ToolRegistry  # the gateway's, set right after construction

    @property
    def instructions(self) -> str | None:
        return "\n\n".join([*upstream_instructions(self.registry), INSTRUCTIONS])

    @instructions.setter
    def instructions(self, value: str | None) -> None:
        pass  # always the composition above

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options or NotificationOptions(True, True, True),
            experimental_capabilities,
            extensions,
        )


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
            headers = getattr(ctx.request, "headers", None)
            session_id = None if headers is None else headers.get(MCP_SESSION_ID_HEADER)
            key = f"http:{session_id}" if session_id else "stdio"  # a handshake-era connection
            caller = self._callers.current()
            self._watcher.add_peer(key, ctx.session, caller.profile, caller.name)
            connection = connection_of(ctx.session)
            if connection is not None:
                connection.exit_stack.callback(self._watcher.remove_peer, key)
                if session_id:
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
        self.catalog: Catalog | None = None
        """The tool catalog (``[serve.catalog]``): a deprecated tool's answers carry its hint."""
        self.log_levels = LogLevels(dispatcher.registry)
        self.rounds = Rounds()
        """2026-era calls held between ``InputRequiredResult`` rounds (while it runs)."""
        with warnings.catch_warnings():  # deprecated in 2026-era protocol, served to 2025's
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            self.server = _GatewayServer(
                name,
                version=__version__,
                on_list_tools=self._list_tools,
                on_call_tool=self._call_tool,
                on_subscriptions_listen=self._listen,
                on_set_logging_level=self.log_levels.set,
                get_tool_input_schema=self._input_schema,
            )
        self.server.registry = dispatcher.registry
        # our spans and durations stand for the SDK's (which see only the global provider)
        self.telemetry = _server_telemetry(dispatcher)
        self._peers = _PeerTracker(watcher, callers)
        self.offerings = Offerings(self.server, dispatcher, callers, watcher, lambda: self.limits)
        """The upstreams' resources, prompts and completions (served once started)."""
        self.server.middleware[:] = [
            self.telemetry,
            *(m for m in self.server.middleware if not isinstance(m, OpenTelemetryMiddleware)),
            self._peers,
        ]

    # -- handlers -----------------------------------------------------------------------------
    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        refusal = self.limits.check(self.callers.current().name)
        if refusal is not None:
            raise refusal.error()
        specs = as_stated(self._specs(), self.dispatcher.registry)
        return types.ListToolsResult(tools=[types.Tool.model_validate(spec) for spec in specs])

    def _specs(self) -> list[dict[str, Any]]:
        """The tools the current caller is offered (``format="mcp"``)."""
        return self.dispatcher.specs(self.callers.current().profile, format="mcp")

    def _input_schema(self, name: str) -> dict[str, Any] | None:
        """The ``inputSchema`` of ``name`` as offered to the current caller: the SDK's check
        of a 2026-era call's ``Mcp-Param`` headers (uncharged; else it lists the tools)."""
        return next((s["inputSchema"] for s in self._specs() if s["name"] == name), None)

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        channel = SessionChannel(ctx, self.log_levels)
        if self.rounds.serves(ctx, params):  # a 2026-era client its upstream may ask
            return await self.rounds.call(ctx, params, channel, self.call_tool)
        async with channel.relaying():
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
        if self.catalog is not None:  # a deprecated tool's hint, its caller counted
            result = self.catalog.annotate(result, caller.name)
        answered = answer(result, self._tool(name))
        self.metrics.call(label, answered.outcome)
        if result.deprecated is not None:
            meta = {**(answered.result.meta or {}), "toolrelay/deprecated": result.deprecated}
            return answered.result.model_copy(update={"meta": meta})
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
        uris = params.notifications.resource_subscriptions or ()
        async with self.offerings.subscriptions.watching(uris):
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
        allowed_hosts: Sequence[str] = (),
        verifier: TokenVerifier | None = None,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        max_sessions_per_client: int | None = None,
        session_idle_s: float = DEFAULT_SESSION_IDLE_S,
        json_response: bool = False,
        stateless: bool = False,
    ) -> tuple[Starlette, StreamableHTTPSessionManager]:
        """The streamable HTTP app (serving ``path``) and its session manager.

        Run the manager (``async with manager.run():``) while the app serves. A request's
        ``Host`` and ``Origin`` name loopback, ``host`` or one of ``allowed_hosts``
        (:func:`~toolrelay.serve.auth.transport_security`: 421 or 403 otherwise). With a
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
        manager = SessionManager(
            app=self.server,
            security_settings=transport_security(host, allowed_hosts),
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
                self.log_levels,
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
