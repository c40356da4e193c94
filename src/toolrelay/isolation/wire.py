"""The messages between the host and a worker process: length-prefixed pickles over one
``socketpair`` per worker. The host's end is non-blocking (awaited with anyio, so the loop
never blocks on a worker); the worker's end blocks."""

from __future__ import annotations

import pickle
import socket
import struct
from dataclasses import dataclass
from typing import Any, BinaryIO

import anyio

from ..contract import AuthContext
from .target import ProcessTarget

_HEADER = struct.Struct("!Q")
_PROTOCOL = pickle.HIGHEST_PROTOCOL


@dataclass(frozen=True, slots=True)
class Attempt:
    """What ``CallContext.current()`` reads in the worker (an ``Invocation`` stand-in)."""

    name: str
    call_id: str | None
    attempts: int
    key: str
    deadline: float


def frame(message: Any) -> bytes:
    payload = pickle.dumps(message, _PROTOCOL)
    return _HEADER.pack(len(payload)) + payload


def receive_blocking(reader: BinaryIO) -> bytes | None:
    """In the worker: the next message from the socket's ``makefile("rb")``, still
    pickled; ``None`` when the host has gone."""
    header = reader.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    size = _HEADER.unpack(header)[0]
    payload = reader.read(size)
    return payload if len(payload) == size else None


async def _recv_exact(sock: socket.socket, size: int) -> bytes | None:
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        try:
            n = sock.recv_into(view[got:])
        except BlockingIOError:
            try:
                await anyio.wait_readable(sock)
            except anyio.ClosedResourceError:  # dropped by aclose()
                return None
            continue
        except OSError:  # ECONNRESET: the worker is gone; EBADF: dropped
            return None
        if n == 0:
            return None
        got += n
    return bytes(buf)


async def receive(sock: socket.socket, max_bytes: int | None = None) -> Any:
    """The next message from a worker; ``None`` when it has gone away;
    ``("too_large", size, max_bytes)`` when its header announces more than ``max_bytes``
    (nothing more is read: the socket is then useless)."""
    header = await _recv_exact(sock, _HEADER.size)
    if header is None:
        return None
    size = _HEADER.unpack(header)[0]
    if max_bytes is not None and size > max_bytes:
        return ("too_large", size, max_bytes)
    payload = await _recv_exact(sock, size)
    if payload is None:
        return None
    try:
        return pickle.loads(payload)
    except Exception:  # a result of a class this process cannot rebuild
        return ("unpicklable", "an object")


async def send(sock: socket.socket, data: bytes) -> bool:
    """Send a whole frame; False if the worker is gone."""
    view = memoryview(data)
    while view:
        try:
            n = sock.send(view)
        except BlockingIOError:
            try:
                await anyio.wait_writable(sock)
            except anyio.ClosedResourceError:  # dropped by aclose()
                return False
            continue
        except OSError:  # EPIPE: the worker is gone (its last words are still readable)
            return False
        view = view[n:]
    return True


def encode_call(
    target: ProcessTarget,
    args: dict[str, Any],
    ctx: AuthContext,
    *,
    call_id: str | None,
    attempt: int,
    key: str,
    deadline: float,
) -> bytes:
    """One call as a worker receives it (``deadline`` on ``time.monotonic()``'s clock,
    which is the same in every process). Raises what ``pickle`` raises for a value that
    cannot be sent (an ``AuthContext`` attribute holding a lock, say)."""
    return frame((target, args, ctx, Attempt(target.tool, call_id, attempt, key, deadline)))
