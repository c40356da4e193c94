"""What an upstream MCP server says to the client of a call, while the call runs.

The dispatch pipeline knows nothing of MCP. A host that serves MCP clients (the gateway,
``toolrelay serve``) puts a :class:`CallChannel` for the client's request in
:data:`CALL_CHANNEL` around ``dispatch``; the context variable reaches
:meth:`McpSource.execute <toolrelay.sources.mcp.McpSource.execute>` (contextvars flow into
the pipeline's child tasks), which forwards the call's ``_meta`` and holds a
:class:`Relay.attempt` while the upstream works on it. The upstream's client callbacks
(:meth:`Relay.callbacks`: ``sampling/createMessage``, ``elicitation/create``,
``roots/list``, ``notifications/message``) and progress reach that channel:

* over streamable HTTP the SDK hands a message of a call's response stream to the callback
  in the calling task's context, so :data:`CALL_CHANNEL` names the call;
* otherwise (stdio, the standalone stream) the call is the only one of the connection that
  has a channel, when there is exactly one;
* progress is routed by the SDK's own progress token, so it is exact on every transport.

A request that finds no call is answered with an error (``roots/list``: no roots), a log
line that finds none goes to the gateway's own log. While two attempts of one call are in
flight (a hedge), a request is refused rather than asked twice, and an attempt that has
asked the client is not retried: its failure is final (:meth:`Relay.attempt`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any, Protocol, TypeVar, cast

import anyio
import mcp.types as mcp_types
from mcp import Client, MCPError
from mcp.client.session import ClientRequestContext
from mcp.types.version import MODERN_PROTOCOL_VERSIONS

from ..contract import CURRENT_ATTEMPT

log = logging.getLogger("toolrelay.sources.mcp")

R = TypeVar("R", bound=mcp_types.Result)
_LOG_LEVELS = {"debug": 10, "info": 20, "notice": 25, "warning": 30, "error": 40}
_OWN_META = frozenset({"progressToken", "traceparent", "tracestate", "baggage"})
_MODERN_META = "io.modelcontextprotocol/"
LOG_LEVEL_META = "io.modelcontextprotocol/logLevel"
_ANSWER_MARGIN_S = 1.0  # at most this long before the deadline (a fifth of what is left)


class CallChannel(Protocol):
    """The client of one call, as far as an upstream may reach it during the call."""

    @property
    def meta(self) -> Mapping[str, Any]:
        """The call's ``_meta`` as the client sent it (``{}``: none)."""

    async def progress(self, progress: float, total: float | None, message: str | None) -> None:
        """Report progress with the client's own token (nothing when it gave none)."""

    async def log(self, params: mcp_types.LoggingMessageNotificationParams) -> None:
        """Pass on an upstream's log message, if the client wants that level."""

    async def ask(
        self, request: mcp_types.ServerRequest, result_type: type[R]
    ) -> R | mcp_types.ErrorData:
        """Send a request to the client and return its answer (or the error for the
        upstream: the client cannot be asked, refused, or answered nonsense)."""


CALL_CHANNEL: ContextVar[CallChannel | None] = ContextVar("toolrelay_call_channel", default=None)


def forwarded_meta(meta: Mapping[str, Any]) -> mcp_types.RequestParamsMeta | None:
    """The part of a call's ``_meta`` passed on upstream: everything but the client's
    progress token (the upstream gets the source's own), trace context (the gateway's
    span is the parent) and the 2026-era per-request stamps of the client's connection
    (the upstream connection has its own), except the log-level opt-in."""
    if not meta:
        return None
    kept = {
        key: value
        for key, value in meta.items()
        if key not in _OWN_META and (not key.startswith(_MODERN_META) or key == LOG_LEVEL_META)
    }
    return cast("mcp_types.RequestParamsMeta", kept) if kept else None


def level_passes(level: str, wanted: str | None) -> bool:
    """Whether a message at ``level`` is wanted by a client asking for ``wanted`` and up."""
    return wanted is None or _LOG_LEVELS.get(level, 50) >= _LOG_LEVELS.get(wanted, 10)


class _Attempt:
    """An attempt of ``channel``'s call in flight on the upstream, while inside ``with``
    (a class, not a generator: every attempt of a ``tools/call`` enters one)."""

    __slots__ = ("_active", "asked", "channel", "deadline")

    def __init__(self, active: dict[CallChannel, list[_Attempt]], channel: CallChannel) -> None:
        self._active = active
        self.channel = channel
        self.asked = False
        """This attempt relayed a request to the client (it must not be made again)."""
        running = CURRENT_ATTEMPT.get(None)  # the pipeline's attempt: its call's deadline
        deadline = anyio.current_effective_deadline() if running is None else running[0].deadline
        self.deadline: float = deadline
        """The call's deadline: the client's answer is awaited until shortly before it."""

    def __enter__(self) -> _Attempt:
        self._active.setdefault(self.channel, []).append(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        attempts = self._active[self.channel]
        attempts.remove(self)
        if not attempts:
            del self._active[self.channel]


class Relay:
    """One upstream connection's callbacks, routed to the call they belong to."""

    def __init__(self, server: str) -> None:
        self.server = server
        self._active: dict[CallChannel, list[_Attempt]] = {}
        self.log_level: mcp_types.LoggingLevel | None = None
        """The level clients asked for (the most verbose so far), applied on every connect."""

    def attempt(self, channel: CallChannel) -> _Attempt:
        """``with relay.attempt(channel):`` an attempt of ``channel``'s call is in flight
        on the upstream."""
        return _Attempt(self._active, channel)

    def _route(self) -> CallChannel | None:
        channel = CALL_CHANNEL.get()
        if channel is not None and channel in self._active:
            return channel
        if len(self._active) == 1:
            return next(iter(self._active))
        return None

    async def _ask(
        self, what: str, request: mcp_types.ServerRequest, result_type: type[R]
    ) -> R | mcp_types.ErrorData:
        channel = self._route()
        if channel is None:
            why = f"no call of the gateway's clients is waiting on {self.server} for {what}"
            return mcp_types.ErrorData(code=mcp_types.INVALID_REQUEST, message=why)
        attempts = self._active[channel]
        if len(attempts) > 1:
            why = f"{what}: several attempts of this call are in flight; the client is asked once"
            return mcp_types.ErrorData(code=mcp_types.INVALID_REQUEST, message=why)
        [attempt] = attempts
        attempt.asked = True
        # the upstream gets an error in time to answer before the call's deadline: a client
        # that does not answer must not make the upstream's breaker count a timeout
        left = attempt.deadline - anyio.current_time()
        with anyio.move_on_after(left - min(_ANSWER_MARGIN_S, left / 5)):
            return await channel.ask(request, result_type)
        log.info("toolrelay: the client did not answer %s's %s in time", self.server, what)
        why = f"{what}: the client did not answer before the call's deadline"
        return mcp_types.ErrorData(code=mcp_types.METHOD_NOT_FOUND, message=why)

    async def sampling(
        self, context: ClientRequestContext, params: mcp_types.CreateMessageRequestParams
    ) -> (
        mcp_types.CreateMessageResult | mcp_types.CreateMessageResultWithTools | mcp_types.ErrorData
    ):
        request = mcp_types.CreateMessageRequest(params=params)
        if params.tools:
            return await self._ask("sampling", request, mcp_types.CreateMessageResultWithTools)
        return await self._ask("sampling", request, mcp_types.CreateMessageResult)

    async def elicitation(
        self, context: ClientRequestContext, params: mcp_types.ElicitRequestParams
    ) -> mcp_types.ElicitResult | mcp_types.ErrorData:
        request = mcp_types.ElicitRequest(params=params)
        return await self._ask("elicitation", request, mcp_types.ElicitResult)

    async def roots(
        self, context: ClientRequestContext
    ) -> mcp_types.ListRootsResult | mcp_types.ErrorData:
        if self._route() is None:  # outside a call: the gateway itself has no roots
            return mcp_types.ListRootsResult(roots=[])
        return await self._ask("roots", mcp_types.ListRootsRequest(), mcp_types.ListRootsResult)

    async def logging(self, params: mcp_types.LoggingMessageNotificationParams) -> None:
        channel = self._route()
        if channel is not None:
            await channel.log(params)
            return
        # outside a call: the gateway's own log (debug, warnings and worse as warnings)
        level = logging.WARNING if _LOG_LEVELS.get(params.level, 50) >= 30 else logging.DEBUG
        log.log(level, "toolrelay: MCP server %s logged: %s", self.server, str(params.data)[:500])

    async def set_level(self, client: Client) -> None:
        """Ask a 2025-era server that logs to send :attr:`log_level` and up (a refusal or a
        lost connection is only logged: the calls go on)."""
        level = self.log_level
        if level is None or client.server_capabilities.logging is None:
            return
        if client.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return  # 2026-era: an opt-in per call (forwarded_meta)
        request = mcp_types.SetLevelRequest(params=mcp_types.SetLevelRequestParams(level=level))
        try:
            await client.session.send_request(request, mcp_types.EmptyResult)
        except MCPError as exc:
            log.info("toolrelay: MCP server %s refused logging/setLevel: %s", self.server, exc)

    def callbacks(self) -> dict[str, Any]:
        """The SDK ``Client``'s callbacks (which also declare the capabilities)."""
        return {
            "sampling_callback": self.sampling,
            "elicitation_callback": self.elicitation,
            "list_roots_callback": self.roots,
            "logging_callback": self.logging,
        }
