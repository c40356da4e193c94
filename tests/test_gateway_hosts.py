"""Both servers of ``toolrelay serve`` check ``Host`` and ``Origin`` (issue 28, item 9).

The admin API refuses a request whose ``Host`` is not a name the server is reached by (421)
or whose ``Origin`` is a foreign page (403), as the MCP transport does: a DNS-rebinding page
cannot reach either. A wildcard bind (``0.0.0.0``, ``::``) does not turn the checks off: it
needs ``[serve] allowed_hosts``, the names clients use, and is refused without them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from test_gateway_sessions import HEADERS, INITIALIZE
from test_serve_mcp import (
    TOKEN,
    config_text,
    start_http_server,
    stop_http_server,
    wait_for_http_server,
)
from toolrelay.chaos.upstream import StandInUpstream

AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def upstream() -> Iterator[StandInUpstream]:
    with StandInUpstream().run_in_thread() as up:
        yield up


def port_of(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None
    return port


def test_the_admin_api_refuses_a_foreign_host_or_origin(
    upstream: StandInUpstream, tmp_path: Path
) -> None:
    """Before: ``GET /ui`` with ``Host: evil.example`` redirected to ``http://evil.example/ui/``
    and every route answered whatever ``Host`` it was sent."""
    server = start_http_server(tmp_path, upstream.url)
    try:
        admin, port = server.admin.url, port_of(server.admin.url)
        with httpx.Client(timeout=10) as http:
            for path in ("/ui", "/healthz", "/breakers"):
                for host in ("evil.example", f"evil.example:{port}", ""):
                    refused = http.get(admin + path, headers={**AUTH, "Host": host})
                    assert refused.status_code == 421, (path, host, refused.text)
                    assert "location" not in refused.headers
                    assert refused.json()["error"] == "misdirected_request"
                origin = {**AUTH, "Origin": "http://evil.example"}
                refused = http.get(admin + path, headers=origin)
                assert refused.status_code == 403, refused.text
                assert refused.json()["error"] == "forbidden_origin"
            # loopback, with the port or without it (HAProxy's health check sends no port)
            for host in (f"127.0.0.1:{port}", f"localhost:{port}", "127.0.0.1", "localhost"):
                served = http.get(admin + "/breakers", headers={**AUTH, "Host": host})
                assert served.status_code == 200, served.text
            page = http.get(admin + "/ui", headers={"Origin": f"http://localhost:{port}"})
            assert page.status_code == 307 and page.headers["location"].startswith(admin)
    finally:
        stop_http_server(server)


def serve(tmp_path: Path, upstream_url: str, extra: str, args: list[str]) -> subprocess.Popen[str]:
    config = tmp_path / "toolrelay.toml"
    config.write_text(config_text(upstream_url, transport="http", extra=extra))
    env = {**os.environ, "TOOLRELAY_ADMIN_TOKEN": TOKEN}
    command = [sys.executable, "-m", "toolrelay", "serve", "--config", str(config), *args]
    return subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env=env, text=True,
    )  # fmt: skip


@pytest.mark.parametrize(
    "args",
    [
        ["--host", "0.0.0.0"],
        ["--host", "::"],
        ["--admin-host", "0.0.0.0"],
    ],
)
def test_a_wildcard_bind_without_allowed_hosts_is_refused(
    upstream: StandInUpstream, tmp_path: Path, args: list[str]
) -> None:
    """Before: a wildcard bind served with the MCP transport's Host and Origin checks off."""
    proc = serve(tmp_path, upstream.url, "", ["--allow-remote", *args])
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("the server started on a wildcard address without allowed_hosts")
    assert proc.returncode == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "serve.allowed_hosts" in lines[0] and args[1] in lines[0], err


def test_a_wildcard_bind_checks_the_allowed_hosts(
    upstream: StandInUpstream, tmp_path: Path
) -> None:
    """With ``allowed_hosts``, a wildcard bind serves the names listed (and loopback), and
    refuses any other ``Host`` or ``Origin``."""
    text = config_text(upstream.url, transport="http")
    text = text.replace(
        "[serve]\n", '[serve]\nallowed_hosts = ["mcp.example", "ops.example:9999"]\n'
    )
    text = text.replace("[serve.http]\n", '[serve.http]\nhost = "0.0.0.0"\n')
    text = text.replace("[serve.admin]\n", '[serve.admin]\nhost = "0.0.0.0"\n')
    (tmp_path / "toolrelay.toml").write_text(text)
    errlog = tmp_path / "serve.err"
    with errlog.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "toolrelay", "serve", "--allow-remote",
             "--config", str(tmp_path / "toolrelay.toml")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
            env={**os.environ, "TOOLRELAY_ADMIN_TOKEN": TOKEN},
        )  # fmt: skip
    server = wait_for_http_server(proc, errlog)
    try:
        mcp_port, admin_port = port_of(server.mcp_url), port_of(server.admin.url)
        mcp = f"http://127.0.0.1:{mcp_port}/mcp"
        admin = f"http://127.0.0.1:{admin_port}"
        with httpx.Client(timeout=10) as http:

            def initialize(host: str, origin: str | None = None) -> int:
                headers = {**HEADERS, "Host": host}
                if origin is not None:
                    headers["Origin"] = origin
                return http.post(mcp, json=INITIALIZE, headers=headers).status_code

            assert initialize(f"mcp.example:{mcp_port}") == 200
            assert initialize(f"127.0.0.1:{mcp_port}") == 200
            assert initialize("mcp.example", "https://mcp.example") == 200  # behind a proxy
            assert initialize(f"evil.example:{mcp_port}") == 421
            assert initialize(f"0.0.0.0:{mcp_port}") == 421
            assert initialize(f"ops.example:{mcp_port}") == 421  # listed with another port
            assert initialize(f"mcp.example:{mcp_port}", "http://evil.example") == 403

            def admin_status(host: str) -> int:
                headers = {**AUTH, "Host": host}
                return http.get(admin + "/breakers", headers=headers).status_code

            assert admin_status(f"mcp.example:{admin_port}") == 200
            assert admin_status("ops.example:9999") == 200
            assert admin_status(f"evil.example:{admin_port}") == 421
        assert "anyone reaching 0.0.0.0 can call the tools" in server.errlog.read_text()
    finally:
        stop_http_server(server)
