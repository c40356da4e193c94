from __future__ import annotations

import gc
import os
import shutil
from pathlib import Path

import pytest

REQUIRE_SERVERS = os.environ.get("TOOLRELAY_REQUIRE_SERVERS") == "1"


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def need_binary(name: str) -> str:
    """Path of a server binary; skip (or fail with TOOLRELAY_REQUIRE_SERVERS=1) if missing."""
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")  # haproxy
    if path is None:
        message = f"{name} is not installed (apt-get install {name})"
        if REQUIRE_SERVERS:
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """make test's parallel phase names, in $TOOLRELAY_SERIAL_FILES, the files holding a test
    marked ``serial`` (seen here before ``-m "not serial"`` deselects them; written by one
    worker): the serial phase then collects those files only."""
    path = os.environ.get("TOOLRELAY_SERIAL_FILES")
    if path and os.environ.get("PYTEST_XDIST_WORKER", "gw0") == "gw0":
        files = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("serial")}
        Path(path).write_text("".join(f"{name}\n" for name in sorted(files)))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Move what collection built (every test module, the libraries they import) out of the
    garbage collector's reach: in a worker that collected the whole suite each full
    collection walked it all (~0.3 s; a benchmark test collects 50 times)."""
    gc.collect()
    gc.freeze()
