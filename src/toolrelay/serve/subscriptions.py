"""Who holds which resource subscription of the upstreams.

An upstream is subscribed to a URI (``resources/subscribe``, or listened to on a 2026-era
connection: :meth:`~toolrelay.sources.mcp_lists.Listing.subscribe`) while some client holds
it: a 2025-era connection that subscribed, until it unsubscribes or closes, or a 2026-era
``subscriptions/listen`` stream that asked for it, while the stream is open. The last one
leaving unsubscribes it. An upstream's ``notifications/resources/updated`` reaches the
subscribed 2025-era connections (:meth:`Subscriptions.updated`).
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from functools import partial
from typing import Any

import anyio
import mcp.types as types
from mcp.server.context import ServerRequestContext
from mcp.server.session import ServerSession
from mcp.shared.exceptions import MCPError

from .._compat.mcp_server import connection_of
from ..sources.mcp_lists import Listing

log = logging.getLogger("toolrelay.serve")

NOTIFY_TIMEOUT_S = 2.0
Ask = Callable[[Listing, Callable[[Any], Awaitable[None]]], Awaitable[None]]


class Subscriptions:
    """The subscriptions of the gateway's clients; ``owner`` routes a URI to its upstream
    (refusing one the caller may not read), ``ask`` sends one request to it."""

    def __init__(self, owner: Callable[[str], Listing], ask: Ask) -> None:
        self._owner = owner
        self._ask = ask
        self._subscribers: dict[str, dict[int, ServerSession]] = {}
        """The 2025-era connections subscribed to each URI."""
        self._listened: Counter[str] = Counter()
        """How many 2026-era streams hold each URI."""

    async def _upstream(self, listing: Listing, uri: str, on: bool) -> None:
        await self._ask(listing, partial(listing.subscribe, uri=uri, on=on))

    async def subscribe(
        self, ctx: ServerRequestContext[Any], params: types.SubscribeRequestParams
    ) -> types.EmptyResult:
        uri = str(params.uri)
        listing = self._owner(uri)
        subscribers = self._subscribers.setdefault(uri, {})
        first = not subscribers and not self._listened[uri]
        connection = connection_of(ctx.session)
        key = id(ctx.session if connection is None else connection)
        if key not in subscribers and connection is not None:
            connection.exit_stack.push_async_callback(self._gone, listing, uri, key)
        subscribers[key] = ctx.session  # held already: another's unsubscribe meanwhile keeps it
        if first:
            try:
                await self._upstream(listing, uri, True)
            except MCPError:
                self._forget(uri, key)
                raise
        return types.EmptyResult()

    async def unsubscribe(
        self, ctx: ServerRequestContext[Any], params: types.UnsubscribeRequestParams
    ) -> types.EmptyResult:
        uri = str(params.uri)
        listing = self._owner(uri)
        connection = connection_of(ctx.session)
        if self._forget(uri, id(ctx.session if connection is None else connection)):
            await self._upstream(listing, uri, False)
        return types.EmptyResult()

    def _forget(self, uri: str, key: int) -> bool:
        """Forget a subscriber of ``uri``: whether it was the last to hold it upstream."""
        subscribers = self._subscribers.get(uri, {})
        if subscribers.pop(key, None) is None:
            return False
        if not subscribers:
            self._subscribers.pop(uri, None)
        return not subscribers and not self._listened[uri]

    async def _gone(self, listing: Listing, uri: str, key: int) -> None:
        """A subscriber's connection closed (or cannot be reached): forgotten, and the
        upstream unsubscribed when it was the last."""
        if self._forget(uri, key):
            await self._drop(listing, uri)

    async def _drop(self, listing: Listing, uri: str) -> None:
        """Unsubscribe the upstream (shielded, bounded; a refusal is only dropped)."""
        shielded = anyio.CancelScope(shield=True)
        with shielded, anyio.move_on_after(NOTIFY_TIMEOUT_S), contextlib.suppress(MCPError):
            await self._upstream(listing, uri, False)

    async def updated(self, listing: Listing, uri: str) -> None:
        """Tell the 2025-era connections subscribed to ``uri`` that it changed."""
        for key, session in list(self._subscribers.get(uri, {}).items()):
            with anyio.move_on_after(NOTIFY_TIMEOUT_S):
                try:
                    await session.send_resource_updated(uri)
                except Exception:  # the client is gone
                    await self._gone(listing, uri, key)

    @contextlib.asynccontextmanager
    async def watching(self, uris: Sequence[str]) -> AsyncIterator[None]:
        """While a 2026-era client's ``subscriptions/listen`` stream is open: its resource
        subscriptions held on their upstreams (a refusal is only logged: the stream stays)."""
        held = []
        for uri in uris:
            try:
                listing = self._owner(uri)
                if not self._listened[uri]:
                    await self._upstream(listing, uri, True)
            except MCPError as exc:
                log.info("toolrelay serve: no upstream subscription to %s: %s", uri[:200], exc)
                continue
            self._listened[uri] += 1
            held.append((listing, uri))
        try:
            yield
        finally:
            dropped = []
            for listing, uri in held:  # every count first: one upstream's hang skips none
                self._listened[uri] -= 1
                if not self._listened[uri]:
                    del self._listened[uri]
                    if not self._subscribers.get(uri):
                        dropped.append((listing, uri))
            with anyio.CancelScope(shield=True):
                async with anyio.create_task_group() as tg:
                    for listing, uri in dropped:
                        tg.start_soon(self._drop, listing, uri)
