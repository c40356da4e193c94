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

How tools are mapped
    ``inputSchema`` → ``parameters`` (a schema without a top-level ``"type"`` gets
    ``"type": "object"``; any other non-object schema is skipped with a log line — though
    the SDK 2.x itself already refuses a whole ``tools/list`` that contains such a schema,
    and the connection then fails with the SDK's ``ValidationError``),
    ``outputSchema`` → ``output_schema``, ``description`` (or the title) → ``description``.
    Annotations give the risk: ``destructiveHint: true`` → ``dangerous`` (even beside
    ``readOnlyHint``: contradictory hints resolve to the riskier), otherwise
    ``readOnlyHint`` → ``read``, anything else (no hints at all included) → ``write``;
    the source's ``risk`` and ``tool_risk`` floors then raise it (never lower it);
    ``idempotentHint`` → ``idempotent`` (absent: toolrelay's default, ``risk == "read"``).
    (The spec's own default for an absent ``destructiveHint`` is ``true``; toolrelay asks for
    approval of ``write`` tools by default too. Hints come from the server: trust them only
    as far as you trust the server.)
    Sizes are capped as the list is read: a description longer than 2,000 characters is cut
    (ending with ``…``), and a tool whose input or output schema serialises to more than
    64 KiB of compact JSON, or nests objects and arrays deeper than 32 levels, is skipped
    with a log line.
    Names are sanitised to toolrelay's ``^[A-Za-z0-9_-]{1,64}$`` (other characters become
    ``_``) and prefixed with ``prefix + "__"`` when a prefix is given; a name that still does
    not fit, a duplicate, or a declaration toolrelay's registry would refuse (e.g. a schema
    declaring an identity property) is skipped with a log line, so one odd tool never stops
    the others from being registered. Every tool gets the source's ``breaker_key``, its
    ``timeout_s`` (or ``tool_timeouts[remote name]``) and the tags ``{"mcp", *tags}``.

How results are mapped
    ``structuredContent`` is returned when present. Otherwise text content is returned as
    it is, never JSON-decoded (a single text item → that string, several → a list of
    strings), and any other content (images, audio, resources) as a list of the MCP
    content blocks as JSON objects. ``isError: true`` raises a non-retryable
    :class:`~toolrelay.contract.ToolError` carrying the server's text (capped at 200
    characters, credentials masked before the cut, and a word the cut would split dropped
    whole); it does not count against the breaker (it is the tool's answer). A JSON-RPC
    error answer becomes a non-retryable ``tool_error`` too (counted only when it is an
    internal error). The host's ``AuthContext`` is not sent to the server.

Deadlines and cancellation
    toolrelay cancels ``execute`` at the call's deadline; the SDK then tells the server:
    ``notifications/cancelled`` on stdio and on 2025-era HTTP sessions, and an aborted POST
    on 2026-era (sessionless) HTTP, where that is the protocol's cancellation signal.

Failures and reconnection
    A server that exits, crashes or disconnects never makes an exception escape
    ``dispatch``: ``execute`` raises a retryable ``ToolError("… server is not reachable")``
    (which the breaker counts, so repeated failures become ``circuit_open``). The next call
    after a back-off (``backoff_initial_s``, doubling per failed reconnect up to
    ``backoff_max_s``) reconnects: a new process for stdio, a new session for HTTP, and a
    fresh ``tools/list``. Until then ``describe()`` keeps offering the last known tools.
    A loss is noticed by the call that meets it (or, on 2026-era connections, by the
    ``subscriptions/listen`` stream); a call cancelled at its deadline while a reconnect is
    under way leaves the reconnect running, so the next call finds it done.

Tool list changes
    ``notifications/tools/list_changed`` (and, on 2026-era connections, the
    ``subscriptions/listen`` stream the source opens when the server advertises
    ``tools.listChanged``) makes the source re-read ``tools/list`` in the background; the
    registry reads ``describe()`` on every lookup, so ``specs()`` shows the change at once.

Every task and process belongs to the ``async with`` block: the connection (the SDK's
session and transport task groups) runs in a task of the source's own task group, so a
transport failure is contained there, and leaving the block closes the session and stops
the server process.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import sys
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TextIO, TypedDict

import anyio
import anyio.abc

from .. import __version__
from ..contract import RISKS, AuthContext, ErrorType, Risk, ToolDeclaration, ToolError
from ..redact import Redactor
from ..registry import DEFAULT_RESERVED, NAME_RE, RegistrationError, compile_tool
from .transport import (
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_MAX_MESSAGE_VALUES,
    TOO_LARGE_TEXT,
    UNREADABLE_TEXT,
    capped_http_client,
    capped_stdio_client,
)

try:
    import httpx2
    import mcp.types as mcp_types
    from mcp import Client, MCPError, StdioServerParameters
    from mcp.client.streamable_http import streamable_http_client
    from mcp.client.subscriptions import ListenNotSupportedError, SubscriptionLost
    from mcp.types.version import MODERN_PROTOCOL_VERSIONS
    from pydantic import ValidationError
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "toolrelay.sources.mcp needs the MCP Python SDK 2.x: pip install 'toolrelay[mcp]'"
    ) from exc

if TYPE_CHECKING:
    from typing import Unpack

    from mcp.client import IncomingMessage, Transport
    from mcp.client._transport import TransportStreams

__all__ = ["McpConnectError", "McpSource", "McpSourceOptions"]

log = logging.getLogger("toolrelay.sources.mcp")

MAX_ERROR_CHARS = 200
"""How much of a server's error text reaches the model."""
_MAX_WORD_CHARS = 100  # a word the cap would split is dropped whole up to this length
_MAX_REDACTED_CHARS = 16384  # of a server's text, at most this much is read at all
_REDACT = Redactor()

MAX_DESCRIPTION_CHARS = 2000
"""A tool description longer than this is cut (ending with ``…``)."""
MAX_SCHEMA_BYTES = 64 * 1024
"""A tool whose input or output schema serialises (compact JSON, UTF-8) to more is skipped."""
MAX_SCHEMA_DEPTH = 32
"""A tool whose input or output schema nests objects and arrays deeper is skipped."""

_PREFIX_RE = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
_INVALID_CHARS = re.compile(r"[^A-Za-z0-9_-]")
_MAX_LIST_PAGES = 100
_HTTP_TIMEOUT = httpx2.Timeout(30.0, read=300.0)  # the SDK's defaults for MCP over HTTP
_SSE_TOO_LARGE = re.compile(r"event exceeded the \d+ byte limit")  # httpx2's SSE refusal

TransportFactory = Callable[[], "Transport"]


class McpConnectError(ConnectionError):
    """The source could not connect to its MCP server or read its tool list (raised by
    ``async with`` and :meth:`McpSource.refresh`; tool calls get a ``ToolError`` instead)."""


async def _trust_result(name: str, result: Any) -> None:
    """Stands in for the SDK's own output check (see ``McpSource._run``)."""


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
    max_message_bytes: int
    max_message_values: int


class _State:
    CONNECTING = "connecting"
    READY = "ready"
    FAILED = "failed"
    LOST = "lost"
    CLOSED = "closed"


_DEAD = frozenset({_State.FAILED, _State.LOST, _State.CLOSED})


class _Unreachable(Exception):
    def __init__(self, retry_after_s: float | None) -> None:
        super().__init__()
        self.retry_after_s = retry_after_s


class _Connection:
    """One connection attempt and, when it succeeds, the live SDK client."""

    def __init__(self) -> None:
        self.state = _State.CONNECTING
        self.client: Client | None = None
        self.ready = anyio.Event()
        self.closing = anyio.Event()
        self.refresh_wanted = anyio.Event()
        self.scope: anyio.CancelScope | None = None
        self.error: BaseException | None = None

    def close(self) -> None:
        self.closing.set()
        if self.state == _State.CONNECTING and self.scope is not None:
            self.scope.cancel()

    def want_refresh(self) -> None:
        self.refresh_wanted.set()


@dataclass(frozen=True, slots=True)
class _Entry:
    remote: str
    decl: ToolDeclaration


def _cap(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """A server's text as one line of at most ``limit`` characters, for a message or a log
    line: credentials masked (default patterns; the dispatcher applies the host's
    ``secret_patterns`` to messages too), then cut where no secret can be shown in part —
    before a word the limit would split, unless that word is very long."""
    one_line = " ".join(_REDACT(text[:_MAX_REDACTED_CHARS]).split())
    if len(one_line) > limit:
        cut = one_line[: limit - 1]
        space = cut.rfind(" ")
        if one_line[limit - 1] != " " and space > 0 and space >= limit - 1 - _MAX_WORD_CHARS:
            cut = cut[:space]  # drop the split word whole: it may be a token
        one_line = cut.rstrip() + "…"
    return one_line


def _too_large(exc: MCPError) -> bool:
    """The transport refused the answer for its size (see :mod:`.transport`)."""
    return TOO_LARGE_TEXT in exc.message or _SSE_TOO_LARGE.search(exc.message) is not None


def _why(exc: BaseException | None) -> str:
    """A short account of a failure, for logs: the innermost exception, groups flattened."""
    if exc is None:
        return "cancelled"
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = _cap(str(exc), 120)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


_SESSION_GONE_CODES = frozenset({mcp_types.INVALID_REQUEST, -32001})


def _is_disconnect(exc: MCPError) -> bool:
    """Errors that mean the connection is gone, not that the server said no.

    Besides ``CONNECTION_CLOSED``: a 2025-era HTTP server that no longer knows our session
    (it restarted, or expired it) answers HTTP 404, after which the spec says the client
    must start a new session. The SDK does not surface the status, only the JSON-RPC error
    — its own ``INVALID_REQUEST "Session terminated"``, the SDK server's ``INVALID_REQUEST
    "Session not found"``, the TypeScript SDK's ``-32001 "Session not found"`` — so those
    are recognised by code and by the word "session".
    """
    if exc.code == mcp_types.CONNECTION_CLOSED:
        return True
    return exc.code in _SESSION_GONE_CODES and "session" in exc.message.lower()


def object_schema(schema: Mapping[str, Any]) -> dict[str, Any] | None:
    """``schema`` as an object schema, or ``None`` when it describes something else.

    A schema with no top-level ``type`` (``{}``, or just ``properties``) is made an object
    schema: tool arguments are always a JSON object. Note that the MCP SDK 2.x already
    rejects a ``tools/list`` whose input schemas lack ``"type": "object"``, so over the SDK
    this only ever sees conforming schemas; it is the last line of defence.
    """
    if not isinstance(schema, Mapping):
        return None
    kind = schema.get("type")
    if kind == "object":
        return dict(schema)
    if kind is None:
        return {**schema, "type": "object"}
    return None


def _schema_depth(schema: Any, limit: int) -> int:
    """How deeply ``schema`` nests objects and arrays, counted up to ``limit + 1`` (without
    recursion, so no nesting is too deep to measure)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(schema, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, Mapping | list | tuple):
            deepest = max(deepest, depth)
            if depth > limit:
                return deepest
            children = node.values() if isinstance(node, Mapping) else node
            stack.extend((child, depth + 1) for child in children)
    return deepest


def _schema_problem(what: str, schema: Any) -> str | None:
    """Why ``schema`` is too big to accept, or ``None``."""
    if schema is None:
        return None
    if _schema_depth(schema, MAX_SCHEMA_DEPTH) > MAX_SCHEMA_DEPTH:
        return f"its {what} nests deeper than {MAX_SCHEMA_DEPTH} levels"
    try:
        size = len(json.dumps(schema, separators=(",", ":"), ensure_ascii=False).encode())
    except (TypeError, ValueError):
        return f"its {what} is not JSON"
    if size > MAX_SCHEMA_BYTES:
        return f"its {what} is larger than {MAX_SCHEMA_BYTES} bytes ({size})"
    return None


def _description(text: str) -> str:
    if len(text) <= MAX_DESCRIPTION_CHARS:
        return text
    return text[: MAX_DESCRIPTION_CHARS - 1] + "…"


def _risk(annotations: mcp_types.ToolAnnotations | None) -> tuple[Risk, bool | None]:
    """The risk the server's hints claim. ``destructiveHint: true`` wins over
    ``readOnlyHint``: contradictory hints never make a tool look safer than either says."""
    if annotations is None:
        return "write", None
    idempotent = annotations.idempotent_hint
    if annotations.destructive_hint:
        return "dangerous", idempotent
    if annotations.read_only_hint:
        return "read", idempotent
    return "write", idempotent


def _riskier(a: Risk, b: Risk | None) -> Risk:
    """The higher of two risks (``read`` < ``write`` < ``dangerous``)."""
    if b is None:
        return a
    return a if RISKS.index(a) >= RISKS.index(b) else b


def _check_risk(label: str, value: Any) -> Risk:
    if value not in RISKS:
        raise ValueError(f"{label} must be one of {list(RISKS)}, not {value!r}")
    risk: Risk = value
    return risk


def _result_data(result: mcp_types.CallToolResult) -> Any:
    """What the model gets from a successful call (see the module docstring)."""
    if result.structured_content is not None or "structured_content" in result.model_fields_set:
        return result.structured_content
    content = result.content
    if all(isinstance(block, mcp_types.TextContent) for block in content):
        texts = [block.text for block in content if isinstance(block, mcp_types.TextContent)]
        if not texts:
            return None
        return texts[0] if len(texts) == 1 else texts
    return [block.model_dump(mode="json", by_alias=True, exclude_none=True) for block in content]


def _error_text(result: mcp_types.CallToolResult) -> str:
    return " ".join(
        block.text for block in result.content if isinstance(block, mcp_types.TextContent)
    )


@asynccontextmanager
async def _http_transport(
    url: str, headers: Mapping[str, str] | None, max_bytes: int, max_values: int
) -> AsyncIterator[TransportStreams]:
    async with (
        capped_http_client(max_bytes, max_values, headers=headers, timeout=_HTTP_TIMEOUT) as http,
        streamable_http_client(url, http_client=http, max_sse_event_size=max_bytes) as streams,
    ):
        yield streams


async def _never_called(args: dict[str, Any], ctx: AuthContext) -> None:  # pragma: no cover
    """Stands in for the handler when a declaration is checked (never called)."""


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
        protocol: The SDK's connect mode: ``"auto"`` (2026-era if the server speaks it,
            otherwise the 2025 handshake), ``"legacy"`` (always the handshake), or a
            2026-era protocol version.
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
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        max_message_values: int = DEFAULT_MAX_MESSAGE_VALUES,
    ) -> None:
        if not breaker_key or not isinstance(breaker_key, str):
            raise ValueError("breaker_key must be a non-empty string")
        if prefix is not None and not _PREFIX_RE.match(prefix):
            raise ValueError(f"prefix must match {_PREFIX_RE.pattern}, not {prefix!r}")
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
        self._transport = transport
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
        self.risk = None if risk is None else _check_risk("risk", risk)
        self.tool_risk = {
            str(tool): _check_risk(f"tool_risk[{tool!r}]", value)
            for tool, value in (tool_risk or {}).items()
        }
        self._outage: re.Pattern[str] | bool
        if isinstance(count_errors, str):
            try:
                self._outage = re.compile(count_errors)
            except re.error as exc:
                raise ValueError(f"count_errors is not a valid regular expression: {exc}") from None
        else:
            self._outage = bool(count_errors)

        self._entries: dict[str, _Entry] = {}
        self._decls: tuple[ToolDeclaration, ...] = ()
        self._tg: anyio.abc.TaskGroup | None = None
        self._conn: _Connection | None = None
        self._closed = False
        self._failures = 0
        self._retry_at = -math.inf
        self._skips_logged: set[tuple[str, str]] = set()
        self.connects = 0
        """How many connections were established (the first included)."""

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

        max_bytes = options.get("max_message_bytes", DEFAULT_MAX_MESSAGE_BYTES)
        max_values = options.get("max_message_values", DEFAULT_MAX_MESSAGE_VALUES)

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
        max_bytes = options.get("max_message_bytes", DEFAULT_MAX_MESSAGE_BYTES)
        max_values = options.get("max_message_values", DEFAULT_MAX_MESSAGE_VALUES)

        def transport() -> Transport:
            return _http_transport(url, fixed, max_bytes, max_values)

        return cls(transport, breaker_key=breaker_key, **options)

    @property
    def protocol_version(self) -> str | None:
        """The MCP protocol version of the live connection (``None`` when not connected)."""
        conn = self._conn
        if conn is None or conn.state != _State.READY or conn.client is None:
            return None
        return conn.client.protocol_version

    # -- the plugin -----------------------------------------------------------------------
    def describe(self) -> Sequence[ToolDeclaration]:
        """The server's tools as last listed (kept while the server is unreachable)."""
        return self._decls

    def declaration(self, name: str) -> ToolDeclaration | None:
        """The declaration of one tool, by its toolrelay name (a dict lookup)."""
        entry = self._entries.get(name)
        return None if entry is None else entry.decl

    async def execute(self, name: str, args: dict[str, Any], ctx: AuthContext) -> Any:
        """Call the tool on the server. ``ctx`` is not forwarded to the server."""
        entry = self._entries.get(name)
        if entry is None:
            raise ToolError(
                f"{name} is no longer offered by {self.name}", error_type=ErrorType.UNKNOWN_TOOL
            )
        try:
            conn = await self._acquire()
        except _Unreachable as gone:
            raise self._unreachable(gone.retry_after_s) from None
        assert conn.client is not None
        try:
            result = await conn.client.call_tool(entry.remote, args)
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
                raise ToolError(
                    f"{self.name} sent an answer that is not a valid MCP tool result",
                    error_type=ErrorType.INVALID_OUTPUT,
                    counts_as_failure=True,
                ) from None
            if _is_disconnect(exc):
                self._lost(conn, exc.message)
                raise self._unreachable(self._wait()) from None
            if exc.code in (mcp_types.INVALID_PARAMS, mcp_types.METHOD_NOT_FOUND):
                conn.want_refresh()  # our list may be stale (e.g. the tool was removed)
            failed = exc.code == mcp_types.INTERNAL_ERROR
            raise ToolError(
                f"{self.name} refused the call: {_cap(exc.message)}",
                counts_as_failure=failed,
            ) from None
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream) as exc:
            self._lost(conn, type(exc).__name__)
            raise self._unreachable(self._wait()) from None
        except ValidationError:
            raise ToolError(
                f"{self.name} sent an answer that is not a valid MCP tool result",
                error_type=ErrorType.INVALID_OUTPUT,
                counts_as_failure=True,
            ) from None
        except RuntimeError as exc:
            # The SDK checks structuredContent against the tool's outputSchema itself.
            if "structured content" not in str(exc):
                raise
            raise ToolError(
                f"{name} returned structured output that breaks its output schema",
                error_type=ErrorType.INVALID_OUTPUT,
                counts_as_failure=True,
            ) from None
        if result.is_error:
            text = _cap(_error_text(result)) or f"{name} reported an error"
            outage = self._outage
            if outage is True or (outage is not False and outage.search(text)):
                raise ToolError(text, retryable=True)  # the server's own outage: counted
            raise ToolError(text)
        return _result_data(result)

    async def refresh(self) -> None:
        """Re-read ``tools/list`` now (connecting first if needed).

        Raises :class:`McpConnectError` when the server cannot be reached or listed.
        """
        try:
            conn = await self._acquire()
        except _Unreachable:
            raise McpConnectError(f"{self.name} server is not reachable") from None
        assert conn.client is not None
        try:
            with anyio.fail_after(self.connect_timeout_s):
                tools = await self._list_tools(conn.client)
        except (MCPError, ValidationError, TimeoutError) as exc:
            if isinstance(exc, MCPError) and _is_disconnect(exc):
                self._lost(conn, exc.message)
            raise McpConnectError(f"{self.name}: tools/list failed ({_why(exc)})") from exc
        self._install(tools)

    # -- lifecycle ------------------------------------------------------------------------
    async def __aenter__(self) -> McpSource:
        if self._tg is not None or self._closed:
            raise RuntimeError("an McpSource can be entered only once")
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        try:
            conn = self._start()
            await conn.ready.wait()
            if conn.state != _State.READY:
                raise McpConnectError(
                    f"could not connect to {self.name} ({_why(conn.error)})"
                ) from conn.error
        except BaseException:
            self._closed = True
            if self._conn is not None:
                self._conn.close()
            tg.cancel_scope.cancel()
            tg.cancel_scope.shield = True  # a pending outer cancellation must not re-fire
            try:
                await tg.__aexit__(None, None, None)
            finally:
                self._tg = None
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        self._closed = True
        if self._conn is not None:
            self._conn.close()
        tg, self._tg = self._tg, None
        assert tg is not None
        try:
            return await tg.__aexit__(exc_type, exc, tb)
        except BaseExceptionGroup as group:
            # The connection tasks never raise, so a group holding just the body's own
            # exception is the task group wrapping it: let the original propagate as is.
            if exc is not None and list(group.exceptions) == [exc]:
                return None
            raise

    # -- connections ------------------------------------------------------------------------
    def _backoff(self) -> float:
        return float(
            min(self.backoff_initial_s * 2 ** max(self._failures - 1, 0), self.backoff_max_s)
        )

    def _wait(self) -> float | None:
        wait = self._retry_at - anyio.current_time()
        return wait if wait > 0 else None

    def _unreachable(self, retry_after_s: float | None) -> ToolError:
        if self._closed:
            return ToolError(f"{self.name} server is not connected: its source is closed")
        return ToolError(
            f"{self.name} server is not reachable", retryable=True, retry_after_s=retry_after_s
        )

    def _start(self) -> _Connection:
        assert self._tg is not None
        conn = _Connection()
        self._conn = conn
        self._tg.start_soon(self._run, conn, name=f"toolrelay MCP connection to {self.name}")
        return conn

    async def _acquire(self) -> _Connection:
        """The live connection; connects when the back-off allows. Raises ``_Unreachable``."""
        while True:
            conn = self._conn
            if conn is None or conn.state in _DEAD:
                if self._closed or self._tg is None:
                    raise _Unreachable(None)
                wait = self._wait()
                if wait is not None:
                    raise _Unreachable(wait)
                conn = self._start()
            if conn.state == _State.CONNECTING:
                await conn.ready.wait()
            if conn.state == _State.READY:
                return conn
            if conn.state == _State.FAILED:
                raise _Unreachable(self._wait())
            # lost or closed between connecting and now: decide again

    def _lost(self, conn: _Connection, why: str) -> None:
        """A call (or the listener) found the connection dead: close it, back off."""
        if conn.state == _State.READY and not conn.closing.is_set():
            conn.state = _State.LOST
            self._failures += 1
            self._retry_at = anyio.current_time() + self._backoff()
            log.warning(
                "toolrelay: MCP server %s is not reachable (%s); "
                "reconnecting on a call after %.1f s",
                self.name,
                _cap(why, 80),
                self._backoff(),
            )
        conn.closing.set()

    def _client(self, conn: _Connection) -> Client:
        async def on_message(message: IncomingMessage) -> None:
            if isinstance(message, mcp_types.ToolListChangedNotification):
                conn.want_refresh()
            elif isinstance(message, Exception):
                log.warning(
                    "toolrelay: MCP server %s sent something unreadable (%s)",
                    self.name,
                    type(message).__name__,
                )

        return Client(
            self._transport(),
            mode=self.protocol,
            message_handler=on_message,
            client_info=mcp_types.Implementation(name="toolrelay", version=__version__),
            cache=None,  # the source keeps its own copy of the listing and re-reads on change
        )

    async def _run(self, conn: _Connection) -> None:
        """Own one connection from connect to close. Never raises (except cancellation)."""
        try:
            with anyio.CancelScope() as scope:
                conn.scope = scope
                scope.deadline = anyio.current_time() + self.connect_timeout_s
                async with self._client(conn) as client, anyio.create_task_group() as tg:
                    # The SDK re-checks structuredContent against the upstream's outputSchema
                    # with pure-Python jsonschema, on the event loop, with a backtracking
                    # regex engine (an upstream's "^(a+)+$" held the loop for seconds).
                    # toolrelay checks the same schema itself with jsonschema-rs (linear-time
                    # regex) in its shape stage, so the SDK's copy is skipped.
                    client.session.validate_tool_result = _trust_result  # type: ignore[method-assign]
                    if self._listens(client):
                        tg.start_soon(self._listen, conn, client)
                    self._install(await self._list_tools(client))
                    tg.start_soon(self._refresher, conn, client)
                    scope.deadline = math.inf
                    conn.client = client
                    conn.state = _State.READY
                    self._failures = 0
                    self.connects += 1
                    conn.ready.set()
                    log.info(
                        "toolrelay: connected to MCP server %s (%s, %d tools)",
                        self.name,
                        client.protocol_version,
                        len(self._decls),
                    )
                    await conn.closing.wait()
                    scope.deadline = anyio.current_time() + self.close_timeout_s
                    tg.cancel_scope.cancel()
            connecting = conn.state == _State.CONNECTING
            if scope.cancelled_caught and connecting and not conn.closing.is_set():
                conn.error = TimeoutError(f"no connection within {self.connect_timeout_s:g} s")
        except Exception as exc:  # the transport's task groups raise ExceptionGroups
            conn.error = exc
            if conn.state == _State.READY:
                self._lost(conn, _why(exc))
        finally:
            if conn.state == _State.CONNECTING:
                conn.state = _State.FAILED
                self._failures += 1
                self._retry_at = anyio.current_time() + self._backoff()
                if not self._closed:
                    why = conn.error
                    log.warning(
                        "toolrelay: could not connect to MCP server %s (%s); next attempt "
                        "on a call after %.1f s",
                        self.name,
                        _why(why),
                        self._backoff(),
                    )
            elif conn.state == _State.READY:
                conn.state = _State.CLOSED
            conn.closing.set()
            conn.ready.set()

    def _listens(self, client: Client) -> bool:
        """2026-era servers send list changes only on a ``subscriptions/listen`` stream."""
        tools = client.server_capabilities.tools
        return (
            client.protocol_version in MODERN_PROTOCOL_VERSIONS
            and tools is not None
            and bool(tools.list_changed)
        )

    async def _listen(self, conn: _Connection, client: Client) -> None:
        """Keep a tools-changed subscription open; every event (and every re-listen, since
        events are not replayed) asks for a refresh."""
        while not conn.closing.is_set():
            try:
                async with client.listen(tools_list_changed=True) as subscription:
                    conn.want_refresh()  # covers changes between tools/list and the ack
                    async for _event in subscription:
                        conn.want_refresh()
            except MCPError as exc:
                if _is_disconnect(exc):
                    self._lost(conn, exc.message)
                else:
                    log.warning(
                        "toolrelay: MCP server %s refused to report tool changes: %s",
                        self.name,
                        _cap(exc.message, 80),
                    )
                return
            except SubscriptionLost as exc:
                cause = exc.__cause__
                if isinstance(cause, MCPError) and _is_disconnect(cause):
                    self._lost(conn, cause.message)
                    return
            except ListenNotSupportedError:
                return
            except Exception:
                log.exception("toolrelay: listening to MCP server %s failed", self.name)
                return
            await anyio.sleep(self.backoff_initial_s)

    async def _refresher(self, conn: _Connection, client: Client) -> None:
        while True:
            await conn.refresh_wanted.wait()
            conn.refresh_wanted = anyio.Event()
            try:
                with anyio.fail_after(self.connect_timeout_s):
                    tools = await self._list_tools(client)
            except MCPError as exc:
                if _is_disconnect(exc):
                    self._lost(conn, exc.message)
                    return
                log.warning(
                    "toolrelay: MCP server %s: tools/list failed: %s",
                    self.name,
                    _cap(exc.message, 80),
                )
                continue
            except Exception as exc:
                log.warning(
                    "toolrelay: MCP server %s: tools/list failed (%s)",
                    self.name,
                    type(exc).__name__,
                )
                continue
            self._install(tools)

    async def _list_tools(self, client: Client) -> list[mcp_types.Tool]:
        tools: list[mcp_types.Tool] = []
        cursor: str | None = None
        for _ in range(_MAX_LIST_PAGES):
            page = await client.list_tools(cursor=cursor)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                break
        return tools

    # -- declarations -----------------------------------------------------------------------
    def _install(self, tools: Sequence[mcp_types.Tool]) -> None:
        entries: dict[str, _Entry] = {}
        for tool in tools:
            entry = self._entry(tool)
            if entry is None:
                continue
            if entry.decl.name in entries:
                self._skip(tool.name, f"its name {entry.decl.name!r} is taken")
                continue
            entries[entry.decl.name] = entry
        self._entries = entries
        self._decls = tuple(entry.decl for entry in entries.values())

    def _exposed_name(self, remote: str) -> str | None:
        name = _INVALID_CHARS.sub("_", remote)
        if self.prefix is not None:
            name = f"{self.prefix}__{name}"
        if not NAME_RE.match(name):
            self._skip(remote, f"{name[:80]!r} does not match {NAME_RE.pattern}")
            return None
        return name

    def _skip(self, remote: str, reason: str) -> None:
        """Log a tool left out: a warning the first time, then (every refresh) at debug."""
        key = (remote, reason)
        level = logging.DEBUG if key in self._skips_logged else logging.WARNING
        self._skips_logged.add(key)
        log.log(
            level, "toolrelay: MCP server %s: skipping tool %r: %s", self.name, remote[:80], reason
        )

    def _entry(self, tool: mcp_types.Tool) -> _Entry | None:
        name = self._exposed_name(tool.name)
        if name is None:
            return None
        old = self._entries.get(name)
        for what, schema in (
            ("input schema", tool.input_schema),
            ("output schema", tool.output_schema),
        ):
            problem = _schema_problem(what, schema)
            if problem is not None:
                self._skip(tool.name, problem)
                return None
        parameters = object_schema(tool.input_schema)
        if parameters is None:
            self._skip(tool.name, "its input schema is not an object schema")
            return None
        risk, idempotent = _risk(tool.annotations)
        risk = _riskier(risk, self.risk)  # the operator's floors: hints cannot go below them
        risk = _riskier(risk, self.tool_risk.get(tool.name))
        if name != tool.name:
            risk = _riskier(risk, self.tool_risk.get(name))
        annotation_title = tool.annotations.title if tool.annotations is not None else None
        decl = ToolDeclaration(
            name=name,
            description=_description(tool.description or tool.title or annotation_title or ""),
            parameters=parameters,
            output_schema=tool.output_schema,
            risk=risk,
            timeout_s=self.tool_timeouts.get(tool.name, self.timeout_s),
            breaker_key=self.breaker_key,
            idempotent=idempotent,
            tags=self.tags,
        )
        if old is not None and old.remote == tool.name and old.decl == decl:
            return old  # unchanged: keep the very object (the registry caches by it)
        try:
            compile_tool(decl, _never_called, self.reserved_properties)
        except RegistrationError as exc:
            self._skip(tool.name, str(exc))
            return None
        if name != tool.name:
            log.info(
                "toolrelay: MCP server %s: tool %r is offered as %r", self.name, tool.name, name
            )
        return _Entry(tool.name, decl)
