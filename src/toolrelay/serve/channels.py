"""The client of a ``tools/call``, as the upstream MCP servers reach it during the call.

:class:`SessionChannel` (a call the SDK serves) and :class:`LaneChannel` (a call the fast
lane serves) are the :class:`~toolrelay.sources.relay.CallChannel` the gateway puts around
``dispatch`` (``with channel:``). What reaches the client, and when an upstream's request
gets an error at once instead: ``docs/serve.md``, "During a call".

:class:`LogLevels` keeps each 2025-era connection's ``logging/setLevel`` and passes the most
verbose level any client asked for on to every upstream (a level is the whole upstream's:
each client still gets only the levels it asked for).
"""

from __future__ import annotations

import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from contextvars import Token
from types import MappingProxyType
from typing import Any, cast

import anyio
import mcp.types as types
import pydantic_core
from mcp.server.connection import Connection
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from mcp.types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from .._compat.mcp_server import connection_of
from ..registry import ToolRegistry
from ..sources.mcp import McpSource
from ..sources.relay import CALL_CHANNEL, LOG_LEVEL_META, CallChannel, R, level_passes

_CAPABILITY = {
    "sampling/createMessage": "sampling",
    "elicitation/create": "elicitation",
    "roots/list": "roots",
}
_SET_LEVEL_S = 5.0
_WITHDRAW_S = 1.0  # at most this long, a cancelled call waits to withdraw its requests
_NO_META: Mapping[str, Any] = MappingProxyType({})


def may_be_asked(capabilities: types.ClientCapabilities | None) -> bool:
    """Whether the client declared it can be asked something (``elicitation``: to approve
    a call, or by an upstream; ``sampling``, ``roots``: by an upstream)."""
    return capabilities is not None and (
        capabilities.elicitation is not None
        or capabilities.sampling is not None
        or capabilities.roots is not None
    )


def refused(method: str, why: str) -> types.ErrorData:
    return types.ErrorData(code=types.METHOD_NOT_FOUND, message=f"{method}: {why}")


class Channel:
    """What both channels share: the call's ``_meta``, its progress token, the log level its
    client wants (2026-era: an opt-in per request, no messages without one), its end."""

    def __init__(
        self, meta: Mapping[str, Any] | None, wanted: str | None = None, modern: bool = False
    ) -> None:
        if meta and "progress_token" in meta:  # as the SDK parsed it: the wire's name
            meta = dict(meta)
            meta["progressToken"] = meta.pop("progress_token")
        self.meta: Mapping[str, Any] = meta or _NO_META
        self.token = self.meta.get("progressToken")
        self._wanted = wanted
        self._modern = modern
        self.closed = False
        self._serving: Token[CallChannel | None] | None = None

    def __enter__(self) -> None:
        """The dispatch inside ``with channel:`` runs with this channel; after it, the
        channel is closed (a class, not a generator: every ``tools/call`` enters one)."""
        self._serving = CALL_CHANNEL.set(cast("CallChannel", self))  # each subclass is one

    def __exit__(self, *exc_info: object) -> None:
        self.closed = True
        if self._serving is not None:
            CALL_CHANNEL.reset(self._serving)

    _send: Callable[[types.ServerNotification], Awaitable[None]]
    """How a subclass sends the call's client a notification (one that keeps :meth:`progress`
    and :meth:`log` as they are defines it)."""

    async def progress(self, progress: float, total: float | None, message: str | None) -> None:
        if self.token is not None:
            params = types.ProgressNotificationParams(
                progress_token=self.token, progress=progress, total=total, message=message
            )
            await self._send(types.ProgressNotification(params=params))

    async def log(self, params: types.LoggingMessageNotificationParams) -> None:
        if (self._wanted is not None or not self._modern) and level_passes(
            params.level, self._wanted
        ):
            await self._send(types.LoggingMessageNotification(params=params))


class SessionChannel(Channel):
    """A call the SDK serves: messages go through its server session, on the call's stream."""

    def __init__(self, ctx: ServerRequestContext[Any, Any], levels: LogLevels) -> None:
        self._session = ctx.session
        self._request_id = ctx.request_id
        modern = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
        self._asking: set[anyio.CancelScope] = set()
        self._withdrawn = anyio.Event()
        meta: dict[str, Any] = dict(ctx.meta or {})
        if modern:
            wanted = meta.get(LOG_LEVEL_META)
        else:
            wanted = levels.of(connection_of(ctx.session))
            if wanted is not None:
                meta.setdefault(LOG_LEVEL_META, wanted)  # for a 2026-era upstream
        super().__init__(meta, wanted, modern)

    @asynccontextmanager
    async def relaying(self) -> AsyncIterator[None]:
        """``with self``; at the end, a request still waiting on the client is withdrawn
        (its ``notifications/cancelled`` goes out while the call's stream is open)."""
        with self:
            try:
                yield
            finally:
                self.closed = True
                if self._asking:
                    for scope in self._asking:
                        scope.cancel()
                    with anyio.CancelScope(shield=True), anyio.move_on_after(_WITHDRAW_S):
                        await self._withdrawn.wait()

    async def _send(self, notification: types.ServerNotification) -> None:
        if not self.closed:
            await self._session.send_notification(notification, self._request_id)

    def declines(self, method: str) -> types.ErrorData | None:
        """The upstream's error when the client did not declare what ``method`` needs."""
        capabilities = self._session.client_capabilities
        if capabilities is not None and getattr(capabilities, _CAPABILITY[method]) is not None:
            return None
        return refused(method, "the client of this call did not declare the capability")

    async def ask(self, request: types.ServerRequest, result_type: type[R]) -> R | types.ErrorData:
        method = request.method
        declined = self.declines(method)
        if declined is not None:
            return declined
        if self.closed or self._modern or not self._session.can_send_request:
            return refused(method, "the client of this call cannot be asked now")
        related = ServerMessageMetadata(related_request_id=self._request_id)
        with anyio.CancelScope() as scope:
            self._asking.add(scope)
            try:
                return await self._session.send_request(request, result_type, metadata=related)
            except MCPError as exc:
                return types.ErrorData(code=exc.code, message=exc.message, data=exc.data)
            except ValidationError:
                message = f"{method}: the client's answer is not a valid result"
                return types.ErrorData(code=types.INTERNAL_ERROR, message=message)
            finally:
                self._asking.discard(scope)
                if not self._asking and self.closed:
                    self._withdrawn.set()
        return refused(method, "the call ended before the client answered")


class LaneChannel(Channel):
    """A call the fast lane serves (a client that declared none of sampling, elicitation
    and roots): notifications are written to its SSE stream by ``emit`` (``None``: a
    JSON answer, which carries none)."""

    def __init__(
        self,
        meta: Mapping[str, Any] | None,
        emit: Callable[[bytes], Awaitable[None]] | None,
        wanted: str | None,
    ) -> None:
        super().__init__(meta, wanted)
        self._emit = emit

    async def _send(self, notification: types.ServerNotification) -> None:
        if self._emit is not None and not self.closed:
            wire = notification.model_dump(by_alias=True, mode="json", exclude_none=True)
            await self._emit(pydantic_core.to_json({"jsonrpc": "2.0", **wire}))

    async def ask(self, request: types.ServerRequest, result_type: type[R]) -> R | types.ErrorData:
        return refused(request.method, "the client of this call did not declare the capability")


class LogLevels:
    """Each 2025-era connection's ``logging/setLevel``, and the upstreams' level."""

    def __init__(self, registry: ToolRegistry) -> None:
        self._registry = registry
        self._levels: weakref.WeakKeyDictionary[Connection, str] = weakref.WeakKeyDictionary()

    def of(self, connection: Connection | None) -> str | None:
        """The level ``connection`` asked for (``None``: every message)."""
        return None if connection is None else self._levels.get(connection)

    async def set(
        self, ctx: ServerRequestContext[Any, Any], params: types.SetLevelRequestParams
    ) -> types.EmptyResult:
        """The ``logging/setLevel`` handler."""
        connection = connection_of(ctx.session)
        if connection is not None:
            self._levels[connection] = params.level
        for plugin in self._registry.plugins():
            if not isinstance(plugin, McpSource):
                continue
            relay = plugin.relay
            if relay.log_level is not None and level_passes(params.level, relay.log_level):
                continue  # the upstream already sends this level and up
            relay.log_level = params.level
            conn = plugin.conn
            if conn is not None and conn.client is not None:
                with anyio.move_on_after(_SET_LEVEL_S):
                    await relay.set_level(conn.client)
        return types.EmptyResult()
