"""``toolrelay serve`` passes an upstream MCP server's successful results on unchanged.

The upstream is ``servers/mcp_test_server.py --content``: tools answering text beside
``structuredContent``, an image, audio, a resource link, embedded resources (text and blob)
and several blocks at once. Each is called once on the upstream directly and once through
``toolrelay serve`` (over stdio and streamable HTTP, with the upstream over stdio or HTTP),
both with the MCP SDK's client, and the two answers must be the same. Failures keep the
answer envelope; the output cap and the output schema still apply; a host on the Python
API reads the documented data.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from helpers import http_session
from toolrelay import Dispatcher, DispatcherOptions, ToolRegistry
from toolrelay.sources.mcp import McpSource, McpSourceOptions

pytestmark = pytest.mark.anyio

SERVER = Path(__file__).parent / "servers" / "mcp_test_server.py"
CONTENT_TOOLS = ["text_and_structured", "image", "audio", "resource_link", "embedded", "mixed"]
ENV = {**os.environ, "TOOLRELAY_ADMIN_TOKEN": "admin-token-for-the-tests-0123456789"}
MCP_URL = re.compile(r"MCP on (http://[0-9.:]+/mcp)")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for(path: Path, pattern: re.Pattern[str], proc: subprocess.Popen[bytes]) -> str:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = pattern.search(path.read_text() if path.exists() else "")
        if found:
            return found.group(1)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise AssertionError(f"not announced:\n{path.read_text()}")


def wait_for_port(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError("the upstream did not start")


def start(command: list[str], errlog: Path) -> subprocess.Popen[bytes]:
    with errlog.open("a") as err:
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, stderr=err, env=ENV)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:  # pragma: no cover - a hung process
        proc.kill()
        proc.wait(5)


def sent(result: types.CallToolResult) -> dict[str, Any]:
    """What a client received, as it went over the wire."""
    wire: dict[str, Any] = result.model_dump(mode="json", by_alias=True, exclude_none=True)
    wire.pop("_meta", None)
    return wire


@asynccontextmanager
async def stdio_session(command: list[str], errlog: Path) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(command=command[0], args=command[1:], env=ENV)
    with errlog.open("a") as err:
        async with (
            stdio_client(params, errlog=err) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session


class Setup:
    """An upstream (``--content``) and a ``toolrelay serve`` in front of it."""

    def __init__(self, tmp: Path, upstream: str, gateway: str, dispatcher: str = "") -> None:
        self.tmp = tmp
        self.gateway = gateway
        self.upstream_command = [sys.executable, str(SERVER), "--record", str(tmp / "rec")]
        self.upstream_command.append("--content")
        self.procs: list[subprocess.Popen[bytes]] = []
        if upstream == "http":
            port = free_port()
            log = (tmp / "upstream.log").open("a")
            proc = subprocess.Popen([*self.upstream_command, "--http", str(port)], stderr=log)
            self.procs.append(proc)
            wait_for_port(port, proc)
            where = f'url = "http://127.0.0.1:{port}/mcp"'
        else:
            where = f"command = {json.dumps(self.upstream_command)}"
        self.config = tmp / "toolrelay.toml"
        self.config.write_text(
            f"""
[dispatcher]
{dispatcher}
[serve]
transport = "{gateway}"
[serve.admin]
port = 0
[serve.http]
port = 0
[serve.upstreams.test]
{where}
breaker_key = "mcp-test"
prefix = "up"
"""
        )
        self.upstream = upstream

    def close(self) -> None:
        for proc in self.procs:
            stop(proc)
        log = self.tmp / "serve.err"
        assert "Traceback" not in (log.read_text() if log.exists() else "")

    @asynccontextmanager
    async def through(self) -> AsyncIterator[ClientSession]:
        serve = [sys.executable, "-m", "toolrelay", "serve", "--config", str(self.config)]
        errlog = self.tmp / "serve.err"
        if self.gateway == "stdio":
            async with stdio_session(serve, errlog) as session:
                yield session
            return
        proc = start(serve, errlog)
        try:
            url = await anyio.to_thread.run_sync(wait_for, errlog, MCP_URL, proc)
            async with http_session(url) as session:
                yield session
        finally:
            stop(proc)


ROUTES = [("stdio", "stdio"), ("stdio", "http"), ("http", "http")]
# The two gateway tests below run on asyncio only: the gateway and the upstreams are
# processes of their own (on asyncio whatever the test's backend), and what runs in the
# test's event loop is the MCP SDK's client, none of our code. The in-process McpSource
# (test_python_hosts_read_the_documented_data) stays on both backends.
GATEWAY_PROCESS = pytest.mark.parametrize("anyio_backend", ["asyncio"])


@pytest.fixture(scope="module")
def direct(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """What the upstream answers a client of its own (the same program, the same answers),
    per tool the route tests call: asked once per module."""
    tmp = tmp_path_factory.mktemp("direct")
    command = [sys.executable, str(SERVER), "--record", str(tmp / "rec"), "--content"]

    async def ask() -> dict[str, dict[str, Any]]:
        async with stdio_session(command, tmp / "direct.err") as direct:
            answers = {name: sent(await direct.call_tool(name, {})) for name in CONTENT_TOOLS}
            answers["texts"] = sent(await direct.call_tool("texts", {}))
            answers["structured"] = sent(await direct.call_tool("structured", {"n": 3}))
        return answers

    return anyio.run(ask)


@GATEWAY_PROCESS
@pytest.mark.parametrize(("upstream", "gateway"), ROUTES)
async def test_successes_reach_the_client_as_the_upstream_sent_them(
    tmp_path: Path, upstream: str, gateway: str, direct: dict[str, dict[str, Any]]
) -> None:
    setup = Setup(tmp_path, upstream, gateway)
    expected = direct
    try:
        async with setup.through() as gateway_session:
            listed = {tool.name for tool in (await gateway_session.list_tools()).tools}
            assert {f"up__{name}" for name in CONTENT_TOOLS} <= listed
            got = {
                name: sent(await gateway_session.call_tool(f"up__{name}", {}))
                for name in [*CONTENT_TOOLS, "texts"]
            }
            got["structured"] = sent(await gateway_session.call_tool("up__structured", {"n": 3}))
    finally:
        setup.close()
    for name, answer in expected.items():
        assert answer.get("isError") is not True, (name, answer)
        assert got[name] == answer, name
    # the cases of the issue, spelled out
    assert got["text_and_structured"]["content"] == [{"type": "text", "text": "hello"}]
    assert got["text_and_structured"]["structuredContent"] == {"result": "hello"}
    assert got["structured"]["content"] == [{"type": "text", "text": "3 doubled is 6"}]
    assert [block["type"] for block in got["mixed"]["content"]] == [
        "text",
        "image",
        "resource_link",
        "text",
    ]
    assert got["mixed"]["content"][0]["_meta"] == {"chart": 1}
    assert got["texts"]["content"][0]["annotations"] == {"priority": 1.0}


@GATEWAY_PROCESS
async def test_failures_the_cap_and_oversized_blocks_keep_todays_answers(tmp_path: Path) -> None:
    setup = Setup(tmp_path, "stdio", "stdio", dispatcher="max_output_bytes = 400")
    try:
        async with setup.through() as session:
            # an upstream isError: the envelope as JSON text, isError, as before
            failed = await session.call_tool("up__fail", {})
            assert failed.is_error is True
            assert isinstance(failed.content[0], types.TextContent)
            envelope = json.loads(failed.content[0].text)
            assert envelope["ok"] is False and envelope["error_type"] == "tool_error"
            assert envelope["message"].startswith("the widget is broken")
            # an image over the output cap is refused, not passed on
            big = await session.call_tool("up__image", {})
            assert big.is_error is True and isinstance(big.content[0], types.TextContent)
            refused = json.loads(big.content[0].text)
            assert refused["error_type"] == "invalid_output" and "cap" in refused["message"]
            # a text far larger than the structured content beside it: not carried past
            # the cap, the answer is built from the data as for any tool
            padded = await session.call_tool("up__padded", {})
            assert padded.is_error is False and padded.structured_content == {"n": 1}
            assert sent(padded)["content"] == [{"type": "text", "text": '{"n":1}'}]
            # the output schema is still checked: structured content that breaks it is an
            # invalid_output failure, with no structuredContent
            broken = await session.call_tool("up__redos", {})
            assert broken.is_error is True and broken.structured_content is None
            assert isinstance(broken.content[0], types.TextContent)
            assert json.loads(broken.content[0].text)["error_type"] == "invalid_output"
            # small answers still pass unchanged under the low cap
            small = await session.call_tool("up__text_and_structured", {})
            assert [b.model_dump(exclude_none=True) for b in small.content] == [
                {"type": "text", "text": "hello"}
            ]
    finally:
        setup.close()


async def test_python_hosts_read_the_documented_data(tmp_path: Path) -> None:
    command = [sys.executable, str(SERVER), "--record", str(tmp_path / "rec"), "--content"]
    async with McpSource.stdio(command, McpSourceOptions(breaker_key="t")) as source:
        registry = ToolRegistry()
        registry.register(source)
        dispatcher = Dispatcher(registry, DispatcherOptions(telemetry=False))

        async def data(name: str) -> Any:
            result = await dispatcher.dispatch(name, "{}")
            assert result.ok, result.to_model()
            return json.loads(json.dumps(result.to_model()))["data"]

        assert await data("text_and_structured") == {"result": "hello"}
        assert await data("texts") == ["one", "two"]
        assert await data("mixed") == {"charts": 1, "links": ["file:///srv/report.txt"]}
        image = await data("image")
        assert [block["type"] for block in image] == ["image"]
        assert image[0]["mimeType"] == "image/png" and image[0]["annotations"]["priority"] == 0.7
        link = await data("resource_link")
        assert link[0]["uri"] == "file:///srv/report.txt" and link[0]["size"] == 1234
        embedded = await data("embedded")
        assert [block["resource"]["uri"] for block in embedded] == [
            "file:///srv/notes.md",
            "file:///srv/logo.png",
        ]
