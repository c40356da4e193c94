"""A TCP proxy for tests that adds latency to client → server bytes, or hangs on demand.

``SlowProxy`` listens on a free 127.0.0.1 port and forwards each accepted connection to
``target_host:target_port``. Every chunk the client sends waits ``delay_s`` before it is
forwarded, so each request/response round trip (e.g. one Redis command) costs at least
``delay_s``. Server → client bytes are forwarded at once.

Everything runs on plain blocking sockets in daemon threads (one accept thread, plus a pair of
pump threads per connection), never on the caller's event loop, so code under test can run on
asyncio or trio. Connections are independent: one connection's delay never holds another's bytes.

    with SlowProxy("127.0.0.1", server.port, 0.040) as proxy:
        client = redis.Redis(host="127.0.0.1", port=proxy.port)
        proxy.delay_s = 0.0  # change the latency at run time
        proxy.pause()  # accept and read, but forward nothing: a hung server
        proxy.resume()

All threads are named ``slow-proxy-…``; ``close()`` (or leaving the ``with``) closes every
socket and joins the threads with a timeout.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
from types import TracebackType

THREAD_PREFIX = "slow-proxy"
_CHUNK = 65536
_ACCEPT_POLL_S = 0.05


class _Connection:
    """One proxied connection: the client's socket, the upstream socket and their pumps."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._open_directions = 2

    def direction_done(self) -> bool:
        """Record that one pump finished; True for the last one (which closes the sockets)."""
        with self._lock:
            self._open_directions -= 1
            return self._open_directions == 0

    def abort(self) -> None:
        """Unblock both pumps (any recv/send fails or returns EOF)."""
        for sock in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.client.close()
        self.upstream.close()


class SlowProxy:
    """Forward 127.0.0.1:``port`` to ``target_host:target_port``, delaying client → server bytes."""

    def __init__(self, target_host: str, target_port: int, delay_s: float = 0.0) -> None:
        self.target = (target_host, target_port)
        #: Seconds each client → server chunk waits before it is forwarded; read per chunk, so it
        #: may be changed at any time.
        self.delay_s = delay_s
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self._listener.settimeout(_ACCEPT_POLL_S)
        self.port: int = self._listener.getsockname()[1]
        self._closed = threading.Event()
        self._cond = threading.Condition()  # guards _paused and _connections
        self._paused = False
        self._connections: set[_Connection] = set()
        self._ids = itertools.count(1)
        self._acceptor = threading.Thread(
            target=self._accept_loop, name=f"{THREAD_PREFIX}-accept-{self.port}", daemon=True
        )

    @property
    def url(self) -> str:
        """A ``redis://`` URL for the proxy (database 0)."""
        return f"redis://127.0.0.1:{self.port}/0"

    # -- control -------------------------------------------------------------------------------

    def start(self) -> SlowProxy:
        self._acceptor.start()
        return self

    def pause(self) -> None:
        """Keep accepting connections and reading bytes, but forward nothing in either direction."""
        with self._cond:
            self._paused = True

    def resume(self) -> None:
        """Forward again, including anything held while paused."""
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    def close(self, timeout: float = 5.0) -> None:
        """Stop accepting, close every socket and join all threads (each with ``timeout``)."""
        self._closed.set()
        with self._cond:
            self._cond.notify_all()
            connections = list(self._connections)
        if self._acceptor.is_alive():
            self._acceptor.join(timeout)
        self._listener.close()
        for conn in connections:
            conn.abort()
        for conn in connections:
            for thread in conn.threads:
                thread.join(timeout)

    def __enter__(self) -> SlowProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- threads -------------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._spawn(_Connection(client, upstream))

    def _spawn(self, conn: _Connection) -> None:
        n = next(self._ids)
        conn.threads = [
            threading.Thread(
                target=self._pump,
                args=(conn, conn.client, conn.upstream, True),
                name=f"{THREAD_PREFIX}-c2s-{self.port}-{n}",
                daemon=True,
            ),
            threading.Thread(
                target=self._pump,
                args=(conn, conn.upstream, conn.client, False),
                name=f"{THREAD_PREFIX}-s2c-{self.port}-{n}",
                daemon=True,
            ),
        ]
        with self._cond:
            if self._closed.is_set():
                conn.close()
                return
            self._connections.add(conn)
        for thread in conn.threads:
            thread.start()

    def _hold(self, delay: bool) -> bool:
        """Wait out the delay and any pause; False if the proxy closed meanwhile."""
        if delay and self.delay_s > 0 and self._closed.wait(self.delay_s):
            return False
        with self._cond:
            self._cond.wait_for(lambda: not self._paused or self._closed.is_set())
        return not self._closed.is_set()

    def _pump(self, conn: _Connection, src: socket.socket, dst: socket.socket, delay: bool) -> None:
        try:
            while data := src.recv(_CHUNK):
                if not self._hold(delay):
                    break
                dst.sendall(data)
            else:
                dst.shutdown(socket.SHUT_WR)  # pass the EOF on; the other direction goes on
        except OSError:
            conn.abort()
        else:
            if self._closed.is_set():
                conn.abort()
        if conn.direction_done():
            conn.close()
            with self._cond:
                self._connections.discard(conn)
