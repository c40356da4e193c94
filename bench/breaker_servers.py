"""A throwaway redis-server and the tests' slowing TCP proxy, for the breakers benchmark.

``RedisServer`` is tests/redis_server.py without pytest: ``None`` from :func:`redis_binary`
means the benchmark reports its Redis rows as skipped. ``SlowProxy`` is imported from
tests/slow_proxy.py (plain sockets and threads, no test dependencies).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

TESTS = Path(__file__).resolve().parents[1] / "tests"


def redis_binary() -> str | None:
    return shutil.which("redis-server")


def slow_proxy(host: str, port: int, delay_s: float) -> Any:
    """tests/slow_proxy.py's ``SlowProxy(host, port, delay_s)``, started."""
    if str(TESTS) not in sys.path:
        sys.path.append(str(TESTS))  # last: nothing of the bench's is shadowed
    from slow_proxy import SlowProxy

    return SlowProxy(host, port, delay_s).start()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """A real redis-server on a free loopback port, no persistence, in a temporary dir."""

    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.port = free_port()
        self.dir = tempfile.TemporaryDirectory(prefix="toolrelay-bench-redis-")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def __enter__(self) -> RedisServer:
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--dir", self.dir.name,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as conn:
                    conn.sendall(b"PING\r\n")
                    if conn.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.02)
        self.__exit__(None, None, None)
        raise RuntimeError("redis-server did not start")

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None
        self.dir.cleanup()
