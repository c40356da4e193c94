"""Bounded requests: no MCP request is read whole past ``max_request_bytes``
(``docs/serve.md``, "Request size"): :class:`BodyLimit` over streamable HTTP,
:func:`bounded_stdin` over stdio.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import anyio
import anyio.to_thread
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..sources.limits import Lines
from .settings import DEFAULT_MAX_REQUEST_BYTES

INVALID_REQUEST = -32600
_CHUNK = 64 * 1024
_HEAD = 4096  # of a refused request, this much is read to find its id
_ID = re.compile(rb'"id"\s*:\s*(-?\d{1,18}|"(?:[^"\\]|\\.){0,128}")')


def too_large_error(limit: int, request_id: Any = None) -> dict[str, Any]:
    """The JSON-RPC error for a request over the limit."""
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "error": {"code": INVALID_REQUEST, "message": f"request larger than {limit} bytes"},
    }


def _request_id(head: bytes) -> Any:
    """The ``id`` of a JSON-RPC request, read from the start of its text (or None)."""
    match = _ID.search(head)
    if match is None:
        return None
    with contextlib.suppress(ValueError):
        return json.loads(match.group(1))
    return None


class BodyLimit:
    """ASGI middleware: a request body over ``limit`` bytes is answered 413 (JSON-RPC error)."""

    def __init__(self, app: ASGIApp, limit: int = DEFAULT_MAX_REQUEST_BYTES) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        over = declared is not None and declared.isdigit() and int(declared) > self.limit
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.limit or (over and (size >= _HEAD or not message.get("more_body"))):
                # read no further than needed to find the request's id in its first 4 KB
                head = (b"".join(chunks) + body)[:_HEAD]
                error = too_large_error(self.limit, _request_id(head))
                await JSONResponse(error, 413, {"connection": "close"})(scope, receive, send)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        replay: list[Message] = [{"type": "http.request", "body": b"".join(chunks)}]

        async def replayed() -> Message:
            return replay.pop() if replay else await receive()

        await self.app(scope, replayed, send)


_END: Any = object()


def _lines(read: Callable[[], bytes], limit: int, refused: list[Any]) -> Iterator[bytes | None]:
    """Lines of at most ``limit`` bytes from ``read()`` chunks; None where a longer line was
    dropped (its id, if readable, is appended to ``refused``)."""
    lines = Lines(limit, _HEAD)
    while chunk := read():
        for line, fits in lines.feed(chunk):
            if not fits:
                refused.append(_request_id(line))
            yield line if fits else None
    if lines.rest:
        yield lines.rest


@contextlib.asynccontextmanager
async def bounded_stdin(
    limit: int, refuse: Callable[[dict[str, Any]], Awaitable[None]]
) -> AsyncIterator[AsyncIterator[str]]:
    """This process's stdin as lines of at most ``limit`` bytes, for ``stdio_server(stdin=…)``.

    Like the SDK, fd 0 is pointed at the null device while serving (a handler or child
    reading stdin gets EOF, not the client's messages) and restored afterwards.
    ``refuse(error)`` sends the JSON-RPC error for a line over the limit.
    """
    with contextlib.suppress(AttributeError, ValueError):
        sys.stdin.flush()
    fd = os.dup(0)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    source = os.fdopen(fd, "rb", buffering=0)

    async def lines() -> AsyncIterator[str]:
        refused: list[Any] = []
        reader = _lines(lambda: source.read(_CHUNK), limit, refused)
        while True:
            line = await anyio.to_thread.run_sync(next, reader, _END, abandon_on_cancel=True)
            if line is _END:
                return
            if line is None:
                await refuse(too_large_error(limit, refused.pop()))
                continue
            yield line.decode("utf-8", errors="replace")

    try:
        yield lines()
    finally:
        saved = os.dup(fd)
        source.close()
        os.dup2(saved, 0)
        os.close(saved)
