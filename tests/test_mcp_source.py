"""MCP servers as a plugin source, through the whole dispatch pipeline, with real servers.

The servers are the third-party ``mcp-server-time`` (stdio) and ``servers/mcp_test_server.py``
(stdio, and streamable HTTP on 127.0.0.1), which records every call and cancellation it
sees, so the tests can prove what reached it. Nothing is mocked.

Each start of a server costs about a second of CPU (the SDK's imports), so the tests that
leave an HTTP server as they found it share one per module (``http_server``): each reads
only what was recorded since it began (a worker runs one test at a time), and a tool one
adds is named for that test. A test that stops, crashes or restarts its server has its own.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

import anyio
import anyio.to_thread
import pytest

from helpers import wait_until
from toolrelay import (
    BreakerOptions,
    Dispatcher,
    DispatcherOptions,
    ErrorType,
    KeyPolicy,
    Profile,
    RetryOptions,
    ToolCall,
    ToolRegistry,
)

pytest.importorskip("mcp", reason="needs the MCP SDK: pip install 'toolrelay[mcp]'")
from toolrelay.contract import AuthContext, ToolError
from toolrelay.sources.mcp import McpConnectError, McpSource, McpSourceOptions, object_schema

pytestmark = pytest.mark.anyio

TEST_SERVER = Path(__file__).parent / "servers" / "mcp_test_server.py"
HAND_WRITTEN = Path(__file__).parent / "servers" / "hand_written_server.py"
OPEN = {"open": Profile(require_approval=())}  # tools without hints are "write" tools
NO_RETRY = KeyPolicy(retry=RetryOptions(max_attempts=1))
# The era each mode pins with an SDK 2.x server (``auto``: tests of its own below).
ERAS = {"2026-07-28": "2026-07-28", "legacy": "2025-11-25"}
# Upstream, not ours: closing a 2025-era streamable-HTTP session under trio leaves the SDK's
# standalone GET SSE stream's httpx2/httpcore2 async generators to the garbage collector, and
# trio's finalizer then warns (seen only with ResourceWarning enabled, e.g. python -X dev).
LEGACY_HTTP_CLOSE = pytest.mark.filterwarnings("ignore:Async generator 'http:ResourceWarning")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, process: subprocess.Popen[bytes], limit_s: float = 15.0) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the test MCP server exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise TimeoutError(f"the test MCP server did not listen on port {port}")


def alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie (Linux /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


class TestServer:
    """``servers/mcp_test_server.py`` over stdio or HTTP, and what it recorded."""

    __test__ = False

    def __init__(self, kind: str, tmp: Path) -> None:
        self.kind = kind
        self.record = tmp / "record.jsonl"
        self.record.touch()
        self.log: TextIO = (tmp / "server.log").open("a")
        self.port = free_port() if kind == "http" else 0
        self.process: subprocess.Popen[bytes] | None = None
        self.flags: list[str] = []
        self.shared = False
        self.since = 0  # the record's bytes before this (test's) view

    @property
    def command(self) -> list[str]:
        return [sys.executable, str(TEST_SERVER), "--record", str(self.record), *self.flags]

    def start(self) -> None:
        self.launch()
        self.wait()

    def launch(self) -> None:
        """Start the HTTP server's process, without waiting for it to listen."""
        assert self.kind == "http"
        self.process = subprocess.Popen(
            [*self.command, "--http", str(self.port)], stdout=self.log, stderr=self.log
        )

    def wait(self) -> None:
        assert self.process is not None
        wait_for_port(self.port, self.process)

    def view(self) -> TestServer:
        """This (module's) server for one test: its record read from here on."""
        view = copy.copy(self)
        view.shared, view.since = True, self.record.stat().st_size
        return view

    def stop(self) -> None:
        assert not self.shared, "a test that stops its server needs one of its own"
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        if self.process is not None:
            self.process.wait(10)
        self.process = None

    def source(self, headers: dict[str, str] | None = None, **options: Any) -> McpSource:
        options.setdefault("breaker_key", "test")
        if self.kind == "stdio":
            return McpSource.stdio(self.command, McpSourceOptions(**options), errlog=self.log)
        url = f"http://127.0.0.1:{self.port}/mcp"
        return McpSource.http(url, McpSourceOptions(**options), headers=headers)

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        lines = self.record.read_bytes()[self.since :].decode().splitlines()
        events = [json.loads(line) for line in lines if line.strip()]
        return [e for e in events if kind is None or e["event"] == kind]

    def calls(self, tool: str) -> list[dict[str, Any]]:
        return [e for e in self.events("call") if e["tool"] == tool]


@pytest.fixture(scope="module")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestServer]:
    """The module's HTTP server, for the tests that leave it as they found it."""
    srv = TestServer("http", tmp_path_factory.mktemp("http-server"))
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()
        srv.log.close()


@pytest.fixture
def shared_http(http_server: TestServer) -> TestServer:
    return http_server.view()


@pytest.fixture(params=["stdio", "http"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TestServer]:
    """A fresh server over stdio, or the module's HTTP server."""
    if request.param == "http":
        yield request.getfixturevalue("shared_http")
        return
    srv = TestServer("stdio", tmp_path)
    yield srv
    srv.log.close()


@pytest.fixture(params=["stdio", "http"])
def own_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TestServer]:
    """A server of this test's own, over stdio or HTTP (a test that stops it)."""
    srv = TestServer(str(request.param), tmp_path)
    if srv.kind == "http":
        srv.start()
    try:
        yield srv
    finally:
        srv.stop()
        srv.log.close()


@pytest.fixture(params=["stdio", "http"])
def servers(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, TestServer]]:
    """A server per protocol mode (``ERAS``), for the tests that run every mode at once:
    over stdio a process each, with its own record; over HTTP the module's server, one
    session per mode (their calls told apart by their arguments)."""
    if request.param == "http":
        shared: TestServer = request.getfixturevalue("shared_http")
        yield dict.fromkeys(ERAS, shared)
        return
    made = {}
    for protocol in ERAS:
        (tmp_path / protocol).mkdir()
        made[protocol] = TestServer("stdio", tmp_path / protocol)
    yield made
    for srv in made.values():
        srv.log.close()


@pytest.fixture
def own_http_servers(tmp_path: Path) -> Iterator[dict[str, TestServer]]:
    """An HTTP server of this test's own per protocol mode, started side by side."""
    made = {}
    for protocol in ERAS:
        (tmp_path / protocol).mkdir()
        made[protocol] = TestServer("http", tmp_path / protocol)
    try:
        for srv in made.values():
            srv.launch()
        for srv in made.values():
            srv.wait()
        yield made
    finally:
        for srv in made.values():
            srv.stop()
            srv.log.close()


async def each_protocol(
    servers: dict[str, TestServer], case: Callable[[TestServer, str], Coroutine[Any, Any, None]]
) -> None:
    """``case(server, protocol)`` for every protocol mode at once."""
    async with anyio.create_task_group() as tg:
        for protocol, server in servers.items():
            tg.start_soon(case, server, protocol)


@pytest.fixture
def stdio_server(tmp_path: Path) -> Iterator[TestServer]:
    srv = TestServer("stdio", tmp_path)
    yield srv
    srv.log.close()


def flaky_command(server: TestServer, down: Path) -> list[str]:
    """The test server over stdio, exiting at once while ``down`` exists."""
    script = (
        "import os, runpy, sys\n"
        f"if os.path.exists({str(down)!r}): sys.exit(1)\n"
        f"sys.argv = [{str(TEST_SERVER)!r}, '--record', {str(server.record)!r}]\n"
        f"runpy.run_path({str(TEST_SERVER)!r}, run_name='__main__')\n"
    )
    return [sys.executable, "-c", script]


def state(source: McpSource) -> str:
    return source.connection_state  # a call: mypy does not narrow it from one read to the next


def tool_names(dispatcher: Dispatcher, profile: str | None = None) -> set[str]:
    return {spec["name"] for spec in dispatcher.specs(profile, format="mcp")}


# -- the real mcp-server-time ------------------------------------------------------------------
def time_server_command() -> list[str]:
    pytest.importorskip("mcp_server_time", reason="pip install mcp-server-time")
    script = Path(sys.executable).parent / "mcp-server-time"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "mcp_server_time"]
    return [*command, "--local-timezone", "UTC"]


async def test_mcp_server_time_through_the_pipeline() -> None:
    async with McpSource.stdio(
        time_server_command(), McpSourceOptions(breaker_key="mcp-time")
    ) as source:
        registry = ToolRegistry()
        registry.register(source)
        dispatcher = Dispatcher(registry)
        assert {d.name for d in source.describe()} == {"get_current_time", "convert_time"}
        decl = source.declaration("get_current_time")
        assert decl is not None
        assert (decl.risk, decl.is_idempotent, decl.breaker_key) == ("read", True, "mcp-time")
        assert decl.parameters["type"] == "object" and decl.parameters["required"] == ["timezone"]
        assert decl.output_schema is not None and "mcp" in decl.tags
        assert tool_names(dispatcher) == {"get_current_time", "convert_time"}

        result = await dispatcher.dispatch("get_current_time", {"timezone": "Europe/Oslo"})
        assert result.ok, result.to_model()
        assert result.data["timezone"] == "Europe/Oslo"  # structuredContent, not the JSON text
        assert datetime.fromisoformat(result.data["datetime"]).tzinfo is not None
        assert result.breaker_key == "mcp-time"

        for bad in ({"timezone": 5}, {}, {"timezone": ["Europe/Oslo"]}):
            refused = await dispatcher.dispatch("get_current_time", bad)
            assert refused.error_type is ErrorType.VALIDATION_ERROR, bad

        unknown_zone = await dispatcher.dispatch("get_current_time", {"timezone": "Mars/Base"})
        assert unknown_zone.error_type is ErrorType.TOOL_ERROR  # the server's isError answer
        assert "Invalid timezone" in unknown_zone.message and not unknown_zone.retryable


# -- calls and answers ---------------------------------------------------------------------------
async def test_results_errors_and_validation(server: TestServer) -> None:
    headers = {"headers": {"X-Test": "sent"}} if server.kind == "http" else {}
    async with server.source(**headers) as source:
        registry = ToolRegistry()
        registry.register(source)
        dispatcher = Dispatcher(registry)

        structured = await dispatcher.dispatch("structured", {"n": 21})
        assert structured.to_model() == {"ok": True, "data": {"n": 21, "doubled": 42}}
        assert (await dispatcher.dispatch("text", {"message": "hi"})).data == "echo: hi"
        assert (await dispatcher.dispatch("multi", "{}")).data == ["one", "two"]

        failed = await dispatcher.dispatch("fail", "{}")
        assert failed.error_type is ErrorType.TOOL_ERROR and not failed.retryable
        assert failed.message.startswith("the widget is broken: xxx")
        assert len(failed.message) <= 200
        assert dispatcher.breakers.snapshot()["test"]["failures"] == 0  # an answer, not an outage

        for bad in ({"message": 5}, {"message": "x" * 51}, {}, {"message": "hi", "more": 1}):
            refused = await dispatcher.dispatch("text", bad)
            assert refused.error_type is ErrorType.VALIDATION_ERROR, bad
        # Structural proof: the server saw exactly the one valid call of "text".
        assert [call["arguments"] for call in server.calls("text")] == [{"message": "hi"}]
        expected_header = "sent" if server.kind == "http" else None
        assert {call["x_test"] for call in server.events("call")} == {expected_header}


async def test_tool_mapping_names_risks_and_skips(
    stdio_server: TestServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="toolrelay.sources.mcp")
    async with stdio_server.source(
        prefix="t", timeout_s=7, tool_timeouts={"hang": 0.5}, tags={"lab"}
    ) as source:
        registry = ToolRegistry()
        registry.register(source)  # odd tools are skipped, never refused as a whole
        decls = {d.name: d for d in source.describe()}
        assert set(decls) == {
            "t__structured",
            "t__text",
            "t__multi",
            "t__fail",
            "t__hang",
            "t__big",
            "t__pid",
            "t__add_tool",
            "t__crash",
            "t__redos",
            "t__dotted_name",
            "t__wipe",
            "t__careful",
        }
        risks = {name: (d.risk, d.is_idempotent) for name, d in decls.items()}
        assert risks["t__structured"] == ("read", True)
        assert risks["t__add_tool"] == ("write", False)  # no hints at all: write
        assert risks["t__wipe"] == ("dangerous", False)
        assert risks["t__careful"] == ("write", True)
        assert decls["t__wipe"].description == "Wipe everything"  # the annotation title
        assert {d.breaker_key for d in decls.values()} == {"test"}
        assert {d.tags for d in decls.values()} == {frozenset({"mcp", "lab"})}
        assert decls["t__hang"].timeout_s == 0.5 and decls["t__text"].timeout_s == 7
        assert source.declaration("t__pid") is decls["t__pid"]
        assert source.declaration("pid") is None
        await source.refresh()
        assert source.declaration("t__pid") is decls["t__pid"]  # unchanged: the same object

        skipped = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
        for reason in ("'who'", "identity", "'bad_schema'", "not a valid JSON Schema", "n" * 60):
            assert reason in skipped

        dispatcher = Dispatcher(registry, DispatcherOptions(profiles=OPEN))
        dotted = await dispatcher.dispatch("t__dotted_name", "{}", profile="open")
        assert dotted.data == "dotted.name works"
        assert stdio_server.calls("dotted.name")  # the server's own name went over the wire
        needs = await dispatcher.dispatch("t__wipe", "{}")
        assert needs.error_type is ErrorType.NEEDS_APPROVAL  # destructive → dangerous


def test_object_schema_normalisation() -> None:
    assert object_schema({}) == {"type": "object"}
    assert object_schema({"properties": {"a": {}}}) == {"properties": {"a": {}}, "type": "object"}
    assert object_schema({"type": "object", "required": []}) == {"type": "object", "required": []}
    assert object_schema({"type": "string"}) is None
    assert object_schema({"type": ["object", "null"]}) is None


# -- protocol="auto": which era -----------------------------------------------------------------
@LEGACY_HTTP_CLOSE
async def test_auto_offers_the_handshake_over_stdio_and_2026_over_http(server: TestServer) -> None:
    async with server.source() as source:
        assert source.options.protocol == "auto"
        era = "2025-11-25" if server.kind == "stdio" else "2026-07-28"
        assert source.protocol_version == era
        registry = ToolRegistry()
        registry.register(source)
        answer = await Dispatcher(registry).dispatch("structured", {"n": 2})
        assert answer.data == {"n": 2, "doubled": 4}, answer.to_model()
        assert [call["protocol"] for call in server.calls("structured")] == [era]
        assert source.connects == 1 and source.connection_failures == 0
    if server.kind == "stdio":
        assert len(server.events("started")) == 1  # one process: no second try


async def test_auto_over_stdio_speaks_2026_to_a_server_that_refuses_the_handshake(
    stdio_server: TestServer, caplog: pytest.LogCaptureFixture
) -> None:
    stdio_server.flags = ["--modern-only"]
    with caplog.at_level(logging.INFO, logger="toolrelay.sources.mcp"):
        async with stdio_server.source(backoff_initial_s=0.05) as source:
            assert source.protocol_version == "2026-07-28"
            registry = ToolRegistry()
            registry.register(source)
            dispatcher = Dispatcher(registry, DispatcherOptions(profiles=OPEN))
            answer = await dispatcher.dispatch("structured", {"n": 3})
            assert answer.data == {"n": 3, "doubled": 6}, answer.to_model()
            assert source.connects == 1 and source.connection_failures == 0
            # a reconnect goes straight to the 2026-era protocol: no handshake offered again
            crashed = await dispatcher.dispatch("crash", "{}", profile="open")
            assert crashed.error_type is ErrorType.TOOL_ERROR
            await anyio.sleep(0.1)
            again = await dispatcher.dispatch("structured", {"n": 4})
            assert again.data == {"n": 4, "doubled": 8}, again.to_model()
            assert source.connects == 2 and source.protocol_version == "2026-07-28"
    assert len(stdio_server.events("handshake_refused")) == 1
    assert len(stdio_server.events("started")) == 3  # refused, then connected, then after the crash
    assert {call["protocol"] for call in stdio_server.calls("structured")} == {"2026-07-28"}
    logged = [record.getMessage() for record in caplog.records]
    refused = [line for line in logged if "refused the 2025 handshake" in line]
    assert len(refused) == 1 and "speaks only the 2026-era protocol" in refused[0], refused


async def test_legacy_is_not_retried_in_another_era(stdio_server: TestServer) -> None:
    stdio_server.flags = ["--modern-only"]
    with pytest.raises(McpConnectError, match="2026-era"):
        async with stdio_server.source(protocol="legacy"):
            pass  # pragma: no cover - the handshake is refused
    assert len(stdio_server.events("started")) == 1


# -- deadlines: cancelled on the server ---------------------------------------------------------
# Every protocol mode at once (independent: called side by side, each call tagged with its
# mode); the 2025-era HTTP close's upstream warning is ignored (see above).
@LEGACY_HTTP_CLOSE
async def test_deadline_cancels_the_call_on_the_server(servers: dict[str, TestServer]) -> None:
    def cancelled(server: TestServer) -> list[str]:
        return [e["tag"] for e in server.events("cancelled")]

    async def case(server: TestServer, protocol: str) -> None:
        late = f"late {protocol}"
        async with server.source(protocol=protocol, tool_timeouts={"hang": 0.4}) as source:
            assert source.protocol_version == ERAS[protocol]
            registry = ToolRegistry()
            registry.register(source)
            dispatcher = Dispatcher(registry, DispatcherOptions(default_key=NO_RETRY))
            started = anyio.current_time()
            result = await dispatcher.dispatch("hang", {"seconds": 30, "tag": late})
            assert result.error_type is ErrorType.TIMEOUT and result.retryable, protocol
            assert anyio.current_time() - started < 5, protocol
            await wait_until(lambda: late in cancelled(server))
            assert cancelled(server).count(late) == 1, protocol
            hung = [call for call in server.calls("hang") if call["arguments"]["tag"] == late]
            assert [call["protocol"] for call in hung] == [ERAS[protocol]]
            quick = await dispatcher.dispatch("hang", {"seconds": 0, "tag": f"quick {protocol}"})
            assert quick.data == "woke up", protocol  # the session is still fine

    await each_protocol(servers, case)
    for server in set(servers.values()):  # nothing else was cancelled: the late calls only
        mine = sorted(f"late {protocol}" for protocol, srv in servers.items() if srv is server)
        assert sorted(cancelled(server)) == mine


# -- tool list changes ---------------------------------------------------------------------------
@LEGACY_HTTP_CLOSE
async def test_list_changed_reaches_specs(servers: dict[str, TestServer]) -> None:
    async def case(server: TestServer, protocol: str) -> None:
        async with server.source(protocol=protocol, prefix="lab") as source:
            registry = ToolRegistry()
            registry.register(source)
            dispatcher = Dispatcher(registry, DispatcherOptions(profiles=OPEN))
            name = f"fresh_{uuid.uuid4().hex[:8]}"  # a server may be the module's: a new name
            assert f"lab__{name}" not in tool_names(dispatcher), protocol
            added = await dispatcher.dispatch("lab__add_tool", {"name": name}, profile="open")
            assert added.ok, (protocol, added.to_model())
            await wait_until(lambda: f"lab__{name}" in tool_names(dispatcher))
            fresh = await dispatcher.dispatch(f"lab__{name}", "{}", profile="open")
            assert fresh.data == f"{name} works", protocol

    await each_protocol(servers, case)


# -- a server that dies --------------------------------------------------------------------------
async def test_crash_is_an_answer_and_the_next_call_reconnects(own_server: TestServer) -> None:
    server = own_server
    async with server.source(backoff_initial_s=0.3) as source:
        registry = ToolRegistry()
        registry.register(source)
        dispatcher = Dispatcher(registry, DispatcherOptions(profiles=OPEN))
        before = (await dispatcher.dispatch("pid", "{}")).data["pid"]

        crashed = await dispatcher.dispatch("crash", "{}", profile="open")
        assert crashed.error_type is ErrorType.TOOL_ERROR and crashed.retryable
        assert crashed.message == "test server is not reachable"
        assert len(source.describe()) > 0  # the last listing stays on offer

        too_soon = await Dispatcher(registry, DispatcherOptions(default_key=NO_RETRY)).dispatch(
            "pid", "{}"
        )
        assert too_soon.error_type is ErrorType.TOOL_ERROR and too_soon.retryable
        assert too_soon.retry_after_s is not None and 0 < too_soon.retry_after_s <= 0.3

        if server.kind == "http":
            server.stop()
            await anyio.to_thread.run_sync(server.start)
        else:
            await anyio.sleep(0.3)
        after = await dispatcher.dispatch("pid", "{}")
        assert after.ok, after.to_model()
        assert after.data["pid"] != before and source.connects == 2


async def test_backoff_doubles_per_failed_reconnect_up_to_its_maximum(
    stdio_server: TestServer, tmp_path: Path
) -> None:
    """The wait before a reconnect doubles with every failed attempt in a row, up to
    ``backoff_max_s``, and starts again from ``backoff_initial_s`` after a success."""
    down = tmp_path / "down"  # while it exists, the server exits at once
    source = McpSource.stdio(
        flaky_command(stdio_server, down),
        McpSourceOptions(breaker_key="test", backoff_initial_s=0.2, backoff_max_s=0.5),
        errlog=stdio_server.log,
    )
    ctx = AuthContext()

    async def waits(tool: str) -> float:
        with pytest.raises(ToolError) as failed:
            await source.execute(tool, {}, ctx)
        assert failed.value.retryable and failed.value.retry_after_s is not None
        return failed.value.retry_after_s

    async with source:
        down.touch()
        schedule = [await waits("crash")]  # the connection is lost: one failure
        for _ in range(3):  # each reconnect fails at once: two, three, four failures
            await anyio.sleep(schedule[-1] + 0.05)
            schedule.append(await waits("text"))
        assert schedule == pytest.approx([0.2, 0.4, 0.5, 0.5], abs=0.05)
        down.unlink()
        await anyio.sleep(schedule[-1] + 0.05)
        assert await source.execute("text", {"message": "back"}, ctx) == "echo: back"
        assert source.connects == 2
        assert await waits("crash") == pytest.approx(0.2, abs=0.05)  # counted afresh


@LEGACY_HTTP_CLOSE
async def test_http_server_restart_is_noticed(own_http_servers: dict[str, TestServer]) -> None:
    async def case(srv: TestServer, protocol: str) -> None:
        async with srv.source(protocol=protocol, backoff_initial_s=0.1) as source:
            registry = ToolRegistry()
            registry.register(source)
            dispatcher = Dispatcher(registry, DispatcherOptions(default_key=NO_RETRY))
            before = (await dispatcher.dispatch("pid", "{}")).data["pid"]
            srv.stop()  # while idle: a 2025-era session is now unknown to the new process
            await anyio.to_thread.run_sync(srv.start)
            answers = []
            for _ in range(5):
                answers.append(await dispatcher.dispatch("pid", "{}"))
                if answers[-1].ok:
                    break
                await anyio.sleep(0.15)
            *failures, last = answers
            assert last.ok and last.data["pid"] != before, [a.to_model() for a in answers]
            for failure in failures:  # never "Session not found" as the tool's own answer
                assert failure.message == "test server is not reachable" and failure.retryable
            if protocol == "legacy":
                assert len(failures) == 1 and source.connects == 2

    await each_protocol(own_http_servers, case)


async def test_retry_waits_out_the_backoff_and_recovers(stdio_server: TestServer) -> None:
    async with stdio_server.source(backoff_initial_s=0.2) as source:
        registry = ToolRegistry()
        registry.register(source)
        dispatcher = Dispatcher(registry, DispatcherOptions(profiles=OPEN))
        await dispatcher.dispatch("crash", "{}", profile="open")
        # "pid" is idempotent: toolrelay's retry honours retry_after_s and the retry reconnects.
        result = await dispatcher.dispatch("pid", "{}")
        assert result.ok and result.attempts == 2, result.to_model()


async def test_unreachable_http_server_opens_the_breaker(tmp_path: Path) -> None:
    srv = TestServer("http", tmp_path)
    srv.start()
    breaker = KeyPolicy(
        breaker=BreakerOptions(fail_max=2, reset_timeout_s=0.5), retry=RetryOptions(max_attempts=1)
    )
    try:
        async with srv.source(backoff_initial_s=0.1) as source:
            registry = ToolRegistry()
            registry.register(source)
            dispatcher = Dispatcher(registry, DispatcherOptions(keys={"test": breaker}))
            srv.stop()
            first = await dispatcher.dispatch("pid", "{}")  # finds the connection gone
            assert first.error_type is ErrorType.TOOL_ERROR and first.retryable
            await anyio.sleep(0.15)
            second = await dispatcher.dispatch("pid", "{}")  # the reconnect fails
            assert second.error_type is ErrorType.TOOL_ERROR and "not reachable" in second.message
            third = await dispatcher.dispatch("pid", "{}")
            assert third.error_type is ErrorType.CIRCUIT_OPEN and third.retry_after_s is not None
            assert tool_names(dispatcher) == set()  # open breaker: hidden from the model

            await anyio.to_thread.run_sync(srv.start)
            await anyio.sleep(0.5)
            healed = await dispatcher.dispatch("pid", "{}")  # the half-open trial reconnects
            assert healed.ok, healed.to_model()
            assert dispatcher.breakers.state("test") == "closed" and source.connects == 2
    finally:
        srv.stop()
        srv.log.close()


# -- health: what the gateway's /readyz, metrics and pings read ------------------------------
async def test_connection_failures_are_counted_where_they_happen(
    stdio_server: TestServer, tmp_path: Path
) -> None:
    """A connection lost in a call, a reconnect that fails inside a call and one that fails
    inside a ping are each counted once, with when and why; a ping reconnects."""
    down = tmp_path / "down"  # while it exists, the server exits at once
    source = McpSource.stdio(
        flaky_command(stdio_server, down),
        McpSourceOptions(breaker_key="test", backoff_initial_s=0.1, backoff_max_s=0.4),
        errlog=stdio_server.log,
    )
    ctx = AuthContext()

    def backed_off() -> bool:  # the back-off (0.1, 0.2, 0.4 s) has passed
        return source.backoff.remaining() is None

    async with source:
        assert state(source) == "connected"
        assert (source.connection_failures, source.last_error) == (0, None)
        assert await source.ping(5) is True

        down.touch()
        started = time.time()
        with pytest.raises(ToolError, match="not reachable"):
            await source.execute("crash", {}, ctx)  # the connection is lost in this call
        assert state(source) == "down" and source.connection_failures == 1
        assert source.last_error is not None
        lost_at, reason = source.last_error
        assert started <= lost_at <= time.time() and reason

        await wait_until(backed_off)
        with pytest.raises(ToolError, match="not reachable"):
            await source.execute("text", {"message": "x"}, ctx)  # its reconnect fails
        assert state(source) == "down" and source.connection_failures == 2
        assert source.last_error is not None and source.last_error[0] >= lost_at

        await wait_until(backed_off)
        assert await source.ping(5) is False  # the ping's reconnect fails
        assert source.connection_failures == 3
        assert await source.ping(5) is False  # within the 0.4 s back-off: no attempt, no count
        assert source.connection_failures == 3

        down.unlink()
        await wait_until(backed_off)
        answered: list[bool] = []

        async def ping() -> None:
            answered.append(await source.ping(10))

        async with anyio.create_task_group() as tg:
            tg.start_soon(ping)  # reconnects: a new process
            await wait_until(lambda: state(source) != "down")
            assert state(source) == "reconnecting"
        assert answered == [True] and state(source) == "connected"
        assert source.connects == 2 and source.connection_failures == 3
    # closing is not a failure; a closed source answers no ping and connects no more
    assert state(source) == "down"
    assert await source.ping(1) is False and source.connection_failures == 3


async def test_idle_s_counts_from_the_last_answer(stdio_server: TestServer) -> None:
    # Its own server: on the module's HTTP one a late background answer (seen once under
    # load) moved the clock between the first two readings.
    async with stdio_server.source() as source:
        first = source.idle_s
        await anyio.sleep(0.05)
        idle = source.idle_s
        assert 0 <= first < idle
        await source.execute("text", {"message": "hi"}, AuthContext())
        assert source.idle_s < idle
        await anyio.sleep(0.05)
        idle = source.idle_s
        assert await source.ping(5) is True
        assert source.idle_s < idle
        await anyio.sleep(0.05)
        idle = source.idle_s
        with pytest.raises(ToolError):  # an isError answer is an answer too
            await source.execute("fail", {}, AuthContext())
        assert source.idle_s < idle


async def test_an_unanswered_ping_loses_the_connection(stdio_server: TestServer) -> None:
    """A server that holds its pipes and answers nothing: the ping times out, the connection
    is counted lost and its process stopped; the next ping starts a new one."""
    async with stdio_server.source(backoff_initial_s=0.1, close_timeout_s=0.5) as source:
        hung = (await source.execute("pid", {}, AuthContext()))["pid"]
        os.kill(hung, signal.SIGSTOP)
        try:
            assert await source.ping(0.3) is False
            assert state(source) == "down" and source.connection_failures == 1
            assert source.last_error is not None
            assert source.last_error[1] == "no answer to ping within 0.3 s"
            await wait_until(lambda: not alive(hung), limit_s=15)
        finally:
            if alive(hung):
                os.kill(hung, signal.SIGKILL)
        await anyio.sleep(0.15)
        assert await source.ping(10) is True
        assert source.connects == 2 and source.connection_failures == 1


async def test_concurrent_calls_share_one_reconnect(stdio_server: TestServer) -> None:
    async with stdio_server.source(backoff_initial_s=0.2, tool_timeouts={"pid": 0.05}) as source:
        registry = ToolRegistry()
        registry.register(source)
        dispatcher = Dispatcher(registry, DispatcherOptions(profiles=OPEN, default_key=NO_RETRY))
        slow = [ToolCall("hang", {"seconds": 0.3, "tag": str(n)}) for n in range(4)]
        started = anyio.current_time()
        answers = await dispatcher.dispatch_many(slow)
        assert [a.data for a in answers] == ["woke up"] * 4
        assert anyio.current_time() - started < 1.2  # multiplexed on one session

        await dispatcher.dispatch("crash", "{}", profile="open")
        await anyio.sleep(0.2)
        # Spawning takes longer than the 0.05 s deadline: the call times out, but the
        # connection it started completes in the background, owned by the source.
        assert (await dispatcher.dispatch("pid", "{}")).error_type is ErrorType.TIMEOUT
        await wait_until(lambda: source.connects == 2)
        answers = await dispatcher.dispatch_many([ToolCall("multi", "{}") for _ in range(4)])
        assert all(a.ok for a in answers) and source.connects == 2


async def test_non_conforming_listing_is_refused_by_the_sdk(tmp_path: Path) -> None:
    """The SDK 2.x validates tools/list against the protocol's schema (inputSchema needs
    ``"type": "object"``), so one such tool fails the whole listing and the connect."""
    srv = TestServer("stdio", tmp_path)
    try:
        source = McpSource.stdio(
            [sys.executable, str(HAND_WRITTEN), "--record", str(srv.record), "--raw"],
            McpSourceOptions(breaker_key="raw"),
            errlog=srv.log,
        )
        with pytest.raises(McpConnectError, match="ValidationError"):
            async with source:
                pass
    finally:
        srv.log.close()


# -- lifecycle -----------------------------------------------------------------------------------
async def test_exit_stops_the_process_and_leaves_no_tasks(stdio_server: TestServer) -> None:
    tasks_before = len(anyio.get_running_tasks())
    async with stdio_server.source() as source:
        registry = ToolRegistry()
        registry.register(source)
        pid = (await Dispatcher(registry).dispatch("pid", "{}")).data["pid"]
        assert alive(pid)
    assert not alive(pid)
    assert len(anyio.get_running_tasks()) == tasks_before
    late = await Dispatcher(registry, DispatcherOptions(default_key=NO_RETRY)).dispatch("pid", "{}")
    assert late.error_type is ErrorType.TOOL_ERROR  # a closed source answers, never raises
    assert "closed" in late.message and not late.retryable


async def test_connect_failures_raise_on_enter(tmp_path: Path) -> None:
    missing = McpSource.stdio([str(tmp_path / "no-such-server")], McpSourceOptions(breaker_key="x"))
    with pytest.raises(McpConnectError, match="could not connect to x"):
        async with missing:
            pass
    closed_port = McpSource.http(
        f"http://127.0.0.1:{free_port()}/mcp",
        McpSourceOptions(breaker_key="y", connect_timeout_s=5),
    )
    with pytest.raises(McpConnectError, match="could not connect to y"):
        async with closed_port:
            pass
    silent = [sys.executable, "-c", "import sys; sys.stdin.read()"]  # never answers
    mute = McpSource.stdio(silent, McpSourceOptions(breaker_key="z", connect_timeout_s=0.3))
    started = anyio.current_time()
    with pytest.raises(McpConnectError, match="TimeoutError"):
        async with mute:
            pass
    assert anyio.current_time() - started < 3


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="prefix"):
        McpSource.stdio(["x"], McpSourceOptions(breaker_key="k", prefix="a b"))
    with pytest.raises(ValueError, match="protocol"):
        McpSource.stdio(["x"], McpSourceOptions(breaker_key="k", protocol="2025-11-25"))
    with pytest.raises(ValueError, match="backoff_initial_s"):
        McpSource.stdio(["x"], McpSourceOptions(breaker_key="k", backoff_initial_s=0))
    with pytest.raises(ValueError, match="url"):
        McpSource.http("ftp://example", McpSourceOptions(breaker_key="k"))
    with pytest.raises(ValueError, match="command"):
        McpSource.stdio("mcp-server-time", McpSourceOptions(breaker_key="k"))


COUNT_ERRORS: list[tuple[bool | str, bool]] = [
    (False, False),
    (True, True),
    ("(?i)widget is broken", True),
    ("upstream 503", False),
]


async def test_count_errors_makes_an_upstream_outage_trip_the_breaker(
    shared_http: TestServer, subtests: pytest.Subtests
) -> None:
    """A server that reports its own outage as ``isError`` can be told apart from one
    giving a business answer: always, never (the default), or by a pattern on the text.
    Each setting has its own source (a session of the module's server) and dispatcher;
    the four run at once."""
    config = KeyPolicy(
        breaker=BreakerOptions(fail_max=2, reset_timeout_s=60), retry=RetryOptions(max_attempts=1)
    )
    answers: dict[int, list[Any]] = {}
    failures: dict[int, int] = {}

    async def three_calls(case: int, count_errors: bool | str) -> None:
        async with shared_http.source(count_errors=count_errors) as source:
            registry = ToolRegistry()
            registry.register(source)
            dispatcher = Dispatcher(registry, DispatcherOptions(keys={"test": config}), audit=None)
            answers[case] = [await dispatcher.dispatch("fail", "{}") for _ in range(3)]
        failures[case] = dispatcher.breakers.snapshot()["test"]["failures"]

    async with anyio.create_task_group() as tg:
        for case, (count_errors, _) in enumerate(COUNT_ERRORS):
            tg.start_soon(three_calls, case, count_errors)
    for case, (count_errors, counted) in enumerate(COUNT_ERRORS):
        with subtests.test(count_errors=count_errors):
            first = answers[case][0]
            assert first.error_type is ErrorType.TOOL_ERROR
            assert first.retryable is counted
            assert first.message.startswith("the widget is broken")
            kinds = [a.error_type for a in answers[case]]
            if counted:
                assert kinds == [ErrorType.TOOL_ERROR] * 2 + [ErrorType.CIRCUIT_OPEN]
            else:
                assert kinds == [ErrorType.TOOL_ERROR] * 3
                assert failures[case] == 0


def test_count_errors_must_be_a_valid_pattern() -> None:
    with pytest.raises(ValueError, match="count_errors: not a valid regular expression"):
        McpSource.stdio(["x"], McpSourceOptions(breaker_key="k", count_errors="(unclosed"))


@pytest.mark.serial  # no loop stall over 50 ms
async def test_a_backtracking_output_pattern_never_holds_the_loop(
    stdio_server: TestServer,
) -> None:
    """An upstream declaring ``pattern: "^(a+)+$"`` and answering 30 characters against it:
    the SDK's pure-Python check would hold the loop for many seconds; toolrelay's own
    (jsonschema-rs, linear-time) answers ``invalid_output`` at once."""
    from loop_watchdog import watchdog

    async with stdio_server.source() as source:
        registry = ToolRegistry()
        registry.register(source)
        dispatcher = Dispatcher(registry, audit=None)
        async with watchdog() as dog:
            result = await dispatcher.dispatch("redos", "{}")
    assert result.error_type is ErrorType.INVALID_OUTPUT, result
    assert dog.max_gap < 0.05, dog.max_gap
