"""What an MCP server offers besides tools: its resources, resource templates and prompts.

:class:`Listing` keeps one source's lists (every page, read when asked and again after the
server says one changed or the connection was replaced) and sends its requests
(``resources/read``, ``prompts/get``, ``completion/complete``, ``resources/subscribe``)
on the source's live connection within a deadline, every failure mapped to
:class:`UpstreamFailure`. The server's notices (``notifications/resources/updated``, the
list changes) reach :attr:`Listing.on_event`: on a 2025-era connection through the
source's message handler, on a 2026-era one through a ``subscriptions/listen`` stream this
module keeps open. The gateway (:mod:`toolrelay.serve.resources`) routes clients to it.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import mcp.types as mcp_types
from mcp import Client, MCPError
from mcp.client import IncomingMessage
from mcp.client.subscriptions import ListenNotSupportedError, SubscriptionLost
from mcp.shared.subscriptions import (
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated,
    ServerEvent,
)
from mcp.types.version import MODERN_PROTOCOL_VERSIONS

from .connection import State, pages
from .errors import (
    AnswerTooLarge,
    Disconnected,
    NotAToolResult,
    Refused,
    Unreachable,
    cap,
    map_mcp_errors,
)
from .mcp_connection import Connector

log = logging.getLogger("toolrelay.sources.mcp")

T = TypeVar("T")
_NOTICES: dict[type, Callable[[Any], ServerEvent]] = {
    mcp_types.ResourceUpdatedNotification: lambda n: ResourceUpdated(str(n.params.uri)),
    mcp_types.ResourceListChangedNotification: lambda n: ResourcesListChanged(),
    mcp_types.PromptListChangedNotification: lambda n: PromptsListChanged(),
}


class UpstreamFailure(Exception):
    """A request to the server failed. ``code``: the server's JSON-RPC error code when it
    answered with one (``None``: it did not answer); ``counted``: the server's own failure
    (not reachable, no answer in time, an internal error), which a breaker counts."""

    def __init__(self, message: str, *, code: int | None, counted: bool) -> None:
        super().__init__(message)
        self.code = code
        self.counted = counted


class Listing:
    """One source's resources, templates and prompts, and its requests for them."""

    def __init__(self, source: Connector) -> None:
        self.source = source
        self.resources: list[mcp_types.Resource] = []
        self.templates: list[mcp_types.ResourceTemplate] = []
        self.prompts: list[mcp_types.Prompt] = []
        self.capabilities = mcp_types.ServerCapabilities()
        """What the server said it offers, as of the last :meth:`fetch`."""
        self.subscribed: set[str] = set()
        """The URIs some client subscribed to through this server."""
        self.on_event: Callable[[Listing, ServerEvent], Awaitable[None]] | None = None
        """Told of each change the server reports (set by the host)."""
        self.stale = True
        self._connects = -1
        self._relisten = anyio.Event()
        self._listening = False  # a 2026-era stream is kept (see listen)
        self._acks: list[anyio.Event] = []  # subscriptions waiting for the stream's ack

    # -- lists ----------------------------------------------------------------------------
    @property
    def outdated(self) -> bool:
        """The server said a list changed, or the connection was replaced, since :meth:`fetch`."""
        return self.stale or self._connects != self.source.connects

    async def fetch(self, client: Client) -> None:
        """Read every page of the lists the server offers (a :meth:`request` call)."""
        connects = self.source.connects
        self.stale = False  # a change reported while reading is read next time
        caps = self.capabilities = client.server_capabilities
        if caps.resources is not None:
            self.resources = await pages(client.list_resources, "resources")
            try:
                self.templates = await pages(client.list_resource_templates, "resource_templates")
            except MCPError as exc:  # a server of resources without templates
                if exc.code != mcp_types.METHOD_NOT_FOUND:
                    raise
                self.templates = []
        if caps.prompts is not None:
            self.prompts = await pages(client.list_prompts, "prompts")
        self._connects = connects

    def lists(self, uri: str) -> bool:
        """Whether the server lists the resource ``uri``."""
        return any(resource.uri == uri for resource in self.resources)

    def templated(self, uri: str) -> bool:
        """Whether one of the server's resource templates matches ``uri``."""
        return any(_pattern(t.uri_template).fullmatch(uri) for t in self.templates)

    # -- requests -------------------------------------------------------------------------
    async def request(self, call: Callable[[Client], Awaitable[T]], timeout_s: float) -> T:
        """``call`` with the live client within ``timeout_s``; raises :class:`UpstreamFailure`."""
        source = self.source
        counted, code = True, None
        try:
            with anyio.fail_after(timeout_s):
                conn = await source.acquire()  # a reconnect, if one is due, within it too
                assert conn.client is not None
                with map_mcp_errors():
                    return_value = await call(conn.client)
        except Unreachable as gone:
            wait = gone.args[0]
            after = "" if wait is None else f" (the next attempt in {wait:.0f} s)"
            message = f"{source.name} is not reachable{after}"
        except TimeoutError:
            message = f"{source.name} did not answer within {timeout_s:g} s"
        except Disconnected as exc:
            source.lost(conn, str(exc))
            message = f"{source.name} is not reachable"
        except AnswerTooLarge:
            counted, message = False, f"{source.name} sent an answer too large to read"
        except Refused as exc:
            counted, message, code = exc.counted, cap(str(exc)), exc.code
        except NotAToolResult:
            message = f"{source.name} sent an answer that is not valid MCP"
        else:
            source.answered()
            return return_value
        raise UpstreamFailure(message, code=code, counted=counted)

    async def subscribe(self, client: Client, uri: str, on: bool) -> None:
        """Subscribe to (``on``) or unsubscribe from ``uri`` on the server (a
        :meth:`request` call): a 2025-era connection is asked (when the server offers
        subscriptions), a 2026-era one listens for it (its stream is opened again)."""
        (self.subscribed.add if on else self.subscribed.discard)(uri)
        if client.protocol_version in MODERN_PROTOCOL_VERSIONS:
            if self._listening:  # the stream opens again with it: wait for the server's ack
                acked = anyio.Event()
                self._acks.append(acked)
                self._relisten.set()
                await acked.wait()
            return
        offered = self.capabilities.resources
        if offered is None or not offered.subscribe:
            return  # the server sends no updates: nothing to ask
        # as the session's own (deprecated: the 2026 era has no such request) would send it
        request: mcp_types.SubscribeRequest | mcp_types.UnsubscribeRequest = (
            mcp_types.SubscribeRequest(params=mcp_types.SubscribeRequestParams(uri=uri))
            if on
            else mcp_types.UnsubscribeRequest(params=mcp_types.UnsubscribeRequestParams(uri=uri))
        )
        await client.session.send_request(request, mcp_types.EmptyResult)

    # -- notices --------------------------------------------------------------------------
    async def notice(self, message: IncomingMessage) -> None:
        """A 2025-era connection's notification (the source's message handler)."""
        convert = _NOTICES.get(type(message))
        if convert is not None:
            await self._event(convert(message))

    async def _event(self, event: ServerEvent) -> None:
        if not isinstance(event, ResourceUpdated):
            self.stale = True
        if self.on_event is not None:
            await self.on_event(self, event)

    async def listen(self) -> None:
        """Keep a ``subscriptions/listen`` stream open on 2026-era connections (list
        changes and the subscribed URIs), opened again on a new connection or when the
        subscriptions change. Runs until cancelled; never raises otherwise."""
        while True:
            conn = self.source.conn
            client = None if conn is None or conn.state != State.READY else conn.client
            caps = self.capabilities
            modern = client is not None and client.protocol_version in MODERN_PROTOCOL_VERSIONS
            self._listening = modern and (caps.prompts is not None or caps.resources is not None)
            if client is None or not self._listening:
                await anyio.sleep(1.0)
                continue
            self.stale = True  # events are not replayed: what changed before is read again
            self._relisten = relisten = anyio.Event()
            async with anyio.create_task_group() as tg:
                tg.start_soon(_cancel_on, relisten, tg.cancel_scope)
                tg.start_soon(_cancel_on, conn.closing, tg.cancel_scope)  # type: ignore[union-attr]
                await self._stream(client)
                tg.cancel_scope.cancel()
            if not relisten.is_set():
                await anyio.sleep(1.0)

    async def _stream(self, client: Client) -> None:
        caps = self.capabilities
        try:
            async with client.listen(
                prompts_list_changed=caps.prompts is not None,
                resources_list_changed=caps.resources is not None,
                resource_subscriptions=sorted(self.subscribed),
            ) as subscription:
                self._acked()
                async for event in subscription:
                    await self._event(event)
        except (MCPError, SubscriptionLost, ListenNotSupportedError) as exc:
            log.info("toolrelay: MCP server %s stopped listening (%s)", self.source.name, exc)
        except Exception:
            log.exception("toolrelay: listening to MCP server %s failed", self.source.name)
        self._acked()  # refused or ended: nobody waits for it

    def _acked(self) -> None:
        acks, self._acks = self._acks, []
        for ack in acks:
            ack.set()


@functools.lru_cache(maxsize=256)
def _pattern(template: str) -> re.Pattern[str]:
    """A URI template (RFC 6570) as a pattern: ``{name}`` one path segment, any other
    expression (``{+path}``, ``{?q}``, …) anything."""
    parts = re.split(r"(\{[^}]*\})", template)
    return re.compile(
        "".join(
            ("[^/?#]+" if p[1:2].isalnum() or p[1:2] == "_" else ".*")
            if p.startswith("{")
            else re.escape(p)
            for p in parts
        )
    )


async def _cancel_on(event: anyio.Event, scope: anyio.CancelScope) -> None:
    await event.wait()
    scope.cancel()
