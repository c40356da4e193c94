from __future__ import annotations

import os
import shutil

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
