"""The connection of an :class:`~toolrelay.sources.mcp.McpSource` to its server.

:class:`Connector` owns one :class:`Connection` at a time, each in a task of its own task
group (a transport failure is contained there). A dead connection is replaced when a call
asks for one and the back-off allows; a call cancelled while a reconnect is under way
leaves it running for the next call. A tool list change (``notifications/tools/
list_changed``, or the 2026-era ``subscriptions/listen`` stream) re-reads ``tools/list``
in the background, and ``specs()`` shows it at once.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from typing import Any, Literal, Self

import anyio
import anyio.abc
import mcp.types as mcp_types
from mcp import Client, MCPError
from mcp.client import Transport
from mcp.client.subscriptions import ListenNotSupportedError, SubscriptionLost
from mcp.types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from .._compat.mcp_client import replace_tool_result_check
from .connection import DEAD, Backoff, Connection, State, pages, stamped_meta, trust_result
from .errors import McpConnectError, Unreachable, cap, innermost, is_disconnect, why
from .options import McpSourceOptions
from .relay import CALL_CHANNEL, Relay
from .stdio import StdioTransport

log = logging.getLogger("toolrelay.sources.mcp")


class Connector:
    """Connects, notices losses, and reconnects on demand. ``install`` takes each fresh
    ``tools/list`` and answers how many tools it offers."""

    def __init__(
        self,
        options: McpSourceOptions,
        name: str,
        transport: Callable[[], Transport],
        install: Callable[[Sequence[mcp_types.Tool]], int],
    ) -> None:
        self.options = options  # protocol, timeouts, back-off
        self.name = name
        self.backoff = Backoff(options.backoff_initial_s, options.backoff_max_s)
        self._transport = transport
        self._install = install
        self.conn: Connection | None = None
        self.closed = False
        self.connects = 0
        """How many connections were established (the first included)."""
        self.connection_failures = 0
        """Connection attempts that failed and connections lost so far, however noticed (by a
        call, a ping, or the connection itself)."""
        self.last_error: tuple[float, str] | None = None
        """When (seconds since the epoch) and why the connection last failed, if ever."""
        self._last_seen = time.monotonic()
        self._tg: anyio.abc.TaskGroup | None = None
        self.handshake_refused = False
        """The server refused the 2025 handshake ``auto`` offers over stdio first."""
        self.instructions: str | None = None
        """The server's ``instructions`` as of its last handshake (``None``: none yet)."""
        self.relay = Relay(name)
        """Routes the server's requests and notifications to the call they belong to."""
        self.notice: Callable[[mcp_types.ServerNotification], Awaitable[None]] | None = None
        """Told of the server's notifications besides tool list changes (a host's)."""

    # -- lifecycle ------------------------------------------------------------------------
    async def __aenter__(self) -> Self:
        if self._tg is not None or self.closed:
            raise RuntimeError("an McpSource can be entered only once")
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        try:
            conn = self._start()
            await conn.ready.wait()
            if conn.state != State.READY:
                raise McpConnectError(
                    f"could not connect to {self.name} ({why(conn.error)})"
                ) from conn.error
        except BaseException:
            tg.cancel_scope.cancel()
            tg.cancel_scope.shield = True  # a pending outer cancellation must not re-fire
            await self.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        self.closed = True
        if self.conn is not None:
            self.conn.close()
        tg, self._tg = self._tg, None
        assert tg is not None
        try:
            return await tg.__aexit__(*exc_info)
        except BaseExceptionGroup as group:
            # The connection tasks never raise, so a group holding just the body's own
            # exception is the task group wrapping it: let the original propagate as is.
            exc = exc_info[1]
            if exc is not None and list(group.exceptions) == [exc]:
                return None
            raise

    # -- health ---------------------------------------------------------------------------
    @property
    def connection_state(self) -> Literal["connected", "reconnecting", "down"]:
        """``connected``, ``reconnecting`` (a connection attempt under way) or ``down``
        (none: the next comes after the back-off, on a call or a :meth:`ping`)."""
        conn = self.conn
        if conn is None or conn.state in DEAD:
            return "down"
        return "connected" if conn.state == State.READY else "reconnecting"

    @property
    def idle_s(self) -> float:
        """Seconds since the server last answered (a call, a listing or a ping)."""
        return time.monotonic() - self._last_seen

    def answered(self) -> None:
        """The server answered something (a call, a listing, a ping)."""
        self._last_seen = time.monotonic()

    def _failed(self, reason: str) -> None:
        self.connection_failures += 1
        self.last_error = (time.time(), reason)

    async def ping(self, timeout_s: float) -> bool:
        """Connect if needed (and the back-off allows), then MCP ``ping`` within
        ``timeout_s``; a ping that fails or goes unanswered loses the connection, like a
        failed call. Whether the server answered; never raises but cancellation."""
        try:
            conn = await self.acquire()
        except Unreachable:
            return False
        assert conn.client is not None
        try:
            with anyio.fail_after(timeout_s):
                # the session's, not the client's (deprecated: 2026-era servers dropped
                # ping, but they still answer it, if only with an error, which is an answer)
                await conn.client.session.send_ping()
        except TimeoutError:
            self.lost(conn, f"no answer to ping within {timeout_s:g} s")
            return False
        except MCPError as exc:
            if is_disconnect(exc):
                self.lost(conn, exc.message)
                return False
            # any other error is still an answer: the server is there
        except Exception as exc:  # the transport's own: the connection is gone
            self.lost(conn, why(exc))
            return False
        self.answered()
        return True

    @property
    def protocol_version(self) -> str | None:
        """The MCP protocol version of the live connection (``None`` when not connected)."""
        conn = self.conn
        if conn is None or conn.state != State.READY or conn.client is None:
            return None
        return conn.client.protocol_version

    async def refresh(self) -> None:
        """Re-read ``tools/list`` now (connecting first if needed); raises
        :class:`McpConnectError` when the server cannot be reached or listed."""
        try:
            conn = await self.acquire()
        except Unreachable:
            raise McpConnectError(f"{self.name} server is not reachable") from None
        assert conn.client is not None
        try:
            await self._relist(conn.client)
        except (MCPError, ValidationError, TimeoutError) as exc:
            if isinstance(exc, MCPError) and is_disconnect(exc):
                self.lost(conn, exc.message)
            raise McpConnectError(f"{self.name}: tools/list failed ({why(exc)})") from exc

    # -- connections ----------------------------------------------------------------------
    def _start(self) -> Connection:
        assert self._tg is not None
        conn = Connection()
        conn.notice = self.notice
        self.conn = conn
        token = CALL_CHANNEL.set(None)  # the connection outlives the call that started it
        try:
            self._tg.start_soon(self._run, conn, name=f"toolrelay MCP connection to {self.name}")
        finally:
            CALL_CHANNEL.reset(token)
        return conn

    async def acquire(self) -> Connection:
        """The live connection; connects when the back-off allows. Raises ``Unreachable``."""
        while True:
            conn = self.conn
            if conn is None or conn.state in DEAD:
                if self.closed or self._tg is None:
                    raise Unreachable(None)
                wait = self.backoff.remaining()
                if wait is not None:
                    raise Unreachable(wait)
                conn = self._start()
            if conn.state == State.CONNECTING:
                await conn.ready.wait()
            if conn.state == State.READY:
                return conn
            if conn.state == State.FAILED:
                raise Unreachable(self.backoff.remaining())
            # lost or closed between connecting and now: decide again

    def lost(self, conn: Connection, reason: str) -> None:
        """A call (or a ping, or the listener) found the connection dead: close it, back
        off."""
        if conn.state == State.READY and not conn.closing.is_set():
            conn.state = State.LOST
            self._failed(cap(reason, 120))
            wait = self.backoff.failed()
            log.warning(
                "toolrelay: MCP server %s is not reachable (%s); "
                "reconnecting on a call after %.1f s",
                self.name,
                cap(reason, 80),
                wait,
            )
        conn.closing.set()

    def _client(self, conn: Connection) -> Client:
        transport = self._transport()
        lane = transport.lane if isinstance(transport, StdioTransport) else None
        mode = self.options.protocol
        if lane is not None and mode == "auto" and not self.handshake_refused:
            mode = "legacy"  # see _enter
        return conn.client_over(transport, mode, lane, self.name, self.relay.callbacks())

    async def _enter(self, stack: AsyncExitStack, conn: Connection) -> Client:
        """Connect, with ``protocol="auto"`` over stdio offering the 2025 handshake first:
        on one long-lived pipe it tells the server version, client info and capabilities
        once, where a 2026-era request carries them in ``_meta`` for the server to read on
        every call (1.5 against 1.0 ms of its CPU a call, ``bench/gateway.py``). A server
        that refuses it is started again in the SDK's ``auto`` mode, remembered for
        reconnects. Over HTTP ``auto`` is the SDK's."""
        try:
            return await stack.enter_async_context(self._client(conn))
        except Exception as exc:  # the transport's task groups wrap the server's answer
            answer = innermost(exc)
            offered = conn.mode != self.options.protocol
            if not offered or not isinstance(answer, MCPError) or is_disconnect(answer):
                raise
            self.handshake_refused = True
            log.info(
                "toolrelay: MCP server %s refused the 2025 handshake (%s); speaking the "
                "2026-era protocol to it",
                self.name,
                cap(answer.message, 80),
            )
        return await stack.enter_async_context(self._client(conn))

    async def _run(self, conn: Connection) -> None:
        """Own one connection from connect to close. Never raises (except cancellation)."""
        try:
            with anyio.CancelScope() as scope:
                conn.scope = scope
                scope.deadline = anyio.current_time() + self.options.connect_timeout_s
                async with AsyncExitStack() as stack:
                    client = await self._enter(stack, conn)
                    tg = await stack.enter_async_context(anyio.create_task_group())
                    # the shape stage checks outputSchema (see replace_tool_result_check)
                    replace_tool_result_check(client.session, trust_result)
                    # 2026-era servers send list changes only on a subscriptions/listen
                    # stream. A pinned version is adopted without asking the server, so its
                    # capabilities are unknown: listen anyway (a refusal is only logged).
                    changes = client.server_capabilities.tools
                    modern = client.protocol_version in MODERN_PROTOCOL_VERSIONS
                    pinned = conn.mode not in ("auto", "legacy")
                    if modern and (changes.list_changed if changes is not None else pinned):
                        tg.start_soon(self._listen, conn, client, changes is not None)
                    offered = await self._relist(client)
                    tg.start_soon(self.relay.set_level, client)
                    meta = stamped_meta(client) if conn.lane is not None else None
                    if meta is None:
                        conn.lane = None
                    else:
                        conn.call_meta = meta
                    tg.start_soon(self._refresher, conn, client)
                    scope.deadline = math.inf
                    conn.client = client
                    self.instructions = client.instructions
                    conn.state = State.READY
                    self.backoff.succeeded()
                    self.connects += 1
                    conn.ready.set()
                    log.info(
                        "toolrelay: connected to MCP server %s (%s, %d tools)",
                        self.name,
                        client.protocol_version,
                        offered,
                    )
                    await conn.closing.wait()
                    scope.deadline = anyio.current_time() + self.options.close_timeout_s
                    tg.cancel_scope.cancel()
            connecting = conn.state == State.CONNECTING
            if scope.cancelled_caught and connecting and not conn.closing.is_set():
                conn.error = TimeoutError(
                    f"no connection within {self.options.connect_timeout_s:g} s"
                )
        except Exception as exc:  # the transport's task groups raise ExceptionGroups
            conn.error = exc
            if conn.state == State.READY:
                self.lost(conn, why(exc))
        finally:
            if conn.state == State.CONNECTING:
                conn.state = State.FAILED
                wait = self.backoff.failed()
                if not self.closed:
                    self._failed(why(conn.error))
                    log.warning(
                        "toolrelay: could not connect to MCP server %s (%s); next attempt "
                        "on a call after %.1f s",
                        self.name,
                        why(conn.error),
                        wait,
                    )
            elif conn.state == State.READY:
                conn.state = State.CLOSED
            conn.closing.set()
            conn.ready.set()

    # -- tool list changes ----------------------------------------------------------------
    async def _listen(self, conn: Connection, client: Client, advertised: bool) -> None:
        """Keep a tools-changed subscription open; every event (and every re-listen, since
        events are not replayed) asks for a refresh. ``advertised``: the server said it
        reports changes (a refusal is then a warning; otherwise news)."""
        while not conn.closing.is_set():
            try:
                async with client.listen(tools_list_changed=True) as subscription:
                    conn.refresh_wanted.set()  # covers changes between tools/list and the ack
                    async for _event in subscription:
                        conn.refresh_wanted.set()
            except MCPError as exc:
                if is_disconnect(exc):
                    self.lost(conn, exc.message)
                else:
                    log.log(
                        logging.WARNING if advertised else logging.INFO,
                        "toolrelay: MCP server %s refused to report tool changes: %s",
                        self.name,
                        cap(exc.message, 80),
                    )
                return
            except SubscriptionLost as exc:
                cause = exc.__cause__
                if isinstance(cause, MCPError) and is_disconnect(cause):
                    self.lost(conn, cause.message)
                    return
            except ListenNotSupportedError:
                return
            except Exception:
                log.exception("toolrelay: listening to MCP server %s failed", self.name)
                return
            await anyio.sleep(self.options.backoff_initial_s)

    async def _refresher(self, conn: Connection, client: Client) -> None:
        while True:
            await conn.refresh_wanted.wait()
            conn.refresh_wanted = anyio.Event()
            try:
                await self._relist(client)
            except Exception as exc:
                if isinstance(exc, MCPError) and is_disconnect(exc):
                    self.lost(conn, exc.message)
                    return
                reason = cap(exc.message, 80) if isinstance(exc, MCPError) else type(exc).__name__
                log.warning("toolrelay: MCP server %s: tools/list failed: %s", self.name, reason)

    async def _relist(self, client: Client) -> int:
        """Read ``tools/list`` within ``connect_timeout_s`` and install it; how many tools."""
        with anyio.fail_after(self.options.connect_timeout_s):
            tools = await pages(client.list_tools, "tools")
        self.answered()
        return self._install(tools)
