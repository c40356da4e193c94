"""``toolrelay serve`` as an MCP server, through the MCP SDK's own client.

Every test runs ``python -m toolrelay serve`` as a separate process and talks to it with
the SDK's ``ClientSession`` (2025 handshake era) or ``Client`` (2026 era), over stdio and
over streamable HTTP (on asyncio: see ``anyio_backend`` below). The tools are the
first-party weather and web-search plugins against the stand-in upstream; faults and
breakers are set through the server's admin API, as an operator would.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import mcp.types as types
import pytest
from mcp import Client, ClientSession, StdioServerParameters
from mcp.client.session import IncomingMessage
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from toolrelay.chaos.upstream import StandInUpstream

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "admin-token-for-the-tests-0123456789"
SUPPORT_TOKEN = "support-token-abcdefghijklmnop"
OPS_TOKEN = "ops-token-qrstuvwxyz-0123456789"
WEATHER = {"weather_current", "weather_forecast"}
URL_LINE = re.compile(r"(admin API on|MCP on) (http://[0-9.:]+(?:/mcp)?)")


def config_text(upstream_url: str, *, transport: str, extra: str = "") -> str:
    return f"""
[plugins.weather]
base_url = "{upstream_url}"
geocoding_url = "{upstream_url}"
[plugins.websearch]
base_url = "{upstream_url}"
[tools.weather_current]
timeout_s = 1.0
[tools.weather_forecast]
timeout_s = 30.0
[keys.open-meteo.breaker]
fail_max = 2
reset_timeout_s = 60
[profiles.support]
allow = ["weather_current", "weather_forecast"]
[profiles.all]
require_approval = []
[serve]
transport = "{transport}"
watch_interval_s = 0.2
[serve.admin]
port = 0
[serve.http]
port = 0
{extra}
"""


def names(listing: types.ListToolsResult) -> set[str]:
    return {tool.name for tool in listing.tools}


# -- servers -------------------------------------------------------------------------------
# Asyncio only: every scenario here is ``toolrelay serve`` in a process of its own (which
# runs on asyncio whatever the test's backend); all that runs in the test's event loop is the
# MCP SDK's client and httpx, none of our code. Our in-process MCP code (McpSource and its
# raw lane) is tested on both backends in test_mcp_source.py, test_mcp_raw_lane.py and
# test_hostile_upstreams.py.
@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def upstream() -> Iterator[StandInUpstream]:
    with StandInUpstream().run_in_thread() as up:
        yield up


def wait_for_urls(errlog: Path, proc: subprocess.Popen[bytes] | None = None) -> dict[str, str]:
    """The admin and MCP URLs a server announces on stderr."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        text = errlog.read_text() if errlog.exists() else ""
        found = dict(URL_LINE.findall(text))
        if "admin API on" in found and ("MCP on" in found or "MCP over stdio" in text):
            return {"admin": found["admin API on"], "mcp": found.get("MCP on", "")}
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.05)
    raise AssertionError(f"the server did not announce itself:\n{errlog.read_text()}")


@dataclass
class Admin:
    """The admin API of one running server."""

    url: str

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        async with httpx.AsyncClient(timeout=10) as http:
            response = await http.request(
                method,
                self.url + path,
                headers={"Authorization": f"Bearer {TOKEN}"},
                content=None if body is None else json.dumps(body),
            )
        assert response.status_code < 300, response.text
        return response.text if path == "/metrics" else response.json()

    async def reset(self) -> None:
        await self.call("DELETE", "/faults")
        for key in ("open-meteo", "searxng"):
            await self.call("POST", f"/breakers/{key}/reset")

    async def metric(self, name: str, **labels: str) -> float:
        """The sum of the samples of ``name`` in ``/metrics`` that carry ``labels``."""
        text = await self.call("GET", "/metrics")
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total


@dataclass
class HttpServer:
    proc: subprocess.Popen[bytes]
    admin: Admin
    mcp_url: str
    errlog: Path


def start_http_server(
    tmp: Path, upstream_url: str, extra: str = "", serve_extra: str = ""
) -> HttpServer:
    """``extra`` goes at the end of the file, ``serve_extra`` into ``[serve]``."""
    return wait_for_http_server(*launch_http_server(tmp, upstream_url, extra, serve_extra))


def launch_http_server(
    tmp: Path, upstream_url: str, extra: str = "", serve_extra: str = "", admin_port: int = 0
) -> tuple[subprocess.Popen[bytes], Path]:
    """``start_http_server`` without waiting for it: its process and its stderr's file
    (``admin_port``: the admin API's, chosen up front)."""
    config = tmp / "toolrelay.toml"
    text = config_text(upstream_url, transport="http", extra=extra)
    if admin_port:
        admin = "[serve.admin]\nport = 0\n"
        assert admin in text
        text = text.replace(admin, f"[serve.admin]\nport = {admin_port}\n")
    config.write_text(text.replace("[serve]\n", "[serve]\n" + serve_extra, 1))
    errlog = tmp / "serve.err"
    env = {**os.environ, "TOOLRELAY_ADMIN_TOKEN": TOKEN}
    env.update(SUPPORT_TOKEN=SUPPORT_TOKEN, OPS_TOKEN=OPS_TOKEN)
    with errlog.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "toolrelay", "serve", "--config", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
        )
    return proc, errlog


def wait_for_http_server(proc: subprocess.Popen[bytes], errlog: Path) -> HttpServer:
    """A launched server, once it has announced its URLs."""
    try:
        urls = wait_for_urls(errlog, proc)
    except BaseException:
        proc.kill()
        proc.wait(10)
        raise
    return HttpServer(proc, Admin(urls["admin"]), urls["mcp"], errlog)


def stop_http_server(server: HttpServer) -> None:
    server.proc.send_signal(signal.SIGTERM)
    try:
        code = server.proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        raise
    assert code == 0, server.errlog.read_text()
    assert "Traceback" not in server.errlog.read_text()


@pytest.fixture(scope="module")
def http_servers(
    upstream: StandInUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, HttpServer]]:
    """The module's two HTTP servers, without and with client tokens (``CLIENTS``): two
    independent processes, started side by side."""
    launched = [
        launch_http_server(tmp_path_factory.mktemp("http"), upstream.url),
        launch_http_server(tmp_path_factory.mktemp("tokens"), upstream.url, CLIENTS),
    ]
    servers: list[HttpServer] = []
    try:
        for proc, errlog in launched:
            servers.append(wait_for_http_server(proc, errlog))
        plain, tokens = servers
        yield {"plain": plain, "tokens": tokens}
    finally:
        for proc, _ in launched[len(servers) :]:
            proc.kill()
            proc.wait(10)
        for server in servers:
            stop_http_server(server)


@pytest.fixture(scope="module")
def http_server(http_servers: dict[str, HttpServer]) -> HttpServer:
    return http_servers["plain"]


class Notifications:
    """What the server sends unasked; ``changed`` is set on a tool-list change."""

    def __init__(self) -> None:
        self.seen: list[IncomingMessage] = []
        self.changed = anyio.Event()

    async def __call__(self, message: IncomingMessage) -> None:
        self.seen.append(message)
        if isinstance(message, types.ToolListChangedNotification):
            self.changed.set()

    def rearm(self) -> None:
        self.changed = anyio.Event()


@asynccontextmanager
async def stdio_session(
    config: Path, tmp_path: Path, *args: str
) -> AsyncIterator[tuple[ClientSession, Admin, Notifications]]:
    """A session with a ``toolrelay serve`` the SDK's stdio client spawns."""
    errlog = tmp_path / "serve.err"
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "toolrelay", "serve", "--config", str(config), *args],
        env={"TOOLRELAY_ADMIN_TOKEN": TOKEN},
    )
    notes = Notifications()
    with errlog.open("w") as err:
        async with (
            stdio_client(params, errlog=err) as (read, write),
            ClientSession(read, write, message_handler=notes) as session,
        ):
            await session.initialize()
            urls = await anyio.to_thread.run_sync(wait_for_urls, errlog)
            yield session, Admin(urls["admin"]), notes
    assert "Traceback" not in errlog.read_text()


@asynccontextmanager
async def http_session(
    url: str, token: str | None = None
) -> AsyncIterator[tuple[ClientSession, Notifications]]:
    """A 2025-era session over streamable HTTP (with a bearer token when given)."""
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    notes = Notifications()
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=300.0)) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write, message_handler=notes) as session,
    ):
        await session.initialize()
        yield session, notes


# -- the scenario ----------------------------------------------------------------------------
async def check_session(session: ClientSession, admin: Admin, notes: Notifications) -> None:
    """List, call, fail validation, time out, cancel, and watch a breaker open and close."""
    await admin.reset()
    init = session.initialize_result
    assert init is not None and init.capabilities.tools is not None
    assert init.capabilities.tools.list_changed is True
    assert {"weather_current", "weather_forecast", "web_search"} <= names(
        await session.list_tools()
    )

    # a successful call: data as structured content and as JSON text
    ok = await session.call_tool("weather_current", {"city": "Oslo"})
    assert ok.is_error is False, ok
    assert isinstance(ok.structured_content, dict)
    assert "temperature_c" in json.dumps(ok.structured_content)
    assert isinstance(ok.content[0], types.TextContent)
    assert json.loads(ok.content[0].text) == ok.structured_content

    # a validation error: isError, the envelope as structured content and as text
    bad = await session.call_tool("weather_current", {"city": 7})
    assert bad.is_error is True
    envelope = bad.structured_content
    assert envelope is not None and envelope["ok"] is False
    assert envelope["error_type"] == "validation_error" and envelope["retryable"] is False
    assert isinstance(bad.content[0], types.TextContent)
    assert json.loads(bad.content[0].text) == envelope

    # a timeout is an answer, at the tool's deadline (1 s)
    await admin.call("PUT", "/faults", {"kind": "hang", "tool": "weather_current"})
    started = time.monotonic()
    slow = await session.call_tool("weather_current", {"city": "Oslo"})
    elapsed = time.monotonic() - started
    assert slow.is_error and slow.structured_content is not None
    assert slow.structured_content["error_type"] == "timeout"
    assert slow.structured_content["retryable"] is True
    assert 0.9 <= elapsed < 3.0

    # a client cancellation cancels the dispatch (the tool's deadline is 30 s)
    await admin.call("PUT", "/faults", {"kind": "hang", "tool": "weather_forecast"})
    tool = {"tool": "weather_forecast"}
    cancelled = await admin.metric("toolrelay_mcp_tool_calls_total", outcome="cancelled", **tool)
    answered = await admin.metric("toolrelay_tool_calls_total", **tool)
    started = time.monotonic()
    with anyio.move_on_after(0.5) as scope:
        await session.call_tool("weather_forecast", {"city": "Oslo"})
    assert scope.cancelled_caught
    with anyio.fail_after(5):
        while (  # noqa: ASYNC110 - polling another process
            await admin.metric("toolrelay_mcp_tool_calls_total", outcome="cancelled", **tool)
            == cancelled
        ):
            await anyio.sleep(0.05)
    now = await admin.metric("toolrelay_mcp_tool_calls_total", outcome="cancelled", **tool)
    assert now == cancelled + 1
    assert await admin.metric("toolrelay_tool_calls_total", **tool) == answered  # no answer
    assert await admin.metric("toolrelay_tool_inflight", **tool) == 0
    assert time.monotonic() - started < 5

    # failures open the breaker: the client is told, and the weather tools disappear
    await admin.call("DELETE", "/faults")
    fault = {"kind": "error", "breaker_key": "open-meteo", "retryable": True, "message": "down"}
    await admin.call("PUT", "/faults", fault)
    failed = await session.call_tool("weather_current", {"city": "Oslo"})
    assert failed.is_error and failed.structured_content is not None
    assert failed.structured_content["message"] == "down"
    with anyio.fail_after(5):
        await notes.changed.wait()
    listed = names(await session.list_tools())
    assert not WEATHER & listed and "web_search" in listed
    fenced = await session.call_tool("weather_current", {"city": "Oslo"})
    assert fenced.structured_content is not None
    assert fenced.structured_content["error_type"] == "circuit_open"
    assert fenced.structured_content["retry_after_s"] > 0

    # and come back when the operator resets it
    notes.rearm()
    await admin.call("DELETE", "/faults")
    await admin.call("POST", "/breakers/open-meteo/reset")
    with anyio.fail_after(5):
        await notes.changed.wait()
    assert names(await session.list_tools()) >= WEATHER


@pytest.mark.anyio
async def test_stdio_session(upstream: StandInUpstream, tmp_path: Path) -> None:
    config = tmp_path / "toolrelay.toml"
    config.write_text(config_text(upstream.url, transport="stdio"))
    async with stdio_session(config, tmp_path) as (session, admin, notes):
        await check_session(session, admin, notes)


@pytest.mark.anyio
async def test_http_session(http_server: HttpServer) -> None:
    async with http_session(http_server.mcp_url) as (session, notes):
        await check_session(session, http_server.admin, notes)


@pytest.mark.anyio
async def test_http_2026_client_listens_for_list_changes(http_server: HttpServer) -> None:
    admin = http_server.admin
    await admin.reset()
    async with Client(http_server.mcp_url, cache=None) as client:
        assert client.protocol_version == "2026-07-28"
        assert names(await client.list_tools()) >= WEATHER
        ok = await client.call_tool("weather_current", {"city": "Oslo"})
        assert ok.is_error is False and isinstance(ok.structured_content, dict)
        # 2026-era cancellation over HTTP is an aborted POST: it cancels the dispatch too
        await admin.call("PUT", "/faults", {"kind": "hang", "tool": "weather_forecast"})
        labels = {"tool": "weather_forecast", "outcome": "cancelled"}
        cancelled = await admin.metric("toolrelay_mcp_tool_calls_total", **labels)
        with anyio.move_on_after(0.5):
            await client.call_tool("weather_forecast", {"city": "Oslo"})
        with anyio.fail_after(5):
            while await admin.metric("toolrelay_mcp_tool_calls_total", **labels) == cancelled:  # noqa: ASYNC110
                await anyio.sleep(0.05)
        await admin.call("DELETE", "/faults")
        async with client.listen(tools_list_changed=True) as subscription:
            await admin.call("POST", "/breakers/open-meteo/open")
            with anyio.fail_after(5):
                async for _event in subscription:
                    break
        assert not WEATHER & names(await client.list_tools())
        fenced = await client.call_tool("weather_forecast", {"city": "Oslo"})
        assert fenced.is_error and fenced.structured_content is not None
        assert fenced.structured_content["error_type"] == "circuit_open"
    await admin.reset()


CLIENTS = """
[serve.http.clients.support]
token_env = "SUPPORT_TOKEN"
profile = "support"
tenant = "acme"
[serve.http.clients.ops]
token_env = "OPS_TOKEN"
profile = "all"
"""


@pytest.fixture(scope="module")
def token_server(http_servers: dict[str, HttpServer]) -> HttpServer:
    return http_servers["tokens"]


@pytest.mark.anyio
async def test_http_bearer_tokens_choose_the_profile(token_server: HttpServer) -> None:
    url = token_server.mcp_url
    async with httpx.AsyncClient() as http:
        assert (await http.post(url, json={})).status_code == 401
        wrong = await http.post(url, json={}, headers={"Authorization": "Bearer not-a-token"})
        assert wrong.status_code == 401
    async with http_session(url, SUPPORT_TOKEN) as (session, _):
        assert names(await session.list_tools()) == WEATHER
        denied = await session.call_tool("web_search", {"query": "toolrelay"})
        assert denied.structured_content is not None
        assert denied.structured_content["error_type"] == "tool_policy"
    async with http_session(url, OPS_TOKEN) as (session, _):
        assert "web_search" in names(await session.list_tools())


@pytest.mark.anyio
async def test_upstream_mcp_server_behind_the_gateway(
    upstream: StandInUpstream, tmp_path: Path
) -> None:
    record = tmp_path / "calls.jsonl"
    command = [sys.executable, str(ROOT / "tests" / "servers" / "mcp_test_server.py")]
    extra = f"""
[serve.upstreams.test]
command = {json.dumps([*command, "--record", str(record)])}
breaker_key = "mcp-test"
prefix = "up"
timeout_s = 5
"""
    config = tmp_path / "toolrelay.toml"
    config.write_text(config_text(upstream.url, transport="stdio", extra=extra))
    async with stdio_session(config, tmp_path, "--profile", "all") as (session, admin, notes):
        listed = names(await session.list_tools())
        assert {"up__structured", "up__add_tool", "weather_current"} <= listed
        doubled = await session.call_tool("up__structured", {"n": 3})
        assert doubled.is_error is False and doubled.structured_content == {"n": 3, "doubled": 6}
        # a failure of a tool with an outputSchema: the envelope as text only, never as
        # structuredContent (strict clients would check it against the schema and throw)
        refused = await session.call_tool("up__structured", {"n": "three"})
        assert refused.is_error is True and refused.structured_content is None
        assert isinstance(refused.content[0], types.TextContent)
        envelope = json.loads(refused.content[0].text)
        assert envelope["error_type"] == "validation_error" and envelope["retryable"] is False
        # the upstream changes its tools: the gateway's clients hear of it
        added = await session.call_tool("up__add_tool", {"name": "late"})
        assert added.is_error is False, added
        with anyio.fail_after(5):
            await notes.changed.wait()
        assert "up__late" in names(await session.list_tools())
        breakers = await admin.call("GET", "/breakers")
        assert breakers["breakers"]["mcp-test"]["state"] == "closed"
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    assert [c["tool"] for c in calls if c["event"] == "call"] == ["structured", "add_tool"]


# -- starting up: one clear line for every mistake ------------------------------------------
@pytest.mark.parametrize(
    ("extra", "args", "needle"),
    [
        ("", ["--admin-port", "0"], "needs a bearer token: set the environment variable"),
        ("", ["--transport", "http", "--host", "192.0.2.1"], "not a loopback address"),
        ("", ["--admin-host", "0.0.0.0", "--admin-port", "0"], "pass --allow-remote"),
        ("", ["--profile", "nope"], "serve.profile: no profile named 'nope'"),
        ("[serve]\nport = 1\n", [], "serve: Additional properties are not allowed ('port'"),
        ('[serve.upstreams.x]\nbreaker_key = "x"\n', [], "serve.upstreams.x:"),
        ('[serve.upstreams.x]\nbreaker_key = "x"\ncommand = ["x"]\nmax_message_bytes = 10\n',
         [], "serve.upstreams.x.max_message_bytes: must be ≥ 1024"),
        ('[serve.http.clients.a]\ntoken_env = "NO_SUCH_TOKEN_VAR"\n', ["--transport", "http"],
         "MCP client 'a' needs a bearer token"),
        ("", ["--port", "70000"], "--port must be between 0 and 65535"),
    ],
)  # fmt: skip
def test_startup_errors_are_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    extra: str,
    args: list[str],
    needle: str,
) -> None:
    from toolrelay.cli import main

    config = tmp_path / "toolrelay.toml"
    config.write_text(
        '[plugins.weather]\n[profiles.support]\nallow = ["weather_current"]\n' + extra
    )
    monkeypatch.setenv("TOOLRELAY_ADMIN_TOKEN", "")
    monkeypatch.delenv("NO_SUCH_TOKEN_VAR", raising=False)
    assert main(["serve", "--config", str(config), *args]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], err


def test_telemetry_metrics_port_serves_the_registry() -> None:
    import socket
    import urllib.request

    from prometheus_client import CollectorRegistry, Counter

    from toolrelay.serve.auth import ServeError
    from toolrelay.serve.observability import metrics_endpoint, tracer_provider

    registry = CollectorRegistry()
    Counter("probe", "A probe.", registry=registry).inc()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = metrics_endpoint({"metrics_port": port}, registry, allow_remote=False)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            assert b"probe_total 1.0" in response.read()
    finally:
        server.shutdown()
    assert metrics_endpoint({"metrics_port": 0}, registry, allow_remote=False) is None
    with pytest.raises(ServeError, match="pass --allow-remote"):
        metrics_endpoint({"metrics_port": port, "metrics_host": "0.0.0.0"}, registry, False)
    assert tracer_provider({"otlp_endpoint": ""}) is None
    provider = tracer_provider({"otlp_endpoint": "http://127.0.0.1:9/v1/traces"})
    assert provider is not None
    provider.shutdown()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the server runs uvicorn: asyncio only
async def test_closed_sessions_are_forgotten(upstream: StandInUpstream, tmp_path: Path) -> None:
    """The Service in-process: a 2025-era HTTP session is remembered for list_changed while
    open and forgotten when the client ends it."""
    import io

    from toolrelay.serve import Service, load

    path = tmp_path / "toolrelay.toml"
    no_admin = config_text(upstream.url, transport="http").replace("[serve.admin]\nport = 0", "")
    path.write_text(no_admin)
    config, settings = load(path)
    out = io.StringIO()
    service = Service(config, settings, environ={}, out=out, handle_signals=False)
    async with anyio.create_task_group() as tg:
        tg.start_soon(service.run)
        with anyio.fail_after(10):
            while "MCP on" not in out.getvalue():  # noqa: ASYNC110
                await anyio.sleep(0.02)
        url = URL_LINE.findall(out.getvalue())[0][1]
        async with http_session(url):
            with anyio.fail_after(5):
                while service.watcher.peers() != 1:  # noqa: ASYNC110
                    await anyio.sleep(0.02)
        with anyio.fail_after(5):
            while service.watcher.peers():  # noqa: ASYNC110
                await anyio.sleep(0.02)
        service.stop()
