"""An ASGI app served by uvicorn inside the caller's event loop (asyncio).

The socket is bound here, so a busy port is a clear error and ``port=0`` tells the port
it got; uvicorn's own signal handling is off (``toolrelay serve`` handles SIGINT and
SIGTERM once, for every server it runs) and so is its logging setup. So are its proxy
headers, unless proxies are trusted: a request's client is its peer address, and
``X-Forwarded-For``/``-Proto`` count only from ``trusted_proxies``.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator, Sequence

import anyio
import anyio.abc
import uvicorn
from starlette.types import ASGIApp

from .errors import ServeError

GRACEFUL_SHUTDOWN_S = 2


class _EmbeddedServer(uvicorn.Server):
    """uvicorn without its signal handlers: the embedding process owns the signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _bind(host: str, port: int) -> socket.socket:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ServeError(f"cannot resolve {host!r}: {exc.strerror}") from None
    infos.sort(key=lambda info: info[0] != socket.AF_INET)  # "localhost": IPv4 first
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise ServeError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


class HttpService:
    """One HTTP server: :meth:`start` binds and serves in a task group, :meth:`aclose` ends it."""

    def __init__(
        self,
        app: ASGIApp,
        host: str,
        port: int,
        trusted_proxies: Sequence[str] = (),
        headers: Sequence[tuple[str, str]] = (),
    ) -> None:
        """``headers``: sent on every answer (uvicorn adds them as it writes the head)."""
        self.host = host
        self._socket = _bind(host, port)
        self.port: int = self._socket.getsockname()[1]
        config = uvicorn.Config(
            app,
            log_config=None,
            log_level="warning",
            access_log=False,
            lifespan="off",
            server_header=False,
            headers=list(headers),
            proxy_headers=bool(trusted_proxies),
            forwarded_allow_ips=list(trusted_proxies),
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        )
        self._server = _EmbeddedServer(config)
        self._done: anyio.Event | None = None

    @property
    def url(self) -> str:
        """The base URL, e.g. ``http://127.0.0.1:8000``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self, tg: anyio.abc.TaskGroup) -> None:
        """Serve in ``tg``; returns once the server accepts connections."""
        self._done = anyio.Event()
        tg.start_soon(self._serve, self._done)
        while not self._server.started:
            if self._server.should_exit:
                raise ServeError(f"the HTTP server on {self.url} did not start")
            await anyio.sleep(0.01)

    async def _serve(self, done: anyio.Event) -> None:
        try:
            await self._server.serve(sockets=[self._socket])
        finally:
            self._socket.close()
            done.set()

    async def aclose(self) -> None:
        """Ask the server to finish its requests and stop; wait until it has (or a grace
        period has passed)."""
        self._server.should_exit = True
        if self._done is None:
            self._socket.close()
            return
        with anyio.move_on_after(GRACEFUL_SHUTDOWN_S + 1.0):
            await self._done.wait()
