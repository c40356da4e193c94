"""The raw lane: JSON-RPC requests written straight to a stdio server, beside the SDK's session.

The SDK's session (pydantic models both ways, memory streams, a writer task) cost about
0.45 ms of CPU per ``tools/call``. The raw lane writes that one request itself, with ids
``"tr-<n>"``; the reader hands a raw id's response line to its waiter, parsed with one
``json.loads`` and checked as the SDK checks it. Lines never interleave (one writer queue)
and a line once started is written whole. When the connection ends every waiting raw
request fails as the SDK's would (``CONNECTION_CLOSED``); a cancelled one sends
``notifications/cancelled``. Not on HTTP, where the SDK's transport owns the requests and
a round trip costs far more.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from contextlib import suppress
from typing import Any

import anyio
import mcp.types as mcp_types
from mcp import MCPError

from .errors import closed, unreadable

HEAD_BYTES = 512  # of an oversized message, this much is kept to find its request id
RAW_ID_PREFIX = "tr-"
_RAW_MARK = b'"' + RAW_ID_PREFIX.encode()
_RESPONSE_HEAD = re.compile(
    rb'\A\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"id"\s*:\s*(-?\d{1,18}|"[^"\\]{0,128}")'
    rb'\s*,\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"(?:result|error)"\s*:'
)


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


class _Waiter:
    __slots__ = ("answer", "event")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.answer: bytes | MCPError = b""  # the response line, or what the request fails with


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

    def bind(self, write: Callable[[bytes], None], encoding: str, errors: str) -> None:
        self._write = write
        self._encoding = encoding
        self._errors = errors

    async def request(self, method: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """Send one request; its response's ``result``.

        Raises ``MCPError`` (the server's error, the transport's refusal, or
        ``CONNECTION_CLOSED``), or ``ValueError`` with nothing sent when ``params`` is not
        strict JSON. A line is queued for the one writer task, so a caller never waits on
        the pipe: a server that stops reading stdin cannot hold a call past its deadline.
        """
        write = self._write
        if write is None or self._closed:
            raise closed()
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
        if isinstance(waiter.answer, MCPError):
            raise waiter.answer
        return self._result(waiter.answer)

    def _encode(self, message: Mapping[str, Any]) -> bytes:
        text = json.dumps(message, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        return (text + "\n").encode(self._encoding, self._errors)

    def _result(self, line: bytes) -> dict[str, Any]:
        try:
            message = json.loads(line.decode(self._encoding, self._errors))
        except (ValueError, RecursionError):
            raise unreadable() from None
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            raise unreadable()
        if "error" not in message:
            result = message.get("result")
            if isinstance(result, dict):
                return result
            raise unreadable()
        error = message["error"]
        if "result" in message or not isinstance(error, dict):
            raise unreadable()
        code, text = error.get("code"), error.get("message")
        if isinstance(code, bool) or not isinstance(code, int) or not isinstance(text, str):
            raise unreadable()
        raise MCPError(code=code, message=text, data=error.get("data"))

    # -- the transport's side ---------------------------------------------------------------
    def owner(self, line: bytes) -> str | None:
        """The raw id ``line`` (a whole message) answers, if it is a response to one; the
        head is read as for refusals, the whole line parsed only when the head does not
        show the id but a raw id appears in it."""
        if line.find(_RAW_MARK, 0, HEAD_BYTES) < 0 and (not self._pending or _RAW_MARK not in line):
            return None
        request_id = answered_id(line[:HEAD_BYTES])
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

    def answer(self, request_id: str, answer: bytes | MCPError) -> None:
        """Hand a response line, or the error its request fails with, to its waiter (dropped
        when nobody waits: a late answer)."""
        waiter = self._pending.pop(request_id, None)
        if waiter is not None:
            waiter.answer = answer
            waiter.event.set()

    def close(self) -> None:
        """The connection is gone: every waiting request fails as a disconnect."""
        self._closed = True
        pending, self._pending = self._pending, {}
        for waiter in pending.values():
            waiter.answer = closed()
            waiter.event.set()
