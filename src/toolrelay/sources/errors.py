"""The failures of an MCP source in toolrelay's terms: the errors its transports answer
with, :func:`map_mcp_errors` (what a request raises, by MCP error code, as toolrelay
exceptions), and a server's text quoted safely (:func:`cap`)."""

from __future__ import annotations

import re

import anyio
import mcp.types as mcp_types
from mcp import MCPError
from pydantic import ValidationError

from ..redact import Redactor
from .limits import TOO_LARGE_TEXT

MESSAGE_TOO_LARGE = -32070
"""The JSON-RPC error code the stdio reader answers an oversized message's request with
(in the range JSON-RPC leaves to implementations)."""

MESSAGE_UNREADABLE = -32071
"""The code the stdio reader answers a response it cannot read with (not JSON-RPC, or
nested past the parser's limit)."""

UNREADABLE_TEXT = "toolrelay could not read the answer"
"""The text a response that is not valid JSON-RPC is answered with, on stdio."""

MAX_ERROR_CHARS = 200
"""How much of a server's error text reaches the model."""
_MAX_WORD_CHARS = 100  # a word the cap would split is dropped whole up to this length
_MAX_REDACTED_CHARS = 16384  # of a server's text, at most this much is read at all
_REDACT = Redactor()
_SESSION_GONE_CODES = frozenset({mcp_types.INVALID_REQUEST, -32001})
_STALE_CODES = frozenset({mcp_types.INVALID_PARAMS, mcp_types.METHOD_NOT_FOUND})
_STREAM_ENDS = (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream)
_SSE_TOO_LARGE = re.compile(r"event exceeded the \d+ byte limit")  # httpx2's wording


class McpConnectError(ConnectionError):
    """The source could not connect to its MCP server or read its tool list (raised by
    ``async with`` and :meth:`McpSource.refresh`; tool calls get a ``ToolError`` instead)."""


class Unreachable(Exception):
    """Raised by :meth:`Connector.acquire` with the seconds until a retry may connect."""


class McpCallError(Exception):
    """An MCP request failed (raised by :func:`map_mcp_errors`); ``str()`` is the reason."""


class Disconnected(McpCallError):
    """The connection is gone: the server did not answer, it did not say no."""


class AnswerTooLarge(McpCallError):
    """The transport refused the answer for its size (see :mod:`.limits`)."""


class NotAToolResult(McpCallError):
    """The answer is not a valid MCP tool result."""


class Refused(McpCallError):
    """The server answered with a JSON-RPC error (``code``)."""

    def __init__(self, text: str, code: int) -> None:
        super().__init__(text)
        self.code = code
        self.counted = code == mcp_types.INTERNAL_ERROR
        """The server's own failure (``INTERNAL_ERROR``): the breaker counts it."""
        self.stale = code in _STALE_CODES
        """Unknown method or bad arguments: the tool list may be stale."""


def closed() -> MCPError:
    """What a request on a connection that is gone fails with (as the SDK's would)."""
    return MCPError(code=mcp_types.CONNECTION_CLOSED, message="Connection closed")


def unreadable() -> MCPError:
    """What a request whose response is not valid JSON-RPC fails with, on stdio."""
    return MCPError(code=MESSAGE_UNREADABLE, message=UNREADABLE_TEXT)


def cap(text: str, limit: int = MAX_ERROR_CHARS) -> str:
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


def innermost(exc: BaseException) -> BaseException:
    """The first exception inside (nested) exception groups; ``exc`` itself otherwise."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def why(exc: BaseException | None) -> str:
    """A short account of a failure, for logs: the innermost exception, groups flattened."""
    if exc is None:
        return "cancelled"
    exc = innermost(exc)
    text = cap(str(exc), 120)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def is_disconnect(exc: MCPError) -> bool:
    """Errors that mean the connection is gone, not that the server said no: besides
    ``CONNECTION_CLOSED``, a 2025-era HTTP server that lost our session (HTTP 404: start a
    new one), which the SDKs surface only as ``INVALID_REQUEST`` or ``-32001`` "Session
    terminated/not found", so recognised by code and the word "session"."""
    if exc.code == mcp_types.CONNECTION_CLOSED:
        return True
    return exc.code in _SESSION_GONE_CODES and "session" in exc.message.lower()


def _refused_over_http(exc: MCPError) -> bool:
    """Over HTTP our refusals reach us under the SDK's own codes, with no code of ours:
    a JSON body :func:`~.http.capped_http_client` refused is a ``PARSE_ERROR`` carrying
    :data:`~.limits.TOO_LARGE_TEXT`; an SSE event over ``max_sse_event_size`` is a
    ``CONNECTION_CLOSED`` carrying httpx2's wording. Only the text tells them apart."""
    if exc.code == mcp_types.PARSE_ERROR:
        return TOO_LARGE_TEXT in exc.message
    return (
        exc.code == mcp_types.CONNECTION_CLOSED and _SSE_TOO_LARGE.search(exc.message) is not None
    )


def mapped(exc: MCPError) -> McpCallError:
    """What an ``MCPError`` means for the call, by its code."""
    if exc.code == MESSAGE_TOO_LARGE or _refused_over_http(exc):
        return AnswerTooLarge(exc.message)
    if exc.code == MESSAGE_UNREADABLE:
        return NotAToolResult(exc.message)
    if is_disconnect(exc):
        return Disconnected(exc.message)
    return Refused(exc.message, exc.code)


class _McpErrors:
    """:func:`map_mcp_errors`' block (a class, not a generator: every call enters one)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, MCPError):
            raise mapped(exc) from None
        if isinstance(exc, _STREAM_ENDS):
            raise Disconnected(type(exc).__name__) from None
        if isinstance(exc, ValidationError):
            raise NotAToolResult(str(exc)) from None


_MCP_ERRORS = _McpErrors()


def map_mcp_errors() -> _McpErrors:
    """Translate what an MCP request raises into :class:`McpCallError`, in one place (as
    httpx maps httpcore's exceptions): an ``MCPError`` by its code (:func:`mapped`), the
    transport's streams ending as :class:`Disconnected`, and pydantic's
    ``ValidationError`` (an answer that does not parse as a tool result) as
    :class:`NotAToolResult`. Cancellation and anything else pass unchanged."""
    return _MCP_ERRORS
