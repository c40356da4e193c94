"""What flows during a call through ``toolrelay serve``, and what it says about tools.

``toolrelay serve`` runs as its own process in front of ``servers/mcp_relay_server.py``; real
MCP SDK clients (with sampling, elicitation, roots and logging callbacks, or without them)
call it over streamable HTTP and stdio, in both protocol eras. The upstream's record file
says what reached it: its calls and their ``_meta``, ``logging/setLevel``, cancellations,
and the errors it got back when the client could not be asked.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp.types as types
import pytest
from mcp import Client, ClientSession, StdioServerParameters
from mcp.client.session import ClientRequestContext
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

import node_packages

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]

SERVER = Path(__file__).parent / "servers" / "mcp_relay_server.py"
MCP_URL = re.compile(r"MCP on (http://[0-9.:]+/mcp)")


class Gateway:
    """``toolrelay serve`` (HTTP) in front of the relay server (stdio), and its record."""

    def __init__(self, tmp: Path) -> None:
        self.record = tmp / "upstream.rec"
        self.errlog = tmp / "serve.err"
        upstream = [sys.executable, str(SERVER), "--record", str(self.record)]
        self.config = tmp / "toolrelay.toml"
        self.config.write_text(
            f"""
[serve]
transport = "http"
[serve.http]
port = 0
[serve.upstreams.relay]
command = {json.dumps(upstream)}
breaker_key = "relay"
prefix = "up"
risk_override = "read"  # toolrelay's risk: approval needs none; the hints stay the server's
"""
        )
        self.command = [sys.executable, "-m", "toolrelay", "serve", "--config", str(self.config)]
        self.url = ""

    def events(self, kind: str) -> list[dict[str, Any]]:
        if not self.record.exists():
            return []
        lines = self.record.read_text().splitlines()
        return [e for e in map(json.loads, lines) if e["event"] == kind]

    def stdio(self) -> list[str]:
        """The command of a stdio gateway with the same configuration."""
        return [*self.command, "--transport", "stdio"]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gw = Gateway(tmp_path_factory.mktemp("relay"))
    with gw.errlog.open("a") as err:
        proc = subprocess.Popen(gw.command, stdin=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 30
        while not (found := MCP_URL.search(gw.errlog.read_text())):
            assert proc.poll() is None and time.monotonic() < deadline, gw.errlog.read_text()
            time.sleep(0.05)
        gw.url = found.group(1)
        yield gw
    finally:
        proc.terminate()
        proc.wait(15)
    assert "Traceback" not in gw.errlog.read_text()


@asynccontextmanager
async def http_session(url: str, **callbacks: Any) -> AsyncIterator[ClientSession]:
    async with (
        httpx2.AsyncClient(timeout=httpx2.Timeout(30.0, read=60.0)) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write, **callbacks) as session,
    ):
        await session.initialize()
        yield session


def listed(tools: list[types.Tool]) -> dict[str, dict[str, Any]]:
    return {t.name: t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools}


async def test_tools_are_described_as_the_upstream_stated(gateway: Gateway) -> None:
    async with http_session(gateway.url) as session:
        tools = listed((await session.list_tools()).tools)
        annotated = await session.call_tool("up__annotated_text", {})
        init = session.initialize_result
    # no annotations upstream: none here (the spec's defaults: may be destructive)
    assert "annotations" not in tools["up__plain"]
    # read-only, no idempotency claimed: none gained
    assert tools["up__reader"]["annotations"] == {"readOnlyHint": True}
    titled = tools["up__titled"]
    assert titled["title"] == "A titled tool"
    assert titled["annotations"] == {"title": "Annotated title", "openWorldHint": False}
    assert titled["execution"] == {"taskSupport": "forbidden"}
    [block] = annotated.content
    assert block.model_dump(mode="json", exclude_none=True) == {
        "type": "text",
        "text": "for you",
        "annotations": {"audience": ["user"]},
    }
    assert init is not None and init.instructions is not None
    assert "Relay upstream: call log before progress." in init.instructions


@pytest.mark.servers
async def test_a_client_closing_an_answered_stream_cancels_nothing(gateway: Gateway) -> None:
    """The TypeScript SDK closes each response stream once it has the answer: nothing was in
    flight, so nothing is cancelled (and no such line is logged)."""
    packages = node_packages.installed()
    calls = json.dumps([["up__plain", {}], ["up__reader", {}]])
    command = [packages.node, "mcp_call.mjs", "--sdk", "v1", "--calls", calls, "--url", gateway.url]
    with tempfile.TemporaryDirectory() as work:
        (Path(work) / "node_modules").symlink_to(packages.modules, target_is_directory=True)
        shutil.copy2(node_packages.NODE_SOURCES / "mcp_call.mjs", work)
        proc = subprocess.run(command, cwd=work, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    answers = json.loads(proc.stdout)["calls"]
    assert [a["result"]["content"][0]["text"] for a in answers] == ["plain works", "reader works"]
    time.sleep(0.3)  # the gateway notices a disconnect after the answer
    assert "disconnected MCP client" not in gateway.errlog.read_text()
