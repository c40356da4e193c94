"""HTTP/1.1 on the stand-in upstream's connections (h11): reading a request, and sending
an answer whole, dribbled, truncated, or not at all (the wire faults need each)."""

from __future__ import annotations

import contextlib
import math
import socket
import struct
from email.utils import formatdate
from http import HTTPStatus

import anyio
import h11
from anyio.abc import SocketAttribute, SocketStream

from ._upstream_replies import Reply

MAX_REQUEST_BODY = 1024 * 1024
SERVER = "toolrelay-upstream"
LINGER_RST = struct.pack("ii", 1, 0)


async def read_request(
    conn: h11.Connection, stream: SocketStream, keep_alive_s: float
) -> tuple[h11.Request, bytes] | None:
    """The next request and its body; ``None`` when the client closed or idled too long."""
    request: h11.Request | None = None
    body = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = b""
            with anyio.move_on_after(keep_alive_s if request is None else math.inf):
                with contextlib.suppress(anyio.EndOfStream):
                    data = await stream.receive(65536)
            if not data:
                return None  # closed, or idle too long between requests
            conn.receive_data(data)
        elif isinstance(event, h11.Request):
            request = event
            for name, value in event.headers:
                if name == b"content-length" and int(value) > MAX_REQUEST_BODY:
                    raise TooLarge
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > MAX_REQUEST_BODY:
                raise TooLarge
        elif isinstance(event, h11.EndOfMessage):
            assert request is not None
            return request, bytes(body)
        else:  # ConnectionClosed or PAUSED
            return None


class TooLarge(Exception):
    """A request larger than :data:`MAX_REQUEST_BODY`."""


def phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


async def send(
    conn: h11.Connection,
    stream: SocketStream,
    reply: Reply,
    *,
    head: bool = False,
    dribble_s: float = 0.0,
    truncate: bool = False,
) -> None:
    body = reply.body
    headers = [
        ("content-type", reply.content_type),
        ("content-length", str(len(body))),
        ("date", formatdate(usegmt=True)),
        ("server", SERVER),
        *reply.headers,
    ]
    response = h11.Response(
        status_code=reply.status, headers=headers, reason=phrase(reply.status).encode()
    )
    await write(stream, conn.send(response))
    if head:
        body = b""  # a HEAD answer has headers only
    if truncate:
        await write(stream, conn.send(h11.Data(data=body[: len(body) // 2])))
        return  # no EndOfMessage: the client is left short of Content-Length
    if dribble_s > 0 and body:
        pieces = min(len(body), 10)
        size = -(-len(body) // pieces)
        for start in range(0, len(body), size):
            await anyio.sleep(dribble_s / pieces)
            await write(stream, conn.send(h11.Data(data=body[start : start + size])))
    elif body:
        await write(stream, conn.send(h11.Data(data=body)))
    await write(stream, conn.send(h11.EndOfMessage()))


async def write(stream: SocketStream, data: bytes | None) -> None:
    if data:
        await stream.send(data)


async def until_closed(stream: SocketStream) -> None:
    """Read and drop whatever the client sends until it closes the connection."""
    with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
        while True:
            await stream.receive()


def linger_zero(stream: SocketStream) -> None:
    """Make the coming close send RST instead of FIN, where the platform allows."""
    with contextlib.suppress(OSError, AttributeError):
        raw: socket.socket = stream.extra(SocketAttribute.raw_socket)
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RST)
