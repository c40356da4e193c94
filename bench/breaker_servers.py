"""The tests' throwaway redis-server and slowing TCP proxy, for the breakers benchmark.

Both come from tests/ (plain subprocess, sockets and threads: no test dependencies);
``None`` from :func:`redis_binary` means the benchmark reports its Redis rows as skipped.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
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


def redis_server(binary: str) -> Any:
    """tests/redis_server.py's ``RedisServer`` for ``binary`` (a context manager)."""
    if str(TESTS) not in sys.path:
        sys.path.append(str(TESTS))
    from redis_server import RedisServer

    return RedisServer(binary=binary)
