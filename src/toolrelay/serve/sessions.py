"""Streamable HTTP sessions: who may open one, which one is closed for a new one, and the
requests the fast lane serves outside a session's transport.

:class:`SessionManager` is the SDK's session manager with sessions shared fairly between
clients; :class:`HeldCall` is a request of a session that the fast lane
(:mod:`toolrelay.serve.fast_lane`) serves itself, cancelled with its session.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import mcp.types as types
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser, authorization_context
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER, StreamableHTTPServerTransport
from mcp.shared.dispatcher import coerce_request_id
from mcp.shared.message import SessionMessage
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import Message, Receive, Scope, Send

from .._compat.mcp_server import SdkSessionManager, busy, is_busy, send_to_session
from .metrics import GatewayMetrics

log = logging.getLogger("toolrelay.serve.gateway")


class HeldCall:
    """A request the fast lane serves outside its session's transport."""

    __slots__ = ("by_client", "request_id", "scope")

    def __init__(self, request_id: types.RequestId) -> None:
        self.request_id = request_id
        self.scope = anyio.CancelScope()
        self.by_client = False
        """Whether the client cancelled it (``notifications/cancelled``)."""


class SessionManager(SdkSessionManager):
    """The SDK's session manager, with sessions shared fairly between clients (at most
    ``per_client`` each; when full, the least recently used idle one closed for a new one:
    ``docs/serve.md``, "HTTP sessions"). Only the opening of a session changes; the SDK's
    admission and serving run as they are.

    A client that disconnects mid-POST has that POST's requests cancelled, as its
    ``notifications/cancelled`` would: the 2025-era wire has no other signal, and an
    abandoned call would run to its deadline, holding its bulkhead slot.
    """

    def __init__(self, *, per_client: int, metrics: GatewayMetrics, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.per_client = per_client
        self.metrics = metrics
        self._client_of: dict[str, str] = {}
        self._last_used: dict[str, float] = {}
        self._held: dict[str, set[HeldCall]] = {}
        metrics.sessions_open.set_function(lambda: len(self.sessions))

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
    ) -> Iterator[HeldCall]:
        """Serve a request of ``session_id`` outside its transport (the fast lane): the
        session is busy until the block ends, which is cancelled when the session closes,
        the manager stops, or the client cancels the request (:meth:`cancel_held`)."""
        if session_id in self._last_used:
            self._last_used[session_id] = time.monotonic()
        held = HeldCall(coerce_request_id(request_id))
        calls = self._held.setdefault(session_id, set())
        calls.add(held)
        with busy(transport):
            try:
                with held.scope:
                    yield held
            finally:
                calls.discard(held)
                if not calls:
                    self._held.pop(session_id, None)

    def cancel_held(self, session_id: str, request_id: types.RequestId) -> None:
        """Cancel the fast lane's calls with ``request_id``, as the SDK cancels its own."""
        key = coerce_request_id(request_id)
        for held in self._held.get(session_id, ()):
            if held.request_id == key:
                held.by_client = True
                held.scope.cancel()

    async def handle_stateful(self, scope: Scope, receive: Receive, send: Send) -> None:
        session_id = Headers(scope=scope).get(MCP_SESSION_ID_HEADER)
        if session_id is not None:
            if session_id in self._last_used:
                self._last_used[session_id] = time.monotonic()
            if scope.get("method") != "POST":
                await super().handle_stateful(scope, receive, send)
                return
            watched = _WatchedPost(receive, send)
            await super().handle_stateful(scope, watched.receive, watched.send)
            if watched.disconnected and not watched.answered:
                await self._cancel_abandoned(session_id, watched.request_ids())
            return
        user = scope.get("user")
        requestor = authorization_context(user) if isinstance(user, AuthenticatedUser) else None
        client = client_key(scope)
        refusal: tuple[str, int, str] | None = None
        transport = None
        async with self.creation_lock:
            if sum(1 for c in self._client_of.values() if c == client) >= self.per_client:
                refusal = ("client_limit", 429, "Too many open sessions for this client")
            elif (
                not await self._make_room() or (transport := self.admit_session(requestor)) is None
            ):
                refusal = ("full", 503, "Too many open sessions")
            else:
                assert transport.mcp_session_id is not None
                self._client_of[transport.mcp_session_id] = client
                self._last_used[transport.mcp_session_id] = time.monotonic()
        if refusal is not None:
            reason, status, message = refusal
            log.warning("refusing a new MCP session for %s: %s", client, reason)
            self.metrics.sessions_refused.labels(reason).inc()
            error = {"code": types.INTERNAL_ERROR, "message": message}
            body = {"jsonrpc": "2.0", "id": None, "error": error}
            await JSONResponse(body, status_code=status)(scope, receive, send)
            return
        assert transport is not None
        await self.serve_opening_request(transport, scope, receive, send)

    async def _cancel_abandoned(self, session_id: str, request_ids: list[types.RequestId]) -> None:
        """Cancel the requests of a POST whose client disconnected (the server ignores
        the cancellation of one already answered)."""
        transport = self.sessions.get(session_id)
        if transport is None:
            return
        for request_id in request_ids:
            cancel = types.JSONRPCNotification(
                jsonrpc="2.0",
                method="notifications/cancelled",
                params={"requestId": request_id, "reason": "the client disconnected"},
            )
            if not await send_to_session(transport, SessionMessage(cancel)):
                return
        if request_ids:
            log.info("cancelled %d call(s) of a disconnected MCP client", len(request_ids))

    async def _make_room(self) -> bool:
        """Whether a session can be opened, closing the least recently used idle one if
        need be (under the session-creation lock)."""
        if self.max_sessions is None or len(self.sessions) < self.max_sessions:
            return True
        idle = [
            (self._last_used.get(sid, 0.0), sid)
            for sid, transport in self.sessions.items()
            if not is_busy(transport) and not transport.is_terminated
        ]
        if not idle:
            return False
        _, oldest = min(idle)
        log.info("closing idle MCP session %s to admit a new one", oldest[:8])
        await self.discard_session(oldest, self.sessions[oldest])
        self.metrics.sessions_reaped.inc()
        return True

    async def discard_session(
        self, session_id: str, transport: StreamableHTTPServerTransport
    ) -> None:
        self._client_of.pop(session_id, None)
        self._last_used.pop(session_id, None)
        for held in self._held.get(session_id, ()):
            held.scope.cancel()
        await super().discard_session(session_id, transport)


class _WatchedPost:
    """A POST's ``receive`` and ``send``, noting its body (already bounded by
    ``BodyLimit``), whether the client disconnected and whether its response was sent
    whole (every request of it answered: a client closing the stream then, as the
    TypeScript SDK does, abandons nothing)."""

    def __init__(self, receive: Receive, send: Send) -> None:
        self._receive = receive
        self._send = send
        self._body = bytearray()
        self.disconnected = False
        self.answered = False

    async def send(self, message: Message) -> None:
        await self._send(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self.answered = True

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


def client_key(scope: Scope) -> str:
    """Who opens a session: the verified token's client name, else the peer address."""
    user = scope.get("user")
    if isinstance(user, AuthenticatedUser):
        return f"client:{user.access_token.client_id}"
    peer = scope.get("client")
    return f"peer:{peer[0]}" if peer else "peer:unknown"
