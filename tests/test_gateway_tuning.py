"""``toolrelay serve`` tuned for speed: ``[serve.http] json_response`` and ``stateless``,
and the heap frozen after start-up.

The real clients must still work with each transport mode: the MCP Python SDK (the 2025
session and the 2026 ``Client``, on asyncio and trio), the official TypeScript SDKs and
the MCP Inspector CLI, with ``mcp-server-time`` behind the gateway and the same three
calls (and checks) as ``tests/test_gateway_clients.py``. Speed itself is measured in
``bench/gateway.py``, never asserted here.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import time
import weakref
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from mcp import Client, ClientSession
from mcp.client.streamable_http import streamable_http_client

from node_packages import unavailable
from test_gateway_clients import (
    CALLS,
    MCP_LINE,
    NodeClients,
    as_json,
    check_calls,
    node_clients,
    serve_command,
    serve_env,
)
from toolrelay.config import ConfigError
from toolrelay.serve.runner import settle_heap
from toolrelay.serve.settings import parse_serve_section
from toolrelay.serve.upstreams import build_source

__all__ = ["node_clients"]  # the fixture, shared with test_gateway_clients

MODES = {
    "json": "json_response = true",
    "stateless": "json_response = true\nstateless = true",
    "sse-stateless": "stateless = true",
}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "probe", "version": "1"},
    },
}


@pytest.fixture(scope="module", params=list(MODES))
def gateway(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """``toolrelay serve`` over HTTP in one tuned mode, mcp-server-time behind it: its URL."""
    import importlib.util

    if importlib.util.find_spec("mcp_server_time") is None:
        unavailable("mcp-server-time is not installed (pip install mcp-server-time)")
    mode: str = request.param
    upstream = [sys.executable, "-m", "mcp_server_time", "--local-timezone", "UTC"]
    workdir = tmp_path_factory.mktemp(f"tuned-{mode}")
    config = workdir / "toolrelay.toml"
    config.write_text(f"""
[dispatcher]
max_output_bytes = 160
truncate_output = true
[serve]
transport = "http"
[serve.http]
port = 0
{MODES[mode]}
[serve.upstreams.time]
command = {json.dumps(upstream)}
breaker_key = "mcp-time"
prefix = "time"
timeout_s = 10
""")
    errlog = workdir / "serve.err"
    with errlog.open("w") as err:
        proc = subprocess.Popen(
            serve_command(config),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=serve_env(),
        )
    try:
        deadline = time.monotonic() + 30
        urls: dict[str, str] = {}
        while "MCP on" not in urls:
            assert proc.poll() is None, errlog.read_text()
            assert time.monotonic() < deadline, errlog.read_text()
            time.sleep(0.05)
            urls = dict(MCP_LINE.findall(errlog.read_text()))
        yield urls["MCP on"] + f"#{mode}"
    finally:
        proc.terminate()
        try:
            assert proc.wait(timeout=15) == 0, errlog.read_text()
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert "Traceback" not in errlog.read_text()


def split(gateway: str) -> tuple[str, str]:
    url, _, mode = gateway.partition("#")
    return url, mode


# -- the mode is the one configured ---------------------------------------------------------
def test_the_configured_mode_is_served(gateway: str) -> None:
    url, mode = split(gateway)
    headers = {"Accept": "application/json, text/event-stream"}
    response = httpx.post(url, json=INITIALIZE, headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    kind = response.headers["content-type"].split(";")[0]
    assert kind == ("text/event-stream" if mode == "sse-stateless" else "application/json")
    # stateless: no session to name; otherwise the 2025 handshake opens one
    assert ("mcp-session-id" in response.headers) is (not MODES[mode].endswith("stateless = true"))
    if kind == "application/json":
        assert response.json()["result"]["serverInfo"]["name"] == "toolrelay"


# -- the Python SDK -----------------------------------------------------------------------------
async def call_all(session: Any) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []
    for name, arguments in CALLS:
        try:
            result = await session.call_tool(name, arguments)
        except RuntimeError as exc:  # the SDK's own output-schema check
            calls.append({"name": name, "error": str(exc)})
        else:
            calls.append({"name": name, "result": as_json(result)})
    return calls


@pytest.mark.anyio
async def test_python_sdk_2025_session(gateway: str) -> None:
    url, mode = split(gateway)
    async with (
        streamable_http_client(url) as (read, write),
        ClientSession(read, write) as session,
    ):
        init = await session.initialize()
        assert init.server_info.name == "toolrelay"
        listing = await session.list_tools()
        assert {tool.name for tool in listing.tools} >= {"time__get_current_time"}
        check_calls(await call_all(session), f"the Python SDK's ClientSession ({mode})")
        # an unknown tool is still an answer, not a transport failure
        result = await session.call_tool("time__nope", {})
        assert result.is_error is True
        envelope = json.loads(result.content[0].text)  # type: ignore[union-attr]
        assert envelope["ok"] is False and envelope["error_type"] == "unknown_tool", envelope


@pytest.mark.anyio
async def test_python_sdk_2026_client(gateway: str) -> None:
    url, mode = split(gateway)
    async with Client(url, cache=None) as client:
        assert client.protocol_version == "2026-07-28"
        await client.list_tools()
        check_calls(await call_all(client), f"the Python SDK's 2026 Client ({mode})")


# -- the Node clients ---------------------------------------------------------------------------
@pytest.mark.servers
@pytest.mark.parametrize(("sdk", "era"), [("v1", "legacy"), ("v2", "auto")])
def test_typescript_sdk_client(node_clients: NodeClients, gateway: str, sdk: str, era: str) -> None:
    url, mode = split(gateway)
    out = node_clients.sdk(sdk, [url], era=era)
    assert out["tools"]["time__get_current_time"] is not None
    check_calls(out["calls"], f"TypeScript SDK {sdk} ({mode})")


@pytest.mark.servers
def test_inspector_cli(node_clients: NodeClients, gateway: str) -> None:
    url, mode = split(gateway)
    check_calls(node_clients.inspector([url], CALLS), f"the MCP Inspector CLI ({mode})")


# -- the settings and the heap --------------------------------------------------------------
def test_transport_mode_settings() -> None:
    settings = parse_serve_section({"http": {"json_response": True, "stateless": True}}).http
    assert settings.json_response is True and settings.stateless is True
    default = parse_serve_section({}).http
    assert default.json_response is False and default.stateless is False
    for key in ("json_response", "stateless"):
        with pytest.raises(ConfigError, match=f"serve.http.{key}"):
            parse_serve_section({"http": {key: "yes"}})


def test_upstream_protocol_setting() -> None:
    def upstream(**extra: Any) -> dict[str, Any]:
        table = {"command": ["echo-mcp"], "breaker_key": "up", **extra}
        return {"upstreams": {"up": table}}

    (default,) = parse_serve_section(upstream()).upstreams.values()
    assert default.protocol == "auto" and build_source(default, {}).options.protocol == "auto"
    for mode in ("auto", "legacy", "2026-07-28"):
        (chosen,) = parse_serve_section(upstream(protocol=mode)).upstreams.values()
        assert chosen.protocol == mode and build_source(chosen, {}).options.protocol == mode
    for bad in ("2019-01-01", "modern", "", 2025):
        with pytest.raises(ConfigError, match=r"serve\.upstreams\.up\.protocol"):
            parse_serve_section(upstream(protocol=bad))


class Cycle:
    def __init__(self) -> None:
        self.me = self


def test_settle_heap_collects_then_freezes() -> None:
    gc.unfreeze()
    try:
        garbage = Cycle()
        dead = weakref.ref(garbage)
        kept = Cycle()
        del garbage
        settle_heap()
        # the cycle that was garbage was collected, not frozen for the rest of the run
        assert dead() is None
        # what is alive was moved out of the collector's reach
        assert gc.get_freeze_count() > 0
        assert not any(obj is kept for obj in gc.get_objects())
    finally:
        gc.unfreeze()
