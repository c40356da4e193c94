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
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import anyio
import httpx2
import mcp.types as types
import pytest
from mcp import Client, ClientSession, StdioServerParameters
from mcp.client.session import ClientRequestContext
from mcp.client.stdio import stdio_client

import node_packages
from helpers import http_session, wait_until
from toolrelay import Dispatcher, ToolRegistry
from toolrelay.sources.mcp import McpSource, McpSourceOptions
from toolrelay.sources.relay import CALL_CHANNEL, LOG_LEVEL_META, Relay

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]

SERVER = Path(__file__).parent / "servers" / "mcp_relay_server.py"
MCP_URL = re.compile(r"MCP on (http://[0-9.:]+/mcp)")


class Gateway:
    """``toolrelay serve`` (HTTP) in front of the relay server over stdio (tools ``up__…``)
    and over HTTP (``web__…``, another record), and their records."""

    def __init__(self, tmp: Path, web: str) -> None:
        self.record = tmp / "upstream.rec"
        self.errlog = tmp / "serve.err"
        upstream = [sys.executable, str(SERVER), "--record", str(self.record)]
        relay = f"""
[serve.upstreams.relay]
command = {json.dumps(upstream)}
breaker_key = "relay"
prefix = "up"
risk_override = "read"  # toolrelay's risk: approval needs none; the hints stay the server's
"""
        self.stdio_config = tmp / "stdio.toml"  # the stdio gateway: the stdio upstream only
        self.stdio_config.write_text('[serve]\ntransport = "stdio"\n' + relay)
        self.config = tmp / "toolrelay.toml"
        self.config.write_text(
            f"""
[serve]
transport = "http"
[serve.http]
port = 0
{relay}
[serve.upstreams.web]
url = "{web}"
breaker_key = "web"
protocol = "legacy"  # the 2025 handshake: its tools ask the client mid-call
prefix = "web"
risk_override = "read"
[serve.upstreams.modern]  # the same server as the gateway connects by default: 2026-era
url = "{web}"
breaker_key = "modern"
prefix = "new"
risk_override = "read"
"""
        )
        self.command = [sys.executable, "-m", "toolrelay", "serve", "--config", str(self.config)]
        self.url = ""

    def events(self, kind: str) -> list[dict[str, Any]]:
        if not self.record.exists():
            return []
        lines = self.record.read_text().splitlines()
        return [e for e in map(json.loads, lines) if e["event"] == kind]

    def count(self, kind: str, tool: str) -> int:
        return len([e for e in self.events(kind) if e["tool"] == tool])

    def stdio(self) -> list[str]:
        """The command of a stdio gateway in front of the stdio upstream."""
        return [sys.executable, "-m", "toolrelay", "serve", "--config", str(self.stdio_config)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("relay")
    port = free_port()
    web = [sys.executable, str(SERVER), "--record", str(tmp / "web.rec"), "--http", str(port)]
    gw = Gateway(tmp, f"http://127.0.0.1:{port}/mcp")
    with gw.errlog.open("a") as err:
        upstream = subprocess.Popen(web, stdin=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + 30
        while not listening(port):
            assert upstream.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
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
        upstream.terminate()
        upstream.wait(15)
    assert "Traceback" not in gw.errlog.read_text()


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
        with anyio.fail_after(60):
            proc = await anyio.run_process(command, cwd=work, check=False)
    assert proc.returncode == 0, proc.stderr.decode()
    answers = json.loads(proc.stdout)["calls"]
    assert [a["result"]["content"][0]["text"] for a in answers] == ["plain works", "reader works"]
    await anyio.sleep(0.3)  # the gateway notices a disconnect after the answer
    assert "disconnected MCP client" not in gateway.errlog.read_text()


class Client2025:
    """The callbacks of a capable client: it samples, elicits, has roots and reads logs."""

    def __init__(self, *, hang: bool = False) -> None:
        self.logs: list[tuple[str, Any]] = []
        self.hang = hang
        self.sampling_asked = anyio.Event()
        self.sampling_cancelled = anyio.Event()

    async def sampling(
        self, context: ClientRequestContext, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult:
        self.sampling_asked.set()
        if self.hang:
            try:
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                self.sampling_cancelled.set()
                raise
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="4"), model="m"
        )

    async def elicitation(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult:
        assert isinstance(params, types.ElicitRequestFormParams)
        assert params.requested_schema["properties"]["color"]["default"] == "red"
        return types.ElicitResult(action="accept", content={"color": "blue"})

    async def roots(self, context: ClientRequestContext) -> types.ListRootsResult:
        return types.ListRootsResult(roots=[types.Root(uri="file:///work/x")])

    async def logging(self, params: types.LoggingMessageNotificationParams) -> None:
        self.logs.append((params.level, params.data))

    def callbacks(self) -> dict[str, Any]:
        return {
            "sampling_callback": self.sampling,
            "elicitation_callback": self.elicitation,
            "list_roots_callback": self.roots,
            "logging_callback": self.logging,
        }


def texts(result: types.CallToolResult) -> str:
    return " ".join(b.text for b in result.content if isinstance(b, types.TextContent))


@pytest.mark.filterwarnings("ignore:The logging capability is deprecated")  # 2025-era clients
async def test_a_capable_client_is_reached_during_its_call(gateway: Gateway) -> None:
    client = Client2025()
    reports: list[tuple[float, float | None, str | None]] = []

    async def progress(progress: float, total: float | None, message: str | None) -> None:
        reports.append((progress, total, message))

    async with http_session(gateway.url, **client.callbacks()) as session:
        await session.set_logging_level("info")
        assert texts(await session.call_tool("up__log", {})) == "logged"
        done = await session.call_tool("up__progress", {}, progress_callback=progress)
        sampled = await session.call_tool("up__sample", {})
        elicited = await session.call_tool("up__elicit", {})
        roots = await session.call_tool("up__roots", {})
        await session.call_tool("up__plain", {}, meta={"example.com/trace": "t-1"})
        pinged = await session.call_tool("up__ping", {})
        await session.send_ping()
    assert [e["level"] for e in gateway.events("set_level")][:1] == ["info"]
    assert client.logs == [("info", "hello from upstream")]  # debug: below the asked level
    assert texts(done) == "done (True)"
    assert reports == [(1, 3, "step 1"), (2, 3, "step 2"), (3, 3, "step 3")]
    assert texts(sampled) == "sampled: 4"
    assert texts(elicited) == "accept: {'color': 'blue'}"
    assert texts(roots) == "file:///work/x"
    assert texts(pinged) == "pong"
    metas = {e["tool"]: e["meta"] for e in gateway.events("call")}
    # the call's _meta passes on (with the level this client asked for, as 2026-era opt-in)
    assert metas["plain"] == {"example.com/trace": "t-1", LOG_LEVEL_META: "info"}
    assert isinstance(metas["progress"].pop("progress_token"), int)  # the gateway's own


async def test_a_client_that_cannot_be_asked_fails_the_upstream_at_once(
    gateway: Gateway,
) -> None:
    logs: list[Any] = []
    reports: list[float] = []

    async def logging(params: types.LoggingMessageNotificationParams) -> None:
        logs.append(params.data)

    async def progress(progress: float, total: float | None, message: str | None) -> None:
        reports.append(progress)

    async with http_session(gateway.url, logging_callback=logging) as session:  # no capability
        started = time.monotonic()
        sampled = await session.call_tool("up__sample", {})
        elicited = await session.call_tool("up__elicit", {})
        roots = await session.call_tool("up__roots", {})
        took = time.monotonic() - started
        # the gateway's fast lane serves this client: it carries logs and progress too
        await session.call_tool("up__log", {})
        await session.call_tool("up__progress", {}, progress_callback=progress)
    assert took < 3
    for result, method in [
        (sampled, "sampling/createMessage"),
        (elicited, "elicitation/create"),
        (roots, "roots/list"),
    ]:
        assert result.is_error
        assert f"refused {types.METHOD_NOT_FOUND}: {method}" in texts(result)
    assert "hello from upstream" in logs
    assert reports == [1, 2, 3]


async def test_a_log_sent_just_before_the_answer_reaches_the_client(gateway: Gateway) -> None:
    """A log line sent just before the answer reaches the call's client (its channel is not
    closed first): over HTTP, and over stdio where the raw lane answers beside the SDK."""
    capable, plain = Client2025(), Client2025()
    async with (
        http_session(gateway.url, **capable.callbacks()) as session,  # the SDK's path
        http_session(gateway.url, logging_callback=plain.logging) as light,  # the fast lane
    ):
        for tool in ["up__log", "web__log"] * 5:  # over stdio (the raw lane) and HTTP
            await session.call_tool(tool, {})
            await light.call_tool(tool, {})
    both = [("info", "hello from upstream"), ("debug", "a detail")]
    assert capable.logs == both * 10
    assert plain.logs == both * 10


@pytest.mark.filterwarnings("ignore:The logging capability is deprecated")  # 2025-era clients
async def test_a_2026_upstream_asks_the_client_with_input_required(gateway: Gateway) -> None:
    """By default the gateway speaks the 2026 era to an HTTP upstream that offers it: such
    an upstream asks mid-call with an ``InputRequiredResult``; its requests reach the
    calling (2025-era) client, and the call is made again with the answers."""
    client = Client2025()
    async with http_session(gateway.url, **client.callbacks()) as session:
        asked = await session.call_tool("new__ask_2026", {})
        # asking the 2025 way has no back-channel on a 2026-era connection (docs/serve.md)
        old_way = await session.call_tool("new__sample", {})
    assert texts(asked) == "sampled: 4; accept: {'color': 'blue'}", texts(asked)
    assert old_way.is_error and "no back-channel" in texts(old_way)


async def test_cancellation_reaches_the_upstream_and_back(gateway: Gateway) -> None:
    client = Client2025(hang=True)
    async with http_session(gateway.url, **client.callbacks()) as session:
        for tool in ("hang", "sample"):
            with anyio.move_on_after(10) as waiting:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(session.call_tool, f"up__{tool}", {})
                    await wait_until(
                        lambda t=tool: t in [e["tool"] for e in gateway.events("call")]
                    )
                    if tool == "sample":  # cancel the call once the client is being asked
                        await client.sampling_asked.wait()
                    tg.cancel_scope.cancel()
            assert not waiting.cancelled_caught
        # the upstream's sampling request was cancelled in turn, and so was the client's
        with anyio.fail_after(5):
            await client.sampling_cancelled.wait()
            await wait_until(lambda: len(gateway.events("cancelled")) == 2)
    assert sorted(e["tool"] for e in gateway.events("cancelled")) == ["hang", "sample"]


async def test_a_2026_client_gets_progress_and_its_logs_and_is_asked_in_rounds(
    gateway: Gateway,
) -> None:
    """Its calls run in InputRequiredResult rounds (tests/test_gateway_ask.py): progress and
    logs still reach it, and what an upstream asks at once is asked in one round."""
    client = Client2025()
    reports: list[float] = []

    async def progress(progress: float, total: float | None, message: str | None) -> None:
        reports.append(progress)

    async with Client(gateway.url, log_level="debug", **client.callbacks()) as modern:
        assert modern.protocol_version == "2026-07-28"
        await modern.call_tool("up__log", {})
        await modern.call_tool("up__progress", {}, progress_callback=progress)
        sampled = await modern.call_tool("up__sample", {})
        first = await modern.session.call_tool("new__ask_2026", {}, allow_input_required=True)
    assert ("info", "hello from upstream") in client.logs
    assert reports == [1, 2, 3]
    assert texts(sampled) == "sampled: 4"
    assert isinstance(first, types.InputRequiredResult) and first.input_requests is not None
    assert sorted(r.method for r in first.input_requests.values()) == [
        "elicitation/create",
        "sampling/createMessage",
    ]


async def test_a_stdio_client_is_reached_during_its_call(gateway: Gateway) -> None:
    client = Client2025()
    command = gateway.stdio()
    params = StdioServerParameters(command=command[0], args=command[1:], env=dict(os.environ))
    with (gateway.errlog.parent / "stdio.err").open("a") as err:
        async with (
            stdio_client(params, errlog=err) as (read, write),
            ClientSession(read, write, **client.callbacks()) as session,
        ):
            await session.initialize()
            sampled = await session.call_tool("up__sample", {})
            elicited = await session.call_tool("up__elicit", {})
    assert texts(sampled) == "sampled: 4"
    assert texts(elicited) == "accept: {'color': 'blue'}"


async def test_each_client_is_asked_about_its_own_call(gateway: Gateway) -> None:
    """Two clients' calls wait on the HTTP upstream at once: each sampling request, and
    each log line, reaches the client whose call it is."""
    asked: list[str] = []
    both = anyio.Event()
    logs: dict[str, list[Any]] = {"a": [], "b": []}

    def client(name: str) -> dict[str, Any]:
        async def sampling(
            context: ClientRequestContext, params: types.CreateMessageRequestParams
        ) -> types.CreateMessageResult:
            asked.append(name)
            if len(asked) == 2:
                both.set()
            with anyio.fail_after(10):
                await both.wait()
            content = types.TextContent(type="text", text=name)
            return types.CreateMessageResult(role="assistant", content=content, model="m")

        async def logging(params: types.LoggingMessageNotificationParams) -> None:
            logs[name].append(params.data)

        return {"sampling_callback": sampling, "logging_callback": logging}

    answers: dict[str, str] = {}

    async def call(name: str, tool: str) -> None:
        async with http_session(gateway.url, **client(name)) as session:
            answers[f"{name} {tool}"] = texts(await session.call_tool(tool, {}))

    async with anyio.create_task_group() as tg:
        tg.start_soon(call, "a", "web__sample")
        tg.start_soon(call, "b", "web__sample")
    await call("a", "web__log")
    assert answers == {
        "a web__sample": "sampled: a",
        "b web__sample": "sampled: b",
        "a web__log": "logged",
    }
    assert "hello from upstream" in logs["a"] and logs["b"] == []


class Asked:
    """A call's channel that records what it was asked (and accepts)."""

    def __init__(self) -> None:
        self.meta: dict[str, Any] = {}
        self.asked: list[str] = []

    async def progress(self, progress: float, total: float | None, message: str | None) -> None:
        pass

    async def log(self, params: types.LoggingMessageNotificationParams) -> None:
        pass

    async def ask(self, request: types.ServerRequest, result_type: type[Any]) -> Any:
        self.asked.append(request.method)
        return types.ElicitResult(action="accept", content={})


async def test_a_call_that_asked_its_client_is_not_retried(tmp_path: Path) -> None:
    """An idempotent tool whose upstream reports an outage is retried, unless the attempt
    asked the client something: a retry would ask again."""
    record = tmp_path / "upstream.rec"
    command = [sys.executable, str(SERVER), "--record", str(record)]
    options = McpSourceOptions(breaker_key="relay", count_errors=True)
    async with McpSource.stdio(command, options, errlog=sys.stderr) as source:
        registry = ToolRegistry()
        registry.register(source)
        dispatcher = Dispatcher(registry)
        channel = Asked()
        token = CALL_CHANNEL.set(channel)
        try:
            result = await dispatcher.dispatch("elicit_then_fail", {})
        finally:
            CALL_CHANNEL.reset(token)
        retried = await dispatcher.dispatch("elicit_then_fail", {})  # no client: no asking
    assert not result.ok and not result.retryable and result.message == "service unavailable"
    assert channel.asked == ["elicitation/create"]
    calls = [e for e in map(json.loads, record.read_text().splitlines()) if e["event"] == "call"]
    assert len(calls) == 1 + 3  # once with a client to ask; three attempts without one
    assert not retried.ok


async def test_a_plain_answer_on_the_raw_lane_waits_no_loop_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stdio reader lets the session's handlers run before a raw-lane answer only when
    the session took a message since the last answer (a log line): a plain call's answer
    is handed over at once, without an extra pass of the event loop (issue 30 item 4)."""
    from toolrelay.sources import stdio

    turns: list[str] = []
    checkpoint = anyio.lowlevel.checkpoint

    async def counted() -> None:
        turns.append(sys._getframe(1).f_code.co_name)
        await checkpoint()

    monkeypatch.setattr(stdio.anyio.lowlevel, "checkpoint", counted)
    command = [sys.executable, str(SERVER), "--record", str(tmp_path / "upstream.rec")]
    options = McpSourceOptions(breaker_key="relay", risk_override="read")
    async with McpSource.stdio(command, options, errlog=sys.stderr) as source:
        registry = ToolRegistry()
        registry.register(source)
        dispatcher = Dispatcher(registry)
        channel = Asked()
        token = CALL_CHANNEL.set(channel)
        try:
            await dispatcher.dispatch("plain", {})  # after the session's own (the listing)
            turns.clear()
            plain = [await dispatcher.dispatch("plain", {}) for _ in range(3)]
            plain_turns, turns[:] = list(turns), []
            logged = await dispatcher.dispatch("log", {})
        finally:
            CALL_CHANNEL.reset(token)
    assert all(result.ok for result in plain) and logged.ok
    assert plain_turns == []
    assert turns[:1] == ["deliver"]  # the log lines went to the session first: one turn


async def test_a_hedged_call_asks_its_client_once() -> None:
    relay = Relay("up")
    channel = Asked()
    context = cast("ClientRequestContext", None)  # the relay does not read it
    params = types.ElicitRequestFormParams(message="?", requested_schema={"type": "object"})
    with relay.attempt(channel) as first:  # type: ignore[arg-type]
        with relay.attempt(channel):  # type: ignore[arg-type]
            refused = await relay.elicitation(context, params)
        answered = await relay.elicitation(context, params)
    assert isinstance(refused, types.ErrorData) and "asked once" in refused.message
    assert isinstance(answered, types.ElicitResult) and first.asked
    assert channel.asked == ["elicitation/create"]
    # no call waiting: an error for the upstream, and no roots
    assert isinstance(await relay.elicitation(context, params), types.ErrorData)
    assert await relay.roots(context) == types.ListRootsResult(roots=[])


async def test_a_client_gone_mid_call_has_the_call_cancelled(gateway: Gateway) -> None:
    """The other side of the closed-stream rule: a POST whose answer was not sent whole is
    abandoned, and its call cancelled up to the upstream (served by the SDK: the client
    declared ``elicitation``)."""
    headers = {"Accept": "application/json, text/event-stream"}
    hello = {
        "protocolVersion": "2025-11-25",
        "capabilities": {"elicitation": {}},
        "clientInfo": {"name": "raw", "version": "1"},
    }
    async with httpx2.AsyncClient(timeout=10) as http:
        opened = await http.post(
            gateway.url,
            json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello},
            headers=headers,
        )
        headers["mcp-session-id"] = opened.headers["mcp-session-id"]
        headers["mcp-protocol-version"] = "2025-11-25"
        done = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        await http.post(gateway.url, json=done, headers=headers)
        calls, cancels = gateway.count("call", "hang"), gateway.count("cancelled", "hang")
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call"}
        call["params"] = {"name": "up__hang", "arguments": {}}
        async with http.stream("POST", gateway.url, json=call, headers=headers):
            await wait_until(lambda: gateway.count("call", "hang") > calls)  # then go away
    await wait_until(lambda: gateway.count("cancelled", "hang") > cancels)
    assert "cancelled 1 call(s) of a disconnected MCP client" in gateway.errlog.read_text()
