"""MCP client transports that bound the size of one message while it is read.

The MCP SDK's stdio reader joins and splits its whole buffer on every chunk (quadratic in
the message size) and has no size limit; its HTTP reader reads a JSON answer whole. An
upstream that answers with tens of megabytes then holds the event loop for seconds and
leaves the memory behind. These transports stand in front of the SDK's session:

``capped_stdio_client``
    Spawns the server as the SDK's ``stdio_client`` does (its own process group, the SDK's
    safe environment, the SDK's bounded shutdown) but reads stdout as bytes, scanning each
    chunk once for newlines. A message over ``max_bytes`` is never held whole: the reader
    keeps its first bytes, discards the rest up to the next newline, and answers the request
    it was for with a JSON-RPC error (code :data:`MESSAGE_TOO_LARGE`) — the connection stays
    usable. When the head does not show which request it answers (``{"jsonrpc":"2.0",
    "id":…,"result"…}`` in that order, as every SDK writes it), the connection is dropped
    instead (the source reconnects on a later call). A message with more than
    ``max_values`` JSON values is refused the same way before it is parsed, and a response
    the SDK cannot parse (e.g. nested past pydantic's limit) is answered with a parse error
    (:data:`UNREADABLE_TEXT`) rather than left for the deadline.

    It also carries a :class:`RawLane` (``.lane``): requests written straight to the
    process and their responses handed straight back, beside the SDK's session, for the
    one request on the hot path (``tools/call``; see :mod:`.mcp`). Its ids are strings
    ``"tr-<n>"`` (the SDK's are integers, and ``"listen-<n>"``); the reader reads the id
    from a response's head (as for refusals) and hands a raw id's line to its waiter,
    which parses it with one ``json.loads`` — never through the SDK's pydantic message
    parse. Everything else goes to the SDK as before. Both write under one lock, so lines
    never interleave; a raw line once started is written whole before a cancellation takes
    effect (half a line would corrupt the stream), and one the server does not take within
    2 s drops the connection (the server stopped reading its stdin). Refusals answer raw ids
    too; when the connection ends (the reader stops, the process exits, a write fails)
    every waiting raw request fails as the SDK's would (``CONNECTION_CLOSED``). A raw
    request cancelled while it waits sends ``notifications/cancelled`` as the SDK does; a
    late response to it is dropped.

``capped_http_client``
    An ``httpx2.AsyncClient`` whose JSON (non-SSE) response bodies stop at ``max_bytes``
    (a ``Content-Length`` over it is refused before any of the body is read); the SDK
    answers the waiting request with a parse error carrying :data:`TOO_LARGE_TEXT`. SSE
    events are bounded by the SDK's own ``max_sse_event_size``, which the caller sets to
    the same limit.
"""

from __future__ import annotations

import json
import logging
import math
import re
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from types import TracebackType
from typing import Any, TextIO

import anyio
import anyio.lowlevel
import httpx2
import mcp.types as mcp_types
from mcp import MCPError
from mcp.client._transport import TransportStreams
from mcp.client.stdio import (
    StdioServerParameters,
    _create_platform_compatible_process,
    _drain_stdout,
    _get_executable_command,
    _parse_line,
    _stop_server_process,
    get_default_environment,
)
from mcp.shared.message import SessionMessage

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DEFAULT_MAX_MESSAGE_VALUES",
    "UNREADABLE_TEXT",
    "MESSAGE_TOO_LARGE",
    "TOO_LARGE_TEXT",
    "MessageTooLarge",
    "RawLane",
    "StdioTransport",
    "capped_http_client",
    "capped_stdio_client",
]

log = logging.getLogger("toolrelay.sources.mcp")

DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""The default bound on one message from an MCP server (4 MiB)."""

MESSAGE_TOO_LARGE = -32070
"""The JSON-RPC error code the stdio reader answers an oversized message's request with
(in the range JSON-RPC leaves to implementations)."""

DEFAULT_MAX_MESSAGE_VALUES = 50_000
"""The default bound on the JSON values in one message (parsing is ~1 µs a value, on the
event loop)."""

TOO_LARGE_TEXT = "toolrelay refused a message"
"""The start of every refusal's text, on stdio and on HTTP."""

UNREADABLE_TEXT = "toolrelay could not read the answer"
"""The text a response that is not valid JSON-RPC is answered with, on stdio."""

_HEAD_BYTES = 512  # of an oversized message, this much is kept to find its request id
_WRITER_FLUSH_TIMEOUT = 0.5  # as the SDK's stdio_client
_WRITE_BATCH = 64  # lines joined into one write at most
RAW_ID_PREFIX = "tr-"
_RAW_MARK = b'"' + RAW_ID_PREFIX.encode()
_RESPONSE_HEAD = re.compile(
    rb'\A\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"id"\s*:\s*(-?\d{1,18}|"[^"\\]{0,128}")'
    rb'\s*,\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"(?:result|error)"\s*:'
)


def _refusal(max_bytes: int) -> str:
    return f"{TOO_LARGE_TEXT} larger than {max_bytes} bytes"


def _too_many(max_values: int) -> str:
    return f"{TOO_LARGE_TEXT} with more than {max_values} JSON values"


def json_values(message: bytes, limit: int) -> int:
    """How many values ``message`` (JSON) holds, counted as commas, brackets and braces
    outside strings, plus one — exact enough to bound, and linear in C: the strings are only
    cut out when the quick count (which includes them) goes over ``limit``."""
    quick = message.count(b",") + message.count(b"[") + message.count(b"{") + 1
    if quick <= limit:
        return quick
    strings = message.count(b'"') // 2
    if strings > 4 * limit:  # every value has at most a key and itself as strings
        return strings // 2
    plain = message.replace(b"\\\\", b"").replace(b'\\"', b"")
    outside = b"".join(plain.split(b'"')[::2])
    return outside.count(b",") + outside.count(b"[") + outside.count(b"{") + 1


def answered_id(head: bytes) -> mcp_types.RequestId | None:
    """The id of the request a response answers, read from the response's first bytes
    (``None`` when they do not show it, or the message is not a response)."""
    match = _RESPONSE_HEAD.match(head)
    if match is None:
        return None
    value = match.group(1)
    if value.startswith(b'"'):  # no quote nor backslash inside: nothing to unescape
        return value[1:-1].decode("utf-8", "replace")
    return int(value)


class _Lines:
    """Splits a byte stream into newline-terminated messages, each byte scanned once; a
    message over ``max_bytes`` comes out as ``(head, False)`` and is otherwise dropped."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._buf = bytearray()
        self._scanned = 0  # no newline in _buf[:_scanned]
        self._skipping = False  # inside an oversized message: discard up to its newline

    def feed(self, chunk: bytes) -> list[tuple[bytes, bool]]:
        out: list[tuple[bytes, bool]] = []
        if self._skipping:
            end = chunk.find(b"\n")
            if end < 0:
                return out
            self._skipping = False
            chunk = chunk[end + 1 :]
        self._buf += chunk
        while True:
            end = self._buf.find(b"\n", self._scanned)
            if end < 0:
                if len(self._buf) > self.max_bytes:
                    out.append((bytes(self._buf[:_HEAD_BYTES]), False))
                    self._buf = bytearray()  # give the memory back now
                    self._skipping = True
                    self._scanned = 0
                else:
                    self._scanned = len(self._buf)
                return out
            if end > self.max_bytes:
                out.append((bytes(self._buf[:_HEAD_BYTES]), False))
            else:
                out.append((bytes(self._buf[:end]), True))
            del self._buf[: end + 1]
            self._scanned = 0
            if not self._buf:
                self._buf = bytearray()


def _closed() -> MCPError:
    return MCPError(code=mcp_types.CONNECTION_CLOSED, message="Connection closed")


def _unreadable() -> MCPError:
    return MCPError(code=mcp_types.PARSE_ERROR, message=UNREADABLE_TEXT)


class _Waiter:
    __slots__ = ("error", "event", "line")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.line: bytes | None = None
        self.error: MCPError | None = None


class RawLane:
    """JSON-RPC requests written straight to a stdio server, beside the SDK's session.

    Bound to its process by :func:`capped_stdio_client` when the transport is entered;
    requests before, or after the connection ends, fail as a disconnect.
    """

    def __init__(self) -> None:
        self._pending: dict[str, _Waiter] = {}
        self._count = 0
        self._write: Callable[[bytes], None] | None = None
        self._encoding = "utf-8"
        self._errors = "strict"
        self._closed = False

    def _bind(self, write: Callable[[bytes], None], encoding: str, errors: str) -> None:
        self._write = write
        self._encoding = encoding
        self._errors = errors

    async def request(self, method: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """Send one request; its response's ``result``.

        Raises ``MCPError``: the server's JSON-RPC error; a refusal of the transport
        (:data:`MESSAGE_TOO_LARGE`, or ``PARSE_ERROR`` with :data:`UNREADABLE_TEXT` for a
        response that is not JSON-RPC); ``CONNECTION_CLOSED`` when the connection is gone.
        ``ValueError`` (nothing sent): ``params`` cannot be written as strict JSON.
        On cancellation the server is sent ``notifications/cancelled`` and the cancellation
        propagates at once: lines are queued for the connection's one writer task, so a
        caller never waits on the pipe (a server that stops reading stdin cannot hold a
        call past its deadline, nor cut a line short).
        """
        write = self._write
        if write is None or self._closed:
            raise _closed()
        self._count += 1
        request_id = f"{RAW_ID_PREFIX}{self._count}"
        message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        line = self._encode(message)
        waiter = _Waiter()
        self._pending[request_id] = waiter
        try:
            write(line)
            await waiter.event.wait()
        except anyio.get_cancelled_exc_class():
            if not self._closed:
                cancel = {"requestId": request_id, "reason": "caller cancelled"}
                notice = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": cancel}
                with suppress(MCPError):  # the queue closed meanwhile: the cancel still wins
                    write(self._encode(notice))
            raise
        finally:
            self._pending.pop(request_id, None)
        if waiter.error is not None:
            raise waiter.error
        assert waiter.line is not None
        return self._result(waiter.line)

    def _encode(self, message: Mapping[str, Any]) -> bytes:
        text = json.dumps(message, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        return (text + "\n").encode(self._encoding, self._errors)

    def _result(self, line: bytes) -> dict[str, Any]:
        try:
            message = json.loads(line.decode(self._encoding, self._errors))
        except (ValueError, RecursionError):
            raise _unreadable() from None
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            raise _unreadable()
        if "error" not in message:
            result = message.get("result")
            if isinstance(result, dict):
                return result
            raise _unreadable()
        error = message["error"]
        if "result" in message or not isinstance(error, dict):
            raise _unreadable()
        code, text = error.get("code"), error.get("message")
        if isinstance(code, bool) or not isinstance(code, int) or not isinstance(text, str):
            raise _unreadable()
        raise MCPError(code=code, message=text, data=error.get("data"))

    # -- the transport's side ---------------------------------------------------------------
    def owner(self, line: bytes) -> str | None:
        """The raw id ``line`` (a whole message) answers, if it is a response to one; the
        head is read as for refusals, the whole line parsed only when the head does not
        show the id but a raw id appears in it."""
        if line.find(_RAW_MARK, 0, _HEAD_BYTES) < 0 and (
            not self._pending or _RAW_MARK not in line
        ):
            return None
        request_id = answered_id(line[:_HEAD_BYTES])
        if request_id is None and self._pending:
            try:
                message = json.loads(line)
            except (ValueError, RecursionError):
                return None
            if isinstance(message, dict) and ("result" in message or "error" in message):
                request_id = message.get("id")
        if isinstance(request_id, str) and request_id.startswith(RAW_ID_PREFIX):
            return request_id
        return None

    def answer(self, request_id: str, line: bytes) -> None:
        """Hand a response to its waiter (dropped when nobody waits: a late answer)."""
        waiter = self._pending.pop(request_id, None)
        if waiter is not None:
            waiter.line = line
            waiter.event.set()

    def refuse(self, request_id: str, code: int, why: str) -> None:
        waiter = self._pending.pop(request_id, None)
        if waiter is not None:
            waiter.error = MCPError(code=code, message=why)
            waiter.event.set()

    def close(self) -> None:
        """The connection is gone: every waiting request fails as a disconnect."""
        self._closed = True
        pending, self._pending = self._pending, {}
        for waiter in pending.values():
            waiter.error = _closed()
            waiter.event.set()


class StdioTransport(AbstractAsyncContextManager[TransportStreams]):
    """What :func:`capped_stdio_client` returns: the SDK's transport protocol (an async
    context manager yielding the read and write streams), plus the connection's
    :class:`RawLane` (``lane``). One use only."""

    def __init__(
        self, server: StdioServerParameters, max_bytes: int, max_values: int, errlog: TextIO
    ) -> None:
        self.lane = RawLane()
        self._streams = _stdio_streams(server, max_bytes, max_values, errlog, self.lane)

    async def __aenter__(self) -> TransportStreams:
        return await self._streams.__aenter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        return await self._streams.__aexit__(exc_type, exc, tb)


def capped_stdio_client(
    server: StdioServerParameters,
    max_bytes: int,
    max_values: int = DEFAULT_MAX_MESSAGE_VALUES,
    errlog: TextIO = sys.stderr,
) -> StdioTransport:
    """The SDK's ``stdio_client`` with a linear reader bounded at ``max_bytes`` and
    ``max_values`` a message, and a raw lane beside it."""
    return StdioTransport(server, max_bytes, max_values, errlog)


@asynccontextmanager
async def _stdio_streams(
    server: StdioServerParameters,
    max_bytes: int,
    max_values: int,
    errlog: TextIO,
    lane: RawLane,
) -> AsyncIterator[TransportStreams]:
    command = await _get_executable_command(server.command)
    process = await _create_platform_compatible_process(
        command=command,
        args=server.args,
        env=get_default_environment() | (server.env or {}),
        errlog=errlog,
        cwd=server.cwd,
    )
    # No awaits until the task group is entered (a cancellation would leak the process).
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
    # Every line, the SDK's and the raw lane's, is queued whole for one writer task: no
    # interleaving, and no caller waits on the pipe (the queue holds at most a line or two
    # per call in flight).
    outbox, lines_out = anyio.create_memory_object_stream[bytes](math.inf)
    writer_done = anyio.Event()
    shutting_down = False

    def broken() -> None:
        lane.close()
        outbox.close()
        read_writer.close()  # the session sees the end too

    def write(data: bytes) -> None:
        try:
            outbox.send_nowait(data)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise _closed() from None

    lane._bind(write, server.encoding, server.encoding_error_handler)

    async def refuse(head: bytes, why: str, code: int = MESSAGE_TOO_LARGE) -> bool:
        """Answer the request a refused message was for; False: drop the connection."""
        request_id = answered_id(head[:_HEAD_BYTES])
        log.warning(
            "toolrelay: MCP server %s: %s; %s",
            server.command,
            why,
            "answered its request" if request_id is not None else "dropping the connection",
        )
        if request_id is None:
            return False
        if isinstance(request_id, str) and request_id.startswith(RAW_ID_PREFIX):
            lane.refuse(request_id, code, why)
            return True
        error = mcp_types.ErrorData(code=code, message=why)
        reply = mcp_types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error)
        await read_writer.send(SessionMessage(reply))
        return True

    async def deliver(line: bytes) -> bool:
        """Pass one message on (or refuse it); False: drop the connection."""
        if json_values(line, max_values) > max_values:
            return await refuse(line, _too_many(max_values))
        raw_id = lane.owner(line)
        if raw_id is not None:
            lane.answer(raw_id, line)
            return True
        message = _parse_line(line.decode(server.encoding, server.encoding_error_handler))
        if isinstance(message, Exception) and answered_id(line[:_HEAD_BYTES]) is not None:
            # e.g. nested too deeply to parse: answer the call instead of leaving it waiting
            return await refuse(line, UNREADABLE_TEXT, mcp_types.PARSE_ERROR)
        await read_writer.send(message)
        return True

    async def stdout_reader() -> None:
        assert process.stdout is not None
        lines = _Lines(max_bytes)
        try:
            async with read_writer:
                try:
                    async for chunk in process.stdout:
                        for line, fits in lines.feed(chunk):
                            if fits:
                                kept = await deliver(line)
                            else:
                                kept = await refuse(line, _refusal(max_bytes))
                            if not kept:  # the session must see the end before the drain
                                lane.close()
                                await read_writer.aclose()
                                return
                finally:
                    lane.close()
                    await _drain_stdout(process)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, ConnectionError):
            if not shutting_down:
                log.debug("toolrelay: reading an MCP server's stdout ended", exc_info=True)

    async def sdk_messages() -> None:
        try:
            async with write_reader:
                async for message in write_reader:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    write((data + "\n").encode(server.encoding, server.encoding_error_handler))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, MCPError):
            pass  # the connection is gone (the writer said so) or closing
        finally:
            outbox.close()  # the writer flushes what is queued, then ends

    async def stdin_writer() -> None:
        assert process.stdin is not None
        try:
            async with lines_out:
                async for data in lines_out:
                    # what else is queued goes in the same write: one wake-up of the server
                    batch = [data]
                    with suppress(anyio.WouldBlock, anyio.EndOfStream):
                        while len(batch) < _WRITE_BATCH:
                            batch.append(lines_out.receive_nowait())
                    await process.stdin.send(b"".join(batch) if len(batch) > 1 else data)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            broken()  # the session sees the end instead of hanging
        finally:
            writer_done.set()

    async def shutdown() -> None:
        lane.close()
        read_stream.close()
        write_stream.close()
        with anyio.move_on_after(_WRITER_FLUSH_TIMEOUT):
            await writer_done.wait()
        await _stop_server_process(process)
        for stream in (read_stream, write_stream, read_writer, write_reader, outbox, lines_out):
            await stream.aclose()
        await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        tg.start_soon(stdout_reader)
        tg.start_soon(sdk_messages)
        tg.start_soon(stdin_writer)
        try:
            yield read_stream, write_stream
        finally:
            shutting_down = True
            with anyio.CancelScope(shield=True):  # bounded: the process must not leak
                await shutdown()
            tg.cancel_scope.cancel()


class MessageTooLarge(httpx2.StreamError):
    """A response body went over the transport's message limit."""


class _CappedStream(httpx2.AsyncByteStream):
    """A response body that raises :class:`MessageTooLarge` (a ``StreamError``, which the
    SDK turns into an error answer for the request) once it goes over ``max_bytes``, or
    holds more than ``max_values`` JSON values; a ``Content-Length`` over ``max_bytes`` is
    refused before anything is read. The body is passed on whole, once read."""

    def __init__(
        self, inner: httpx2.AsyncByteStream, max_bytes: int, max_values: int, declared: int
    ) -> None:
        self._inner = inner
        self._max_bytes = max_bytes
        self._max_values = max_values
        self._declared = declared

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._declared > self._max_bytes:
            await self._inner.aclose()
            raise MessageTooLarge(_refusal(self._max_bytes))
        body = bytearray()
        async for chunk in self._inner:
            body += chunk
            if len(body) > self._max_bytes:
                await self._inner.aclose()
                raise MessageTooLarge(_refusal(self._max_bytes))
        if json_values(bytes(body), self._max_values) > self._max_values:
            raise MessageTooLarge(_too_many(self._max_values))
        if body:
            yield bytes(body)

    async def aclose(self) -> None:
        await self._inner.aclose()


def capped_http_client(
    max_bytes: int,
    max_values: int = DEFAULT_MAX_MESSAGE_VALUES,
    *,
    headers: Mapping[str, str] | None,
    timeout: httpx2.Timeout,
) -> httpx2.AsyncClient:
    """An HTTP client whose non-SSE response bodies are refused past ``max_bytes`` or
    ``max_values``."""

    async def cap(response: httpx2.Response) -> None:
        if response.headers.get("content-type", "").lower().startswith("text/event-stream"):
            return  # bounded per event by the SDK (max_sse_event_size)
        length = response.headers.get("content-length", "")
        declared = int(length) if length.isdigit() else 0
        stream = response.stream
        if isinstance(stream, httpx2.AsyncByteStream):  # never raise here: the SDK's
            capped = _CappedStream(stream, max_bytes, max_values, declared)  # POST task would die
            response.stream = capped

    return httpx2.AsyncClient(
        headers=dict(headers or {}), timeout=timeout, event_hooks={"response": [cap]}
    )
