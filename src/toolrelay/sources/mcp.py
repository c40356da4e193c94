"""MCP servers as a plugin source.

:class:`McpSource` connects to one MCP server (a local process over stdio, or a remote
endpoint over streamable HTTP) with the MCP Python SDK 2.x and offers the server's tools as
toolrelay tools::

    from toolrelay.sources.mcp import McpSource

    async with McpSource.stdio(["mcp-server-time"], breaker_key="mcp-time") as source:
        registry.register(source)
        ...  # dispatch as usual; the source closes the session and the process on exit

    async with McpSource.http("http://127.0.0.1:8000/mcp", breaker_key="docs",
                              headers={"Authorization": "Bearer …"}, prefix="docs") as source:
        registry.register(source)

How tools and results are mapped: see :mod:`.mcp_mapping` (names, risk from annotations,
size caps; ``structuredContent``, text or content blocks as data, ``isError`` as a
``ToolError``). The host's ``AuthContext`` is not sent to the server.

Deadlines and cancellation
    toolrelay cancels ``execute`` at the call's deadline; the server is then told:
    ``notifications/cancelled`` on stdio and on 2025-era HTTP sessions, and an aborted POST
    on 2026-era (sessionless) HTTP, where that is the protocol's cancellation signal.

The raw lane (stdio)
    On stdio, ``tools/call`` does not go through the SDK's client session: the transport's
    :class:`~toolrelay.sources.transport.RawLane` writes the request line itself (what the
    session would write: the same ``params``, the ``_meta`` its session stamps on this
    connection, the caller's trace context injected) and hands the response line back to
    the call, parsed with one ``json.loads`` and checked as the SDK checks it
    (:func:`~.mcp_mapping.call_result`). The SDK's session — pydantic models both ways,
    memory streams, a writer task, its request bookkeeping — cost about 0.45 ms of CPU a
    call, most of the gateway's own cost in front of an upstream. The session still does
    everything else (handshake, ``tools/list``, ping, notifications, the server's own
    requests, list-change subscriptions), and the answers are the same, failures included.
    Not on HTTP: there the SDK's transport owns the requests (session ids, per-request
    headers on 2026-era sessions, SSE streams, resumption), and an HTTP round trip costs
    far more than the session's bookkeeping; a raw lane there is left for later.

Failures and reconnection
    A server that exits, crashes or disconnects never makes an exception escape
    ``dispatch``: ``execute`` raises a retryable ``ToolError("… server is not reachable")``
    (which the breaker counts, so repeated failures become ``circuit_open``). The next call
    after a back-off reconnects (a new process for stdio, a new session for HTTP, a fresh
    ``tools/list``); until then ``describe()`` keeps offering the last known tools. How
    losses are noticed, the back-off and tool list changes: :mod:`.mcp_connection`.
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, TextIO, TypedDict

from ..contract import AuthContext, ErrorType, Risk, ToolDeclaration, ToolError
from ..registry import DEFAULT_RESERVED
from .transport import DEFAULT_MAX_MESSAGE_BYTES as _MAX_BYTES
from .transport import DEFAULT_MAX_MESSAGE_VALUES as _MAX_VALUES
from .transport import TOO_LARGE_TEXT, UNREADABLE_TEXT, capped_http_client, capped_stdio_client

try:
    import anyio
    import httpx2
    import mcp.types as mcp_types
    from mcp import MCPError, StdioServerParameters
    from mcp.client.streamable_http import streamable_http_client
    from mcp.types.version import MODERN_PROTOCOL_VERSIONS
    from opentelemetry.propagate import inject
    from pydantic import ValidationError

    from .mcp_connection import Connection, Connector, McpConnectError, Unreachable, is_disconnect
    from .mcp_mapping import (
        ToolMap,
        call_result,
        cap,
        check_risk,
        error_text,
        object_schema,
        plain_text,
        result_data,
    )
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "toolrelay.sources.mcp needs the MCP Python SDK 2.x: pip install 'toolrelay[mcp]'"
    ) from exc

if TYPE_CHECKING:
    from typing import Unpack

    from mcp.client import Transport
    from mcp.client._transport import TransportStreams

__all__ = ["McpConnectError", "McpSource", "McpSourceOptions", "object_schema"]

_PREFIX_RE = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
_HTTP_TIMEOUT = httpx2.Timeout(30.0, read=300.0)  # the SDK's defaults for MCP over HTTP
_SSE_TOO_LARGE = re.compile(r"event exceeded the \d+ byte limit")  # httpx2's SSE refusal

TransportFactory = Callable[[], "Transport"]


class McpSourceOptions(TypedDict, total=False):
    """Keyword options shared by :meth:`McpSource.stdio` and :meth:`McpSource.http`."""

    prefix: str | None
    name: str | None
    timeout_s: float
    tool_timeouts: Mapping[str, float] | None
    tags: Iterable[str]
    protocol: str
    connect_timeout_s: float
    close_timeout_s: float
    backoff_initial_s: float
    backoff_max_s: float
    reserved_properties: Iterable[str]
    count_errors: bool | str
    risk: Risk | None
    tool_risk: Mapping[str, Risk] | None
    risk_override: Risk | None
    tool_risk_override: Mapping[str, Risk] | None
    max_message_bytes: int
    max_message_values: int


def _too_large(exc: MCPError) -> bool:
    """The transport refused the answer for its size (see :mod:`.transport`)."""
    return TOO_LARGE_TEXT in exc.message or _SSE_TOO_LARGE.search(exc.message) is not None


@asynccontextmanager
async def _http_transport(
    url: str, headers: Mapping[str, str] | None, max_bytes: int, max_values: int
) -> AsyncIterator[TransportStreams]:
    async with (
        capped_http_client(max_bytes, max_values, headers=headers, timeout=_HTTP_TIMEOUT) as http,
        streamable_http_client(url, http_client=http, max_sse_event_size=max_bytes) as streams,
    ):
        yield streams


class McpSource:
    """The tools of one MCP server, as a toolrelay plugin. Use :meth:`stdio` or :meth:`http`.

    Enter it with ``async with`` before registering (the first connection is made there and
    :class:`McpConnectError` is raised when it fails); leave it to close everything.

    Args:
        transport: Builds a fresh SDK transport for every connection attempt.
        breaker_key: The breaker key of every tool of the source.
        prefix: Prefix for the tool names (``prefix="time"`` → ``time__get_current_time``).
        name: How logs and messages name the server (default: ``breaker_key``).
        timeout_s: ``timeout_s`` of every tool; ``tool_timeouts`` maps MCP tool names
            (as the server names them) to their own.
        tags: Tags for every tool, besides ``"mcp"``.
        protocol: The connect mode: ``"auto"`` (over stdio the 2025 handshake first, the
            2026-era protocol when the server refuses it; over HTTP the 2026-era protocol
            when the server speaks it, otherwise the handshake), ``"legacy"`` (always the
            handshake), or a 2026-era protocol version (always that).
        connect_timeout_s: Bound on connecting, and on each ``tools/list`` refresh.
        close_timeout_s: Bound on closing a session gracefully.
        backoff_initial_s, backoff_max_s: Wait before reconnecting after the connection
            is lost; doubled after every failed attempt, up to the maximum.
        reserved_properties: Identity properties no tool schema may declare (as the
            registry's ``reserved_properties``); such tools are skipped.
        count_errors: Which ``isError`` results are the server reporting its own outage
            (a retryable failure the breaker counts) rather than a business answer:
            ``False`` (none: the default), ``True`` (all), or a regular expression searched
            in the error text (at most 200 characters of it), e.g.
            ``"(?i)unavailable|timed? ?out|503"``.
        risk: A floor for the risk of every tool of the source: a tool's risk is the
            higher of what its hints say and this (``read`` < ``write`` < ``dangerous``).
        tool_risk: Floors per tool, by its MCP name (as the server names it) or its
            toolrelay name, e.g. ``{"delete_repo": "dangerous"}``; combined with ``risk``.
        risk_override: The risk of every tool of the source, whatever its hints and the
            floors say: the operator's word, which may also lower it (e.g. ``"read"`` for a
            server whose read-only tools carry no annotations).
        tool_risk_override: Overrides per tool (MCP or toolrelay name); they win over
            ``risk_override``. Precedence: a tool's override, the source's override, then
            the higher of the floors and the hints.
        max_message_bytes: The largest message read from the server (default 4 MiB),
            bounded while it is read (see :mod:`toolrelay.sources.transport`; used by the
            :meth:`stdio` and :meth:`http` transports). A larger answer is refused: the call
            gets a non-retryable ``invalid_output`` that the breaker does not count.
        max_message_values: The most JSON values one message may hold (default 50,000;
            commas, brackets and braces outside strings are counted), checked before it is
            parsed; a message with more is refused in the same way (not checked inside SSE
            events, whose size ``max_message_bytes`` bounds).
    """

    def __init__(
        self,
        transport: TransportFactory,
        *,
        breaker_key: str,
        prefix: str | None = None,
        name: str | None = None,
        timeout_s: float = 30.0,
        tool_timeouts: Mapping[str, float] | None = None,
        tags: Iterable[str] = (),
        protocol: str = "auto",
        connect_timeout_s: float = 10.0,
        close_timeout_s: float = 5.0,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 30.0,
        reserved_properties: Iterable[str] = DEFAULT_RESERVED,
        count_errors: bool | str = False,
        risk: Risk | None = None,
        tool_risk: Mapping[str, Risk] | None = None,
        risk_override: Risk | None = None,
        tool_risk_override: Mapping[str, Risk] | None = None,
        max_message_bytes: int = _MAX_BYTES,
        max_message_values: int = _MAX_VALUES,
    ) -> None:
        if not breaker_key or not isinstance(breaker_key, str):
            raise ValueError("breaker_key must be a non-empty string")
        if protocol not in ("auto", "legacy") and protocol not in MODERN_PROTOCOL_VERSIONS:
            raise ValueError(
                f"protocol must be 'auto', 'legacy' or one of {list(MODERN_PROTOCOL_VERSIONS)}"
            )
        for label, value in (
            ("timeout_s", timeout_s),
            ("connect_timeout_s", connect_timeout_s),
            ("close_timeout_s", close_timeout_s),
            ("backoff_initial_s", backoff_initial_s),
            ("backoff_max_s", backoff_max_s),
        ):
            if not (isinstance(value, int | float) and 0 < value < math.inf):
                raise ValueError(f"{label} must be a positive number, not {value!r}")
        for label, count, least in (
            ("max_message_bytes", max_message_bytes, 1024),
            ("max_message_values", max_message_values, 100),
        ):
            if isinstance(count, bool) or not isinstance(count, int) or count < least:
                raise ValueError(f"{label} must be an integer >= {least}, not {count!r}")
        if prefix is not None and not _PREFIX_RE.match(prefix):
            raise ValueError(f"prefix must match {_PREFIX_RE.pattern}, not {prefix!r}")
        self.max_message_bytes = max_message_bytes
        self.max_message_values = max_message_values
        self.breaker_key = breaker_key
        self.prefix = prefix
        self.name = name or breaker_key
        self.timeout_s = float(timeout_s)
        self.tool_timeouts = dict(tool_timeouts or {})
        self.tags = frozenset({"mcp", *tags})
        self.protocol = protocol
        self.connect_timeout_s = float(connect_timeout_s)
        self.close_timeout_s = float(close_timeout_s)
        self.backoff_initial_s = float(backoff_initial_s)
        self.backoff_max_s = float(max(backoff_max_s, backoff_initial_s))
        self.reserved_properties = frozenset(reserved_properties)
        self.risk = None if risk is None else check_risk("risk", risk)
        self.tool_risk = {
            str(tool): check_risk(f"tool_risk[{tool!r}]", value)
            for tool, value in (tool_risk or {}).items()
        }
        self.risk_override = (
            None if risk_override is None else check_risk("risk_override", risk_override)
        )
        self.tool_risk_override = {
            str(tool): check_risk(f"tool_risk_override[{tool!r}]", value)
            for tool, value in (tool_risk_override or {}).items()
        }
        self._outage: re.Pattern[str] | bool
        if isinstance(count_errors, str):
            try:
                self._outage = re.compile(count_errors)
            except re.error as exc:
                raise ValueError(f"count_errors is not a valid regular expression: {exc}") from None
        else:
            self._outage = bool(count_errors)
        self._tools = ToolMap(self)
        self._link = Connector(self, transport, self._tools.install)

    @property
    def connects(self) -> int:
        """How many connections were established (the first included)."""
        return self._link.connects

    # -- constructors ---------------------------------------------------------------------
    @classmethod
    def stdio(
        cls,
        command: Sequence[str],
        *,
        breaker_key: str,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        errlog: TextIO | None = None,
        **options: Unpack[McpSourceOptions],
    ) -> McpSource:
        """A server run as a local process, spoken to over its stdin and stdout.

        ``command`` is the program and its arguments. The process gets the SDK's safe
        default environment (``PATH``, ``HOME``, …) plus ``env``; its stderr goes to
        ``errlog`` (default: ``sys.stderr`` at connect time). It is respawned on reconnect.
        """
        if isinstance(command, str) or not command:
            raise ValueError("command must be a non-empty sequence: [program, *args]")
        program, *args = (str(part) for part in command)
        params = StdioServerParameters(
            command=program,
            args=args,
            env=dict(env) if env else None,
            cwd=None if cwd is None else Path(cwd),
        )

        max_bytes = options.get("max_message_bytes", _MAX_BYTES)
        max_values = options.get("max_message_values", _MAX_VALUES)

        def transport() -> Transport:
            out = errlog if errlog is not None else sys.stderr
            return capped_stdio_client(params, max_bytes, max_values, errlog=out)

        return cls(transport, breaker_key=breaker_key, **options)

    @classmethod
    def http(
        cls,
        url: str,
        *,
        breaker_key: str,
        headers: Mapping[str, str] | None = None,
        **options: Unpack[McpSourceOptions],
    ) -> McpSource:
        """A server reached over streamable HTTP at ``url``, sending ``headers`` (e.g. auth)."""
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"url must be an http(s) URL, not {url!r}")
        fixed = dict(headers or {})
        max_bytes = options.get("max_message_bytes", _MAX_BYTES)
        max_values = options.get("max_message_values", _MAX_VALUES)

        def transport() -> Transport:
            return _http_transport(url, fixed, max_bytes, max_values)

        return cls(transport, breaker_key=breaker_key, **options)

    @property
    def protocol_version(self) -> str | None:
        """The MCP protocol version of the live connection (``None`` when not connected)."""
        return self._link.protocol_version

    # -- health (the gateway's /readyz, metrics and pings read these) ---------------------
    @property
    def connection_state(self) -> Literal["connected", "reconnecting", "down"]:
        """``connected``, ``reconnecting`` (a connection attempt under way) or ``down``
        (none: the next comes after the back-off, on a call or a :meth:`ping`)."""
        return self._link.state

    @property
    def connection_failures(self) -> int:
        """Connection attempts that failed and connections lost so far, however noticed
        (by a call, a ping, or the connection itself)."""
        return self._link.failures

    @property
    def last_error(self) -> tuple[float, str] | None:
        """When (seconds since the epoch) and why the connection last failed, if ever."""
        return self._link.last_error

    @property
    def idle_s(self) -> float:
        """Seconds since the server last answered (a call, a listing or a ping)."""
        return self._link.idle_s

    async def ping(self, timeout_s: float) -> bool:
        """MCP ``ping`` within ``timeout_s``, connecting first when not connected and the
        back-off allows. A failed or unanswered ping loses the connection (counted, like a
        failed call; the next call or ping reconnects). Whether the server answered; never
        raises but cancellation."""
        return await self._link.ping(timeout_s)

    # -- the plugin -----------------------------------------------------------------------
    def describe(self) -> Sequence[ToolDeclaration]:
        """The server's tools as last listed (kept while the server is unreachable)."""
        return self._tools.decls

    def declaration(self, name: str) -> ToolDeclaration | None:
        """The declaration of one tool, by its toolrelay name (a dict lookup)."""
        entry = self._tools.entries.get(name)
        return None if entry is None else entry.decl

    async def execute(self, name: str, args: dict[str, Any], ctx: AuthContext) -> Any:
        """Call the tool on the server. ``ctx`` is not forwarded to the server."""
        entry = self._tools.entries.get(name)
        if entry is None:
            raise ToolError(
                f"{name} is no longer offered by {self.name}", error_type=ErrorType.UNKNOWN_TOOL
            )
        try:
            conn = await self._link.acquire()
        except Unreachable as gone:
            raise self._unreachable(gone.args[0]) from None
        try:
            result = await self._call(conn, entry.remote, args)
        except MCPError as exc:
            if _too_large(exc):
                raise ToolError(
                    f"{self.name} sent an answer too large to read "
                    f"(over {self.max_message_bytes} bytes or {self.max_message_values} "
                    "JSON values); it was refused",
                    error_type=ErrorType.INVALID_OUTPUT,
                    counts_as_failure=False,
                ) from None
            if exc.code == mcp_types.PARSE_ERROR and UNREADABLE_TEXT in exc.message:
                raise self._not_a_result() from None
            if is_disconnect(exc):
                self._link.lost(conn, exc.message)
                raise self._unreachable(self._link.backoff.remaining()) from None
            if exc.code in (mcp_types.INVALID_PARAMS, mcp_types.METHOD_NOT_FOUND):
                conn.refresh_wanted.set()  # our list may be stale (e.g. the tool was removed)
            failed = exc.code == mcp_types.INTERNAL_ERROR
            raise ToolError(
                f"{self.name} refused the call: {cap(exc.message)}",
                counts_as_failure=failed,
            ) from None
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream) as exc:
            self._link.lost(conn, type(exc).__name__)
            raise self._unreachable(self._link.backoff.remaining()) from None
        except ValidationError:
            raise self._not_a_result() from None
        self._link.answered()
        if isinstance(result, str):
            return result
        if result.is_error:
            text = cap(error_text(result)) or f"{name} reported an error"
            outage = self._outage
            if outage is True or (outage is not False and outage.search(text)):
                raise ToolError(text, retryable=True)  # the server's own outage: counted
            raise ToolError(text)
        return result_data(result)

    async def refresh(self) -> None:
        """Re-read ``tools/list`` now (connecting first if needed).

        Raises :class:`McpConnectError` when the server cannot be reached or listed.
        """
        await self._link.refresh()

    # -- lifecycle ------------------------------------------------------------------------
    async def __aenter__(self) -> McpSource:
        await self._link.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        return await self._link.__aexit__(exc_type, exc, tb)

    async def _call(
        self, conn: Connection, remote: str, args: dict[str, Any]
    ) -> mcp_types.CallToolResult | str:
        """``tools/call`` on the raw lane when the connection has one, else the SDK's; a
        plain text answer comes back as its text."""
        client, lane = conn.client, conn.lane
        assert client is not None
        if lane is None:
            return await client.call_tool(remote, args)
        meta = dict(conn.call_meta)
        inject(meta)  # the caller's trace context, as the SDK's session injects it
        params: dict[str, Any] = {"name": remote, "arguments": args}
        if meta:
            params["_meta"] = meta
        try:
            raw = await lane.request("tools/call", params)
        except ValueError:  # nothing sent: not strict JSON (NaN): the SDK writes it its way
            return await client.call_tool(remote, args)
        version = client.protocol_version
        text = plain_text(raw, version in MODERN_PROTOCOL_VERSIONS)
        if text is not None:
            return text
        result = call_result(raw, version)
        if result is None:  # input_required: the SDK's client drives those rounds
            return await client.call_tool(remote, args)
        return result

    def _not_a_result(self) -> ToolError:
        return ToolError(
            f"{self.name} sent an answer that is not a valid MCP tool result",
            error_type=ErrorType.INVALID_OUTPUT,
            counts_as_failure=True,
        )

    def _unreachable(self, retry_after_s: float | None) -> ToolError:
        if self._link.closed:
            return ToolError(f"{self.name} server is not connected: its source is closed")
        return ToolError(
            f"{self.name} server is not reachable", retryable=True, retry_after_s=retry_after_s
        )

    def _install(self, tools: Sequence[mcp_types.Tool]) -> int:
        return self._tools.install(tools)
