"""The tool catalog end to end: ``toolrelay lock``, drift refused by a running gateway, and
``toolrelay lock --update`` bringing the tool back (``docs/catalog.md``).

A real ``toolrelay serve`` with the SDK test server as its upstream, talked to with the MCP
SDK's client; the upstream changes a tool's input schema while the gateway runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from test_gateway_reload import changed, envelope
from test_serve_mcp import (
    ROOT,
    TOKEN,
    HttpServer,
    http_session,
    names,
    stop_http_server,
    wait_for_http_server,
)
from toolrelay.catalog.lock import digest
from toolrelay.cli import main

TEST_SERVER = [sys.executable, str(ROOT / "tests" / "servers" / "mcp_test_server.py")]
NEW_SCHEMA = {
    "type": "object",
    "properties": {"message": {"type": "string"}, "mode": {"enum": ["loud", "quiet"]}},
    "required": ["message", "mode"],
    "additionalProperties": False,
}


def config(tmp: Path, *, on_drift: str = "refuse") -> Path:
    command = [*TEST_SERVER, "--record", str(tmp / "record")]
    path = tmp / "toolrelay.toml"
    path.write_text(f"""
[profiles.all]
require_approval = []
[serve]
transport = "http"
profile = "all"
watch_interval_s = 0.2
[serve.admin]
port = 0
[serve.http]
port = 0
[serve.upstreams.test]
command = {json.dumps(command)}
breaker_key = "mcp-test"
prefix = "up"
[serve.catalog]
lock = "tools.lock"
on_drift = "{on_drift}"
[serve.catalog.deprecated.up__pid]
since = "2026-01-01"
sunset = "2999-01-01"
use = "up__structured"
[serve.catalog.deprecated.up__multi]
since = "2026-01-01"
sunset = "2026-02-01T12:00:00Z"
use = "up__text"
""")
    return path


def lock(path: Path, *args: str) -> int:
    return main(["lock", "--config", str(path), *args])


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServer]:
    """One gateway for the module: the tests change different tools."""
    tmp = tmp_path_factory.mktemp("catalog")
    path = config(tmp)
    assert lock(path) == 0
    errlog = tmp / "serve.err"
    with errlog.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "toolrelay", "serve", "--config", str(path)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env={**os.environ, "TOOLRELAY_ADMIN_TOKEN": TOKEN},
        )
    started = wait_for_http_server(proc, errlog)
    yield started
    stop_http_server(started)


def test_lock_is_deterministic_and_refuses_a_stale_file(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "toolrelay.toml"
    path.write_text('[plugins.weather]\n[serve.catalog]\nlock = "tools.lock"\n')
    assert lock(path) == 0
    first = (tmp_path / "tools.lock").read_bytes()
    current = json.loads(first)["tools"]["weather_current"]
    assert current["risk"] == "read" and current["version"] == "1"
    assert current["sha256"] == digest(current["definition"])
    assert lock(path) == 0
    assert (tmp_path / "tools.lock").read_bytes() == first  # byte for byte
    assert "up to date (2 tools)" in capfd.readouterr().out
    stale = json.loads(first)
    stale["tools"]["weather_current"]["definition"]["description"] = "Something else."
    (tmp_path / "tools.lock").write_text(json.dumps(stale))
    assert lock(path) == 1  # without --update: shows the diff, writes nothing
    assert "weather_current: description: changed" in capfd.readouterr().out
    assert lock(path, "--update") == 0
    assert (tmp_path / "tools.lock").read_bytes() == first
    (tmp_path / "tools.lock").write_text("{not json")
    assert lock(path) == 2  # one line, no traceback
    assert "cannot read the lock file" in capfd.readouterr().err


@pytest.mark.anyio
async def test_a_changed_upstream_tool_is_refused_until_the_lock_is_updated(
    gateway: HttpServer,
) -> None:
    path, admin = gateway.errlog.parent / "toolrelay.toml", gateway.admin
    locked = json.loads((path.parent / "tools.lock").read_text())["tools"]["up__text"]
    assert locked["definition"]["inputSchema"]["required"] == ["message"]
    async with http_session(gateway.mcp_url) as (session, notes):
        assert "up__text" in names(await session.list_tools())
        assert not (await session.call_tool("up__text", {"message": "hi"})).is_error
        assert await admin.metric("toolrelay_tool_drift_total") == 0
        # the upstream changes the tool: a new required parameter (breaking)
        changing = {"name": "text", "input_schema": NEW_SCHEMA}
        assert not (await session.call_tool("up__add_tool", changing)).is_error
        await changed(notes)
        assert "up__text" not in names(await session.list_tools())
        refused = await envelope(session, "up__text", {"message": "hi", "mode": "loud"})
        assert refused["error_type"] == "tool_policy"
        assert "its definition changed since it was locked" in refused["message"]
        assert await admin.metric("toolrelay_tool_drift_total", tool="up__text") == 1
        assert await admin.metric("toolrelay_tool_drift_total", kind="breaking") == 1
        drift = await admin.call("GET", "/tools/up__text/drift")
        assert drift["kind"] == "breaking" and drift["offered"] is False
        assert {"where": "inputSchema.properties.mode", "what": "required parameter added",
                "breaking": True} in drift["changes"]  # fmt: skip
        assert drift["live"]["definition"]["inputSchema"] == NEW_SCHEMA
        assert (await admin.call("GET", "/tools/up__pid/drift"))["changes"] == []
        # reviewed and accepted: the gateway reads the new lock and offers the tool again
        assert await anyio.to_thread.run_sync(lock, path) == 1  # stale: refused
        assert await anyio.to_thread.run_sync(lock, path, "--update") == 0
        await changed(notes)
        assert "up__text" in names(await session.list_tools())
        answer = await session.call_tool("up__text", {"message": "hi", "mode": "loud"})
        assert not answer.is_error
        assert await admin.metric("toolrelay_tool_drift_total") == 1  # counted once


@pytest.mark.anyio
async def test_a_deprecated_tool_answers_with_a_hint_until_its_sunset(
    gateway: HttpServer,
) -> None:
    async with http_session(gateway.mcp_url) as (session, _):
        listing = names(await session.list_tools())
        assert "up__pid" in listing and "up__multi" not in listing  # past its sunset
        answer = await session.call_tool("up__pid", {})
        assert not answer.is_error
        hint = {"use": "up__structured", "sunset": "2999-01-01"}
        assert answer.meta == {"toolrelay/deprecated": hint}
        labels = {"tool": "up__pid", "caller": "default"}
        assert await gateway.admin.metric("toolrelay_deprecated_calls_total", **labels) == 1
        retired = await envelope(session, "up__multi", {})
        assert retired["error_type"] == "unknown_tool"
        assert retired["message"] == (
            "tool 'up__multi' was retired on 2026-02-01T12:00:00Z: use 'up__text'"
        )
        assert retired["deprecated"] == {"use": "up__text", "sunset": "2026-02-01T12:00:00Z"}
