"""A stand-in for the services the first-party plugins call, that misbehaves on command.

A small HTTP/1.1 server (anyio TCP listener + h11) on loopback that answers like
Open-Meteo (``/v1/forecast``, ``/v1/search``), SearXNG (``/search?format=json``) and two
feeds (``/feeds/rss.xml``, ``/feeds/atom.xml``). The fault kinds, their parameters and the
admin endpoint (``/_admin/faults``, ``/_admin/stats``, ``/_admin/seed``) are in
docs/chaos.md.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from types import TracebackType
from urllib.parse import parse_qs, urlsplit

import anyio
import anyio.from_thread
from anyio.abc import SocketAttribute, SocketStream

from ..net import is_loopback
from . import upstream_admin as admin
from ._upstream_data import REFERENCE_NOW, ROUTES
from ._upstream_replies import BadRequest, Reply, error_reply, malformed
from .upstream_faults import FAULT_KINDS, FaultError, FaultTable, UpstreamFault

try:
    import h11
except ModuleNotFoundError as exc:  # the ``chaos`` extra (``cli`` has it too)
    raise ModuleNotFoundError(
        "the stand-in upstream needs h11: pip install 'toolrelay[chaos]'", name="h11"
    ) from exc

from . import upstream_wire as wire  # h11 too

__all__ = ["FAULT_KINDS", "UpstreamFault", "FaultError", "StandInUpstream", "main"]

log = logging.getLogger("toolrelay.chaos")


class StandInUpstream(FaultTable):
    """The stand-in server. Use ``async with StandInUpstream() as up:`` or ``run_in_thread()``;
    its faults and counters are :class:`FaultTable`'s (``set_fault``, ``stats``, …).

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
        if not allow_remote and not is_loopback(host):
            raise ValueError(
                f"refusing to listen on {host!r}: the admin endpoint has no authentication "
                "(use a loopback address, or allow_remote=True)"
            )
        self.host = host
        self.port = port
        self.keep_alive_s = keep_alive_s
        self._clock = now if callable(now) else (lambda: now)
        super().__init__(seed)
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

    def serve_static(self, path: str, body: bytes, content_type: str) -> None:
        """Answer ``GET path`` with exactly ``body`` (e.g. a hostile feed for a test)."""
        if not path.startswith("/") or path.startswith("/_admin"):
            raise ValueError("path must start with '/' and not be under /_admin")
        self._static[path] = Reply(200, bytes(body), content_type)

    # -- lifecycle ------------------------------------------------------------------------
    async def __aenter__(self) -> StandInUpstream:
        if self._stack is not None:
            raise RuntimeError("the upstream is running already")
        async with AsyncExitStack() as stack:  # unwound if starting fails
            listener = await anyio.create_tcp_listener(local_host=self.host, local_port=self.port)
            await stack.enter_async_context(listener)
            self.port = listener.extra(SocketAttribute.local_port)
            tg = await stack.enter_async_context(anyio.create_task_group())
            stack.callback(tg.cancel_scope.cancel)
            tg.start_soon(listener.serve, self._connection)
            self._stack = stack.pop_all()
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
    def run_in_thread(self) -> Iterator[StandInUpstream]:
        """Run on an event loop in a background thread (joined when the block ends), for
        synchronous callers."""
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
                request = await wire.read_request(conn, stream, self.keep_alive_s)
            except h11.RemoteProtocolError:
                await stream.send(
                    b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                )
                return
            except wire.TooLarge:
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

    async def _exchange(
        self, conn: h11.Connection, stream: SocketStream, request: h11.Request, body: bytes
    ) -> bool:
        """Answer one request; False when the connection must not be used again."""
        method = request.method.decode("ascii", "replace")
        parts = urlsplit(request.target.decode("ascii", "replace"))
        path = parts.path or "/"
        head = method == "HEAD"
        if path == "/_admin" or path.startswith("/_admin/"):
            refused = admin.refusal(self.host, self.port, method, dict(request.headers), body)
            reply = refused or admin.answer(self, method, path, parts.query, body)
            await wire.send(conn, stream, reply, head=head)
            return True
        reply = self._route(method, path, parts.query)
        fault = self.draw(path)
        if fault is None:
            await wire.send(conn, stream, reply, head=head)
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
        self,
        fault: UpstreamFault,
        conn: h11.Connection,
        stream: SocketStream,
        reply: Reply,
        head: bool,
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
            slow = self.chance(fault.tail)
            await anyio.sleep(fault.tail_seconds if slow else fault.seconds)
        elif kind == "slow_body":
            await wire.send(conn, stream, reply, head=head, dribble_s=fault.seconds)
            return True
        elif kind == "hang":
            await wire.until_closed(stream)
            return False
        elif kind == "reset":
            wire.linger_zero(stream)
            await stream.aclose()
            return False
        elif kind == "status":
            phrase = wire.phrase(fault.status) or "Error"
            reply = error_reply(fault.status, phrase, retry_after)
        elif kind == "rate_limit":
            reply = error_reply(429, "Too many requests", retry_after)
        elif kind == "malformed":
            reply = malformed(reply)
        elif kind == "truncated":
            await wire.send(conn, stream, reply, head=head, truncate=True)
            await stream.send_eof()
            return False
        await wire.send(conn, stream, reply, head=head)
        return True


# -- command line --------------------------------------------------------------------------
def main(args: argparse.Namespace) -> int:
    """``toolrelay chaos upstream`` (its options: :mod:`toolrelay.cli`): run until interrupted."""
    clock: datetime | Callable[[], datetime] = (
        (lambda: datetime.now(UTC)) if args.live_clock else REFERENCE_NOW
    )
    try:
        upstream = StandInUpstream(args.host, args.port, seed=args.seed, now=clock)
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
