"""A stand-in for the services the first-party plugins call, that misbehaves on command.

A small HTTP/1.1 server (anyio TCP listener + h11) on loopback that answers like
Open-Meteo (``/v1/forecast``, ``/v1/search``), SearXNG (``/search?format=json``) and two
feeds (``/feeds/rss.xml``, ``/feeds/atom.xml``). Faults are set per path prefix, from Python
(:meth:`Upstream.set_fault`) or over HTTP::

    POST   /_admin/faults   {"path": "/v1/forecast", "fault": "status", "status": 503, "rate": 0.5}
    GET    /_admin/faults   the faults in force
    DELETE /_admin/faults   clear all (``?path=/v1/forecast`` clears one)
    GET    /_admin/stats    requests seen per path, faults applied per kind (DELETE resets)
    POST   /_admin/seed     {"seed": 7}: restart the fault dice

The admin endpoint has no authentication, so it refuses what a web page could send: a
``Host`` other than the loopback address and port it listens on (403: DNS rebinding), an
``Origin`` other than that same ``http://host:port`` (403), and a body that is not
``Content-Type: application/json`` (415; a client sending neither ``Content-Type`` nor
``Origin``, such as a script, is tolerated).

Fault kinds and their parameters:

=============  =====================================================================
``delay``      wait ``seconds`` before the response headers
``slow_body``  send the headers, then dribble the body over ``seconds``
``hang``       never answer; wait until the client goes away
``reset``      close the connection abruptly (RST, via ``SO_LINGER`` 0)
``status``     answer HTTP ``status`` (400–599), with ``Retry-After: retry_after`` if given
``rate_limit`` answer 429 with ``Retry-After: retry_after`` (default 1)
``malformed``  answer 200 with a body that is not valid JSON/XML
``truncated``  declare the full ``Content-Length``, send half the body, close
``load``       wait ``seconds`` × (n / ``capacity``)² when n > ``capacity`` requests are
               in flight under the fault's path (n counted at arrival, itself
               included), else ``seconds``: a service whose throughput collapses past
               its capacity (each extra request slows all of them)
``slow_tail``  wait ``seconds``, or ``tail_seconds`` for a share ``tail`` of requests
               (drawn per request): a service with a slow tail, for hedging
=============  =====================================================================

Each fault applies to a request with probability ``rate``, drawn from one seeded
:class:`random.Random`, so the same seed and the same requests give the same faults.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import logging
import math
import random
import socket
import struct
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import formatdate
from http import HTTPStatus
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
import anyio.from_thread
import h11
from anyio.abc import SocketAttribute, SocketStream

from ._upstream_data import (
    REFERENCE_NOW,
    ROUTES,
    BadRequest,
    Reply,
    error_reply,
    json_reply,
    malformed,
)

__all__ = ["FAULT_KINDS", "Fault", "FaultError", "Upstream", "main"]

log = logging.getLogger("toolrelay.chaos")

FAULT_KINDS: dict[str, frozenset[str]] = {
    "delay": frozenset({"seconds"}),
    "slow_body": frozenset({"seconds"}),
    "hang": frozenset(),
    "reset": frozenset(),
    "status": frozenset({"status", "retry_after"}),
    "rate_limit": frozenset({"retry_after"}),
    "malformed": frozenset(),
    "truncated": frozenset(),
    "load": frozenset({"seconds", "capacity"}),
    "slow_tail": frozenset({"seconds", "tail", "tail_seconds"}),
}
"""Every fault kind and the parameters it takes (besides ``path`` and ``rate``)."""

MAX_SECONDS = 3600.0
MAX_ADMIN_BODY = 64 * 1024
MAX_REQUEST_BODY = 1024 * 1024
MAX_PATHS = 1000
SERVER = "toolrelay-upstream"
LINGER_RST = struct.pack("ii", 1, 0)


class FaultError(ValueError):
    """A fault description that cannot be used; the message says what is wrong."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Fault:
    """One fault, applied to requests whose path starts with ``path``."""

    path: str
    fault: str
    rate: float = 1.0
    seconds: float = 1.0
    status: int = 500
    retry_after: str | None = None
    capacity: int = 20
    tail: float = 0.05
    tail_seconds: float = 2.0

    def to_json(self) -> dict[str, Any]:
        """The fault as the admin endpoint lists it: only the parameters its kind uses."""
        out: dict[str, Any] = {"path": self.path, "fault": self.fault, "rate": self.rate}
        for name in sorted(FAULT_KINDS[self.fault]):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> Fault:
        """Check an admin request's fields; raise :class:`FaultError` with a clear reason."""
        if not isinstance(data, Mapping):
            raise FaultError("a fault must be a JSON object")
        kind = data.get("fault")
        if not isinstance(kind, str) or kind not in FAULT_KINDS:
            raise FaultError(f"'fault' must be one of {', '.join(sorted(FAULT_KINDS))}")
        path = data.get("path")
        if not isinstance(path, str) or not path.startswith("/") or len(path) > 200:
            raise FaultError("'path' must be a path prefix starting with '/'")
        if path.startswith("/_admin"):
            raise FaultError("the admin endpoint cannot be given faults")
        allowed = FAULT_KINDS[kind]
        unknown = sorted(set(data) - {"path", "fault", "rate"} - allowed)
        if unknown:
            raise FaultError(f"fault {kind!r} takes no parameter {unknown[0]!r}")
        rate = _number(data.get("rate", 1.0), "rate", 0.0, 1.0)
        fields: dict[str, Any] = {"path": path, "fault": kind, "rate": rate}
        if "seconds" in allowed:
            fields["seconds"] = _number(data.get("seconds", 1.0), "seconds", 0.0, MAX_SECONDS)
        if "status" in allowed:
            status = data.get("status", 500)
            if not isinstance(status, int) or isinstance(status, bool) or not 400 <= status <= 599:
                raise FaultError("'status' must be an integer from 400 to 599")
            fields["status"] = status
        if "capacity" in allowed:
            fields["capacity"] = int(_number(data.get("capacity", 20), "capacity", 1, 10000))
        if "tail" in allowed:
            fields["tail"] = _number(data.get("tail", 0.05), "tail", 0.0, 1.0)
            fields["tail_seconds"] = _number(
                data.get("tail_seconds", 2.0), "tail_seconds", 0.0, MAX_SECONDS
            )
        if "retry_after" in allowed:
            default = "1" if kind == "rate_limit" else None
            fields["retry_after"] = _retry_after(data.get("retry_after", default))
        return cls(**fields)


def _number(value: Any, name: str, low: float, high: float) -> float:
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or not low <= value <= high
    ):
        raise FaultError(f"{name!r} must be a number from {low:g} to {high:g}")
    return float(value)


def _retry_after(value: Any) -> str | None:
    """Seconds (a number) or an HTTP-date (a string), as the header will carry it."""
    if value is None:
        return None
    if isinstance(value, str):
        if not 0 < len(value) <= 64 or not all(" " <= ch <= "~" for ch in value):
            raise FaultError("'retry_after' must be seconds or a short HTTP-date")
        return value
    seconds = _number(value, "retry_after", 0.0, 86400.0)
    return str(int(seconds)) if seconds.is_integer() else str(seconds)


class _FaultTable:
    """Faults, dice and counters; shared by the server's loop and other threads."""

    def __init__(self, seed: int) -> None:
        self.lock = threading.Lock()
        self.faults: dict[str, Fault] = {}
        self.random = random.Random(seed)
        self.requests: Counter[str] = Counter()
        self.applied: Counter[str] = Counter()

    def draw(self, path: str) -> Fault | None:
        """Count the request; return the fault to apply to it, if any."""
        with self.lock:
            if path in self.requests or len(self.requests) < MAX_PATHS:
                self.requests[path] += 1
            else:
                self.requests["<other>"] += 1
            matches = [p for p in self.faults if path.startswith(p)]
            if not matches:
                return None
            fault = self.faults[max(matches, key=len)]  # the most specific prefix wins
            if self.random.random() >= fault.rate:
                return None
            self.applied[fault.fault] += 1
            return fault


class Upstream:
    """The stand-in server. Use ``async with Upstream() as up:`` or ``run_in_thread()``.

    ``now`` is the server's clock (a fixed instant by default, so answers are
    reproducible; pass a callable such as ``lambda: datetime.now(UTC)`` for a live one).
    Only loopback addresses are accepted unless ``allow_remote``: the admin endpoint has
    no authentication.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        seed: int = 0,
        now: datetime | Callable[[], datetime] = REFERENCE_NOW,
        keep_alive_s: float = 30.0,
        allow_remote: bool = False,
    ) -> None:
        if not allow_remote and not _is_loopback(host):
            raise ValueError(
                f"refusing to listen on {host!r}: the admin endpoint has no authentication "
                "(use a loopback address, or allow_remote=True)"
            )
        self.host = host
        self.port = port
        self.keep_alive_s = keep_alive_s
        self._clock = now if callable(now) else (lambda: now)
        self._table = _FaultTable(seed)
        self._static: dict[str, Reply] = {}
        self._loaded: Counter[str] = Counter()
        """Requests in flight under each ``load`` fault's path."""
        self._stack: AsyncExitStack | None = None

    # -- the Python API -------------------------------------------------------------------
    @property
    def url(self) -> str:
        """The base URL, e.g. ``http://127.0.0.1:41234`` (once started)."""
        if self._stack is None:
            raise RuntimeError("the upstream is not running")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def set_fault(self, path: str, fault: str, rate: float = 1.0, **params: Any) -> Fault:
        """Apply ``fault`` to requests under ``path`` (replacing its previous fault)."""
        parsed = Fault.parse({"path": path, "fault": fault, "rate": rate, **params})
        with self._table.lock:
            self._table.faults[parsed.path] = parsed
        return parsed

    def clear_faults(self, path: str | None = None) -> None:
        """Remove every fault, or the fault of one path prefix."""
        with self._table.lock:
            if path is None:
                self._table.faults.clear()
            else:
                self._table.faults.pop(path, None)

    @property
    def faults(self) -> list[Fault]:
        """The faults in force, most specific last."""
        with self._table.lock:
            return sorted(self._table.faults.values(), key=lambda f: (len(f.path), f.path))

    def seed(self, seed: int) -> None:
        """Restart the fault dice: the same seed gives the same sequence again."""
        with self._table.lock:
            self._table.random.seed(seed)

    @property
    def stats(self) -> dict[str, dict[str, int]]:
        """``{"requests": {path: n}, "faults": {kind: n}}`` since start (or the last reset)."""
        with self._table.lock:
            return {
                "requests": dict(self._table.requests),
                "faults": dict(self._table.applied),
            }

    def reset_stats(self) -> None:
        """Start counting requests and faults from zero."""
        with self._table.lock:
            self._table.requests.clear()
            self._table.applied.clear()

    def serve_static(self, path: str, body: bytes, content_type: str) -> None:
        """Answer ``GET path`` with exactly ``body`` (e.g. a hostile feed for a test)."""
        if not path.startswith("/") or path.startswith("/_admin"):
            raise ValueError("path must start with '/' and not be under /_admin")
        self._static[path] = Reply(200, bytes(body), content_type)

    # -- lifecycle ------------------------------------------------------------------------
    async def __aenter__(self) -> Upstream:
        if self._stack is not None:
            raise RuntimeError("the upstream is running already")
        stack = AsyncExitStack()
        try:
            listener = await anyio.create_tcp_listener(local_host=self.host, local_port=self.port)
            await stack.enter_async_context(listener)
            self.port = listener.extra(SocketAttribute.local_port)
            tg = await stack.enter_async_context(anyio.create_task_group())
            stack.callback(tg.cancel_scope.cancel)
            tg.start_soon(listener.serve, self._connection)
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        stack, self._stack = self._stack, None
        assert stack is not None
        return await stack.__aexit__(exc_type, exc, tb)

    @contextlib.contextmanager
    def run_in_thread(self) -> Iterator[Upstream]:
        """Run on an event loop in a background thread, for synchronous callers.

        The thread is stopped and joined when the block ends.
        """
        with (
            anyio.from_thread.start_blocking_portal() as portal,
            portal.wrap_async_context_manager(self),
        ):
            yield self

    # -- connections ----------------------------------------------------------------------
    async def _connection(self, stream: SocketStream) -> None:
        try:
            async with stream:
                await self._converse(stream)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass  # the client went away
        except Exception:
            log.exception("toolrelay upstream: connection failed")  # never stop the server

    async def _converse(self, stream: SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        while True:
            try:
                request = await self._read_request(conn, stream)
            except h11.RemoteProtocolError:
                await stream.send(
                    b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                )
                return
            except _TooLarge:
                await stream.send(
                    b"HTTP/1.1 413 Content Too Large\r\nContent-Length: 0\r\n"
                    b"Connection: close\r\n\r\n"
                )
                return
            if request is None:
                return
            if not await self._exchange(conn, stream, *request):
                return
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return
            conn.start_next_cycle()

    async def _read_request(
        self, conn: h11.Connection, stream: SocketStream
    ) -> tuple[h11.Request, bytes] | None:
        request: h11.Request | None = None
        body = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = b""
                with anyio.move_on_after(self.keep_alive_s if request is None else math.inf):
                    with contextlib.suppress(anyio.EndOfStream):
                        data = await stream.receive(65536)
                if not data:
                    return None  # closed, or idle too long between requests
                conn.receive_data(data)
            elif isinstance(event, h11.Request):
                request = event
                for name, value in event.headers:
                    if name == b"content-length" and int(value) > MAX_REQUEST_BODY:
                        raise _TooLarge
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > MAX_REQUEST_BODY:
                    raise _TooLarge
            elif isinstance(event, h11.EndOfMessage):
                assert request is not None
                return request, bytes(body)
            else:  # ConnectionClosed or PAUSED
                return None

    async def _exchange(
        self, conn: h11.Connection, stream: SocketStream, request: h11.Request, body: bytes
    ) -> bool:
        """Answer one request; False when the connection must not be used again."""
        method = request.method.decode("ascii", "replace")
        parts = urlsplit(request.target.decode("ascii", "replace"))
        path = parts.path or "/"
        head = method == "HEAD"
        if path == "/_admin" or path.startswith("/_admin/"):
            refused = self._admin_refusal(method, dict(request.headers), body)
            reply = refused or self._admin(method, path, parts.query, body)
            await _send(conn, stream, reply, head=head)
            return True
        reply = self._route(method, path, parts.query)
        fault = self._table.draw(path)
        if fault is None:
            await _send(conn, stream, reply, head=head)
            return True
        return await self._misbehave(fault, conn, stream, reply, head)

    def _route(self, method: str, path: str, query: str) -> Reply:
        static = self._static.get(path)
        route = ROUTES.get(path)
        if static is None and route is None:
            return error_reply(404, "Not Found")
        if method not in ("GET", "HEAD"):
            return error_reply(405, "Method Not Allowed", (("allow", "GET"),))
        if static is not None:
            return static
        assert route is not None
        try:
            return route(parse_qs(query, keep_blank_values=True), self._clock())
        except BadRequest as exc:
            return error_reply(400, str(exc))

    async def _misbehave(
        self, fault: Fault, conn: h11.Connection, stream: SocketStream, reply: Reply, head: bool
    ) -> bool:
        kind = fault.fault
        retry_after = () if fault.retry_after is None else (("retry-after", fault.retry_after),)
        if kind == "delay":
            await anyio.sleep(fault.seconds)
        elif kind == "load":
            self._loaded[fault.path] += 1
            try:
                crowd = self._loaded[fault.path] / fault.capacity
                await anyio.sleep(fault.seconds * max(1.0, crowd) ** 2)
            finally:
                self._loaded[fault.path] -= 1
        elif kind == "slow_tail":
            with self._table.lock:
                slow = self._table.random.random() < fault.tail
            await anyio.sleep(fault.tail_seconds if slow else fault.seconds)
        elif kind == "slow_body":
            await _send(conn, stream, reply, head=head, dribble_s=fault.seconds)
            return True
        elif kind == "hang":
            await _until_closed(stream)
            return False
        elif kind == "reset":
            _linger_zero(stream)
            await stream.aclose()
            return False
        elif kind == "status":
            phrase = _phrase(fault.status) or "Error"
            reply = error_reply(fault.status, phrase, retry_after)
        elif kind == "rate_limit":
            reply = error_reply(429, "Too many requests", retry_after)
        elif kind == "malformed":
            reply = malformed(reply)
        elif kind == "truncated":
            await _send(conn, stream, reply, head=head, truncate=True)
            await stream.send_eof()
            return False
        await _send(conn, stream, reply, head=head)
        return True

    # -- admin ----------------------------------------------------------------------------
    def _admin_refusal(self, method: str, headers: dict[bytes, bytes], body: bytes) -> Reply | None:
        """Why an admin request is refused (403/415), or ``None``: the admin endpoint has no
        authentication, so it must not be reachable from a web page the developer opens.

        * ``Host`` must name the loopback address and port the server listens on (a
          DNS-rebinding page has its own name there); not checked when it listens on a
          non-loopback address (``allow_remote``).
        * ``Origin``, when sent, must be ``http://`` + that same host and port (browsers
          send it with every cross-site POST and DELETE; ``null`` is refused too).
        * A body must be ``Content-Type: application/json`` (a form or ``text/plain`` POST
          is what a page can send without asking); a non-browser client that sends neither
          ``Content-Type`` nor ``Origin`` is tolerated.
        """
        host = headers.get(b"host", b"").decode("latin-1").strip().lower()
        if _is_loopback(self.host) and not self._names_us(host):
            return json_reply({"error": "the admin endpoint answers only its loopback Host"}, 403)
        origin = headers.get(b"origin")
        if origin is not None:
            parts = urlsplit(origin.decode("latin-1").strip().lower())
            if parts.scheme != "http" or parts.netloc != host or parts.path not in ("", "/"):
                return json_reply({"error": "cross-origin admin requests are refused"}, 403)
        if body or method in ("POST", "PUT", "PATCH"):
            content_type = headers.get(b"content-type")
            if content_type is None and origin is None:
                return None
            kind = (content_type or b"").split(b";", 1)[0].strip().lower()
            if kind != b"application/json":
                return json_reply({"error": "admin requests with a body must be JSON"}, 415)
        return None

    def _names_us(self, host: str) -> bool:
        """Is ``host`` (a Host header) a loopback address with the port we listen on?"""
        parts = urlsplit(f"//{host}")
        try:
            port = parts.port
        except ValueError:
            return False
        name = parts.hostname or ""
        if not name or not _is_loopback(name):
            return False
        return (port if port is not None else 80) == self.port

    def _admin(self, method: str, path: str, query: str, body: bytes) -> Reply:
        try:
            if path == "/_admin/faults":
                if method == "GET":
                    return json_reply({"faults": [f.to_json() for f in self.faults]})
                if method == "POST":
                    fault = Fault.parse(_json_object(body))
                    with self._table.lock:
                        self._table.faults[fault.path] = fault
                    return json_reply({"fault": fault.to_json()})
                if method == "DELETE":
                    prefix = parse_qs(query).get("path")
                    self.clear_faults(prefix[-1] if prefix else None)
                    return json_reply({"faults": [f.to_json() for f in self.faults]})
                return _not_allowed("GET, POST, DELETE")
            if path == "/_admin/stats":
                if method == "GET":
                    return json_reply(self.stats)
                if method == "DELETE":
                    self.reset_stats()
                    return json_reply(self.stats)
                return _not_allowed("GET, DELETE")
            if path == "/_admin/seed":
                if method != "POST":
                    return _not_allowed("POST")
                seed = _json_object(body).get("seed")
                if not isinstance(seed, int) or isinstance(seed, bool):
                    raise FaultError("'seed' must be an integer")
                self.seed(seed)
                return json_reply({"seed": seed})
            return json_reply({"error": "no such admin endpoint"}, 404)
        except FaultError as exc:
            return json_reply({"error": str(exc)}, 400)


class _TooLarge(Exception):
    pass


def _json_object(body: bytes) -> dict[str, Any]:
    if len(body) > MAX_ADMIN_BODY:
        raise FaultError("the request body is too large")
    try:
        data = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise FaultError("the request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise FaultError("the request body must be a JSON object")
    return data


def _not_allowed(allow: str) -> Reply:
    return json_reply({"error": "method not allowed"}, 405, (("allow", allow),))


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


async def _send(
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
        status_code=reply.status, headers=headers, reason=_phrase(reply.status).encode()
    )
    await _write(stream, conn.send(response))
    if head:
        body = b""  # a HEAD answer has headers only
    if truncate:
        await _write(stream, conn.send(h11.Data(data=body[: len(body) // 2])))
        return  # no EndOfMessage: the client is left short of Content-Length
    if dribble_s > 0 and body:
        pieces = min(len(body), 10)
        size = -(-len(body) // pieces)
        for start in range(0, len(body), size):
            await anyio.sleep(dribble_s / pieces)
            await _write(stream, conn.send(h11.Data(data=body[start : start + size])))
    elif body:
        await _write(stream, conn.send(h11.Data(data=body)))
    await _write(stream, conn.send(h11.EndOfMessage()))


async def _write(stream: SocketStream, data: bytes | None) -> None:
    if data:
        await stream.send(data)


async def _until_closed(stream: SocketStream) -> None:
    """Read and drop whatever the client sends until it closes the connection."""
    with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
        while True:
            await stream.receive()


def _linger_zero(stream: SocketStream) -> None:
    """Make the coming close send RST instead of FIN, where the platform allows."""
    with contextlib.suppress(OSError, AttributeError):
        raw: socket.socket = stream.extra(SocketAttribute.raw_socket)
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RST)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


# -- command line --------------------------------------------------------------------------
DESCRIPTION = (
    "Serve stand-ins for Open-Meteo, SearXNG and feeds; misbehave on command (POST /_admin/faults)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``toolrelay chaos upstream`` (shared with the ``toolrelay`` CLI)."""
    parser.add_argument("--host", default="127.0.0.1", help="loopback address (127.0.0.1)")
    parser.add_argument("--port", type=int, default=8765, help="port, 0 for any (8765)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the fault dice (0)")
    parser.add_argument(
        "--live-clock",
        action="store_true",
        help="date answers by the wall clock instead of a fixed instant",
    )


def main(argv: list[str] | argparse.Namespace | None = None) -> int:
    """``toolrelay chaos upstream``: run the stand-in until interrupted."""
    if isinstance(argv, argparse.Namespace):
        args = argv
    else:
        parser = argparse.ArgumentParser(prog="toolrelay chaos upstream", description=DESCRIPTION)
        add_arguments(parser)
        args = parser.parse_args(argv)
    clock: datetime | Callable[[], datetime] = (
        (lambda: datetime.now(UTC)) if args.live_clock else REFERENCE_NOW
    )
    try:
        upstream = Upstream(args.host, args.port, seed=args.seed, now=clock)
    except ValueError as exc:
        print(f"toolrelay: {exc}", file=sys.stderr)
        return 2

    async def serve() -> None:
        async with upstream as up:
            print(f"stand-in upstream on {up.url} (faults: {up.url}/_admin/faults)", flush=True)
            await anyio.sleep_forever()

    try:
        anyio.run(serve)
    except KeyboardInterrupt:
        return 0
    except OSError as exc:
        print(
            f"toolrelay: cannot listen on {args.host}:{args.port}: {exc.strerror}", file=sys.stderr
        )
        return 1
    return 0
