"""One connection of an MCP source to its server, and the back-off between attempts.

A :class:`Connection` is one attempt and, when it succeeds, the live SDK client;
:class:`~.mcp_connection.Connector` owns one at a time. :class:`Backoff` says when the
next attempt may start. :func:`pages` and :func:`stamped_meta` read what a live client
knows.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import mcp.types as mcp_types
from mcp import Client
from mcp.client import IncomingMessage, Transport

from .._compat.mcp_client import session_stamp
from .._version import __version__
from .rawlane import RawLane

log = logging.getLogger("toolrelay.sources.mcp")

_MAX_LIST_PAGES = 100


async def pages(lister: Callable[..., Awaitable[Any]], field: str) -> list[Any]:
    """Every page of an MCP list (at most :data:`_MAX_LIST_PAGES`), e.g.
    ``pages(client.list_tools, "tools")``."""
    items: list[Any] = []
    cursor: str | None = None
    for _ in range(_MAX_LIST_PAGES):
        page = await lister(cursor=cursor)
        items.extend(getattr(page, field))
        cursor = page.next_cursor
        if cursor is None:
            break
    return items


def stamped_meta(client: Client) -> dict[str, Any] | None:
    """The ``_meta`` the SDK's session puts on a ``tools/call`` of this connection (on
    2026-era connections: the protocol version, client info and capabilities; on 2025-era
    ones: nothing), read once from the session's stamp; ``None`` when the SDK has none."""
    stamp = session_stamp(client.session)
    if stamp is None:
        return None
    data: dict[str, Any] = {"method": "tools/call", "params": {"name": "", "arguments": {}}}
    stamp(data, {})
    meta = data["params"].get("_meta", {})
    return dict(meta) if isinstance(meta, dict) else None


async def trust_result(name: str, result: Any) -> None:
    """Stands in for the SDK's own output check (see ``Connector._run``)."""


class State:
    CONNECTING = "connecting"
    READY = "ready"
    FAILED = "failed"
    LOST = "lost"
    CLOSED = "closed"


DEAD = frozenset({State.FAILED, State.LOST, State.CLOSED})


class Connection:
    """One connection attempt and, when it succeeds, the live SDK client."""

    def __init__(self) -> None:
        self.state = State.CONNECTING
        self.client: Client | None = None
        self.ready = anyio.Event()
        self.closing = anyio.Event()
        self.refresh_wanted = anyio.Event()
        self.scope: anyio.CancelScope | None = None
        self.error: BaseException | None = None
        self.lane: RawLane | None = None
        """The stdio transport's raw lane for ``tools/call`` (``None``: the SDK's path)."""
        self.mode = "auto"
        """The SDK connect mode this connection was made with."""
        self.call_meta: dict[str, Any] = {}
        """The ``_meta`` the SDK's session stamps on every request of this connection."""
        self.notice: Callable[[mcp_types.ServerNotification], Awaitable[None]] | None = None
        """Told of the server's other notifications (the source's ``notice``)."""

    def client_over(
        self,
        transport: Transport,
        mode: str,
        lane: RawLane | None,
        server: str,
        callbacks: dict[str, Any],
    ) -> Client:
        """An SDK client for this connection (not yet entered) in connect ``mode``, with
        ``lane`` for ``tools/call`` when the transport has one (``None``: the SDK's path)
        and the relay's ``callbacks`` (:meth:`~.relay.Relay.callbacks`)."""

        async def on_message(message: IncomingMessage) -> None:
            if isinstance(message, mcp_types.ToolListChangedNotification):
                self.refresh_wanted.set()
            elif self.notice is not None and not isinstance(message, Exception):
                await self.notice(message)  # resources and prompts (.mcp_lists)
            elif isinstance(message, Exception):
                log.warning(
                    "toolrelay: MCP server %s sent something unreadable (%s)",
                    server,
                    type(message).__name__,
                )

        self.mode, self.lane = mode, lane
        return Client(
            transport,
            mode=mode,
            message_handler=on_message,
            client_info=mcp_types.Implementation(name="toolrelay", version=__version__),
            cache=None,  # the source keeps its own copy of the listing and re-reads on change
            **callbacks,
        )

    def close(self) -> None:
        self.closing.set()
        if self.state == State.CONNECTING and self.scope is not None:
            self.scope.cancel()


class Backoff:
    """When the next attempt may start: ``initial_s`` doubled per attempt that failed in a
    row, up to ``max_s`` (none failed: at once)."""

    def __init__(self, initial_s: float, max_s: float) -> None:
        self.initial_s, self.max_s = initial_s, max(max_s, initial_s)
        self.failures = 0
        self.retry_at = -math.inf

    def failed(self) -> float:
        """Count a failed attempt; the wait before the next one."""
        self.failures += 1
        wait = min(self.initial_s * 2.0 ** min(self.failures - 1, 64), self.max_s)
        self.retry_at = anyio.current_time() + wait
        return wait

    def succeeded(self) -> None:
        self.failures = 0

    def remaining(self) -> float | None:
        """Seconds until the next attempt may start (``None``: now)."""
        wait = self.retry_at - anyio.current_time()
        return wait if wait > 0 else None
