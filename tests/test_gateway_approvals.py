"""Approvals at the gateway: the human behind the MCP client approves risky calls.

``toolrelay serve`` runs as its own process in front of ``servers/mcp_test_server.py`` (over
stdio) and is called with the MCP Python SDK's ``ClientSession`` over stdio and streamable
HTTP; the client's ``elicitation_callback`` plays the human. The upstream's record file says
whether a call reached it, and the server's stderr carries the audit lines.

The upstream's ``careful`` tool is a write (its hints say so), ``wipe`` is destructive,
``text`` is read-only and ``dotted.name`` has no annotations at all (a write, per the spec).

A gateway start (and its upstream's) costs seconds of CPU: the tests whose settings are
``SHARED`` share one HTTP gateway per module (``shared``); each reads the upstream's record
and the audit lines from its own start on (a worker runs one test at a time). Over stdio
each client starts a gateway of its own, as MCP clients do.
"""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import httpx2
import mcp.types as types
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.session import ClientRequestContext, ElicitationFnT
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from prometheus_client import CollectorRegistry

from helpers import OBJ, MutablePlugin
from toolrelay import AuthContext, Dispatcher, ToolDeclaration, ToolRegistry
from toolrelay.approval import MAX_SHOWN_CHARS, UNASKED, Approval, Unasked
from toolrelay.result import ToolCall
from toolrelay.serve.settings import parse_serve_section
from toolrelay.settings import ConfigError

pytestmark = pytest.mark.anyio

SERVER = Path(__file__).parent / "servers" / "mcp_test_server.py"
TOKEN = "support-token-for-approvals-0123456789"
ENV = {**os.environ, "SUPPORT_TOKEN": TOKEN}
MCP_URL = re.compile(r"MCP on (http://[0-9.:]+/mcp)")
ADMIN_URL = re.compile(r"admin API on (http://[0-9.:]+)")
SECRET = "hunter2-0123456789"


class Human:
    """An elicitation callback: answers ``action`` (``None``: never answers)."""

    def __init__(self, action: str | None) -> None:
        self.action = action
        self.asked: list[types.ElicitRequestParams] = []

    async def __call__(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        self.asked.append(params)
        if self.action is None:
            await anyio.sleep_forever()
        return types.ElicitResult(action=self.action)  # type: ignore[arg-type]


class Gateway:
    """A ``toolrelay.toml`` with the test server behind the gateway, and its logs."""

    def __init__(
        self,
        tmp: Path,
        transport: str,
        *,
        serve: str = "",
        http: str = "",
        upstream: str = "",
        tools: tuple[str, ...] = (),
        admin: bool = False,
    ) -> None:
        tmp.mkdir(exist_ok=True)
        self.transport = transport
        self.record = tmp / "upstream.rec"
        self.errlog = tmp / "serve.err"
        self.url: str | None = None  # a gateway over HTTP already serving (``serving``)
        self.since = (0, 0)  # the bytes of the record and of the log before this test
        command = [sys.executable, str(SERVER), "--record", str(self.record)]
        command += [arg for tool in tools for arg in ("--tool", tool)]  # open-schema tools
        self.config = tmp / "toolrelay.toml"
        self.config.write_text(
            f"""
[serve]
transport = "{transport}"
{serve}
[serve.http]
port = 0
{http}
[serve.http.clients.support]
token_env = "SUPPORT_TOKEN"
[serve.upstreams.test]
command = {json.dumps(command)}
breaker_key = "mcp-test"
prefix = "up"
{upstream}
"""
            + ('[serve.admin]\nport = 0\ntoken_env = "SUPPORT_TOKEN"\n' if admin else "")
        )
        self.command = [sys.executable, "-m", "toolrelay", "serve", "--config", str(self.config)]

    @contextmanager
    def serving(self) -> Iterator[Gateway]:
        """This gateway over HTTP, serving until the block ends (for a module's tests)."""
        proc = self._spawn()
        try:
            self.url = self._announced(proc)
            yield self
        finally:
            _stop(proc)
        assert "Traceback" not in self.errlog.read_text()

    def view(self) -> Gateway:
        """This serving gateway for one test: its record and log read from here on."""
        view = copy.copy(self)
        view.since = (_size(self.record), _size(self.errlog))
        return view

    def log(self) -> str:
        """What the gateway wrote on stderr (since this test began)."""
        return self.errlog.read_bytes()[self.since[1] :].decode()

    async def metric(self, name: str) -> float:
        """One of the upstream's metrics, from the admin API (``admin=True``)."""
        found = ADMIN_URL.search(self.errlog.read_text())
        assert found is not None, self.errlog.read_text()
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx2.AsyncClient(headers=headers, timeout=10) as http:
            text = (await http.get(found.group(1) + "/metrics")).text
        [value] = [
            line for line in text.splitlines() if line.startswith(name + '{upstream="test"}')
        ]
        return float(value.rsplit(" ", 1)[1])

    def upstream_calls(self) -> list[str]:
        """The tools the upstream was asked to run."""
        return [event["tool"] for event in self.upstream_events()]

    def upstream_events(self) -> list[dict[str, Any]]:
        """The calls the upstream was asked to run (``tool``, ``arguments``, …)."""
        if not self.record.exists():
            return []
        lines = self.record.read_bytes()[self.since[0] :].decode().splitlines()
        events = [json.loads(line) for line in lines if line]
        return [event for event in events if event["event"] == "call"]

    def audit(self) -> list[dict[str, Any]]:
        """The audit lines the gateway wrote (JSON on stderr)."""
        lines = []
        for line in self.log().splitlines():
            if line.startswith("{") and '"decision"' in line:
                lines.append(json.loads(line))
        return lines

    async def audit_line(self, tool: str) -> dict[str, Any]:
        """The (eventually written) audit line of the one call of ``tool``."""
        [line] = await self.audit_lines(tool, 1)
        return line

    async def audit_lines(self, tool: str, calls: int) -> list[dict[str, Any]]:
        """The (eventually written) audit lines of the ``calls`` calls of ``tool``."""
        with anyio.fail_after(10):
            while True:
                found = [line for line in self.audit() if line["tool"] == tool]
                if len(found) >= calls:
                    assert len(found) == calls, found
                    return found
                await anyio.sleep(0.05)

    @asynccontextmanager
    async def stdio(self, human: ElicitationFnT | None) -> AsyncIterator[ClientSession]:
        params = StdioServerParameters(command=self.command[0], args=self.command[1:], env=ENV)
        with self.errlog.open("a") as err:
            async with (
                stdio_client(params, errlog=err) as (read, write),
                ClientSession(read, write, elicitation_callback=human) as session,
            ):
                await session.initialize()
                yield session
        assert "Traceback" not in self.log()

    @asynccontextmanager
    async def http(self, human: ElicitationFnT | None) -> AsyncIterator[ClientSession]:
        """A session with this gateway over HTTP: the serving one, else one started for it."""
        if self.url is not None:
            async with self._http_session(self.url, human) as session:
                yield session
            assert "Traceback" not in self.log()
            return
        proc = self._spawn()
        try:
            url = await anyio.to_thread.run_sync(self._announced, proc)
            async with self._http_session(url, human) as session:
                yield session
        finally:
            await anyio.to_thread.run_sync(_stop, proc)
        assert "Traceback" not in self.log()

    @asynccontextmanager
    async def _http_session(
        self, url: str, human: ElicitationFnT | None
    ) -> AsyncIterator[ClientSession]:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0)) as http,
            streamable_http_client(url, http_client=http) as (read, write),
            ClientSession(read, write, elicitation_callback=human) as session,
        ):
            await session.initialize()
            yield session

    def _spawn(self) -> subprocess.Popen[bytes]:
        with self.errlog.open("a") as err:
            return subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=ENV,
            )

    def _announced(self, proc: subprocess.Popen[bytes]) -> str:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            found = MCP_URL.search(self.errlog.read_text())
            if found:
                return found.group(1)
            time.sleep(0.05)
        raise AssertionError(f"the gateway did not start:\n{self.errlog.read_text()}")

    def session(self, human: ElicitationFnT | None) -> Any:
        return self.stdio(human) if self.transport == "stdio" else self.http(human)


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:  # pragma: no cover - a hung gateway
        proc.kill()
        proc.wait(5)


def envelope(result: types.CallToolResult) -> dict[str, Any]:
    assert isinstance(result.content[0], types.TextContent), result
    parsed: dict[str, Any] = json.loads(result.content[0].text)
    return parsed


# The gateway is a process of its own, on its own event loop: the backend here would only
# choose the loop of the MCP SDK's client, so these tests run it once (as test_gateway_traces
# and test_gateway_fast_lane do). The library's own approvals run on both backends below.
GATEWAY_PROCESS = pytest.mark.parametrize("anyio_backend", ["asyncio"])
WHO = {"stdio": "elicitation", "http": "elicitation:support"}
# The settings of the module's gateway: ``release`` and ``deploy`` are read-only by their
# hints, their floors make them a write and dangerous; ``text`` and ``careful`` are named at
# their hints' risk (read, write: a floor of "read" names a tool without raising it; an
# unnamed one would be dangerous, ``new_tool_risk``); ``dotted.name`` (no hints) is
# overridden to a read; one secret pattern of the operator's own.
SHARED: dict[str, Any] = {
    "upstream": 'tool_risk = { deploy = "dangerous", release = "write", text = "read", '
    'careful = "read" }\n'
    'tool_risk_override = { "dotted.name" = "read" }\n'
    '[dispatcher]\nsecret_patterns = ["corp-[0-9]{6}"]',
    "tools": ("deploy", "release"),
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with Gateway(tmp_path_factory.mktemp("served"), "http", **SHARED).serving() as gateway:
        yield gateway


@pytest.fixture
def shared(served: Gateway) -> Gateway:
    """The module's gateway (``SHARED``, over HTTP), read from this test on."""
    return served.view()


@pytest.fixture(params=["stdio", "http"])
def gateway(request: pytest.FixtureRequest, tmp_path: Path) -> Gateway:
    """``SHARED``: over stdio a gateway of this test's own, over HTTP the module's."""
    if request.param == "http":
        shared: Gateway = request.getfixturevalue("shared")
        return shared
    return Gateway(tmp_path, "stdio", **SHARED)


# -- the human decides ------------------------------------------------------------------------
@GATEWAY_PROCESS
async def test_an_approved_call_runs_and_the_audit_line_names_the_approver(
    gateway: Gateway,
) -> None:
    """The human is shown every argument the tool gets, sorted by name, one a line (not in the
    model's order), invisible and bidi characters escaped; the approved call gets them all."""
    # ``release`` is read-only by its hints: the floor makes it a write that needs approval
    human = Human("accept")
    arguments = {"z_note": "ok", "path": "/srv/\u202estaging", "a": [1, {"b": None}]}
    async with gateway.session(human) as session:
        result = await session.call_tool("up__release", arguments)
        assert result.is_error is not True, result
    [called] = gateway.upstream_events()
    assert called["tool"] == "release" and called["arguments"] == arguments  # got it all
    [asked] = human.asked
    assert isinstance(asked, types.ElicitRequestFormParams)
    assert "'up__release'" in asked.message and "write" in asked.message
    shown = asked.message.split("\n", 1)[1]
    assert shown == (
        "{\n"
        '  "a": [\n    1,\n    {\n      "b": null\n    }\n  ],\n'
        '  "path": "/srv/\\u202estaging",\n'
        '  "z_note": "ok"\n'
        "}"
    ), shown
    line = await gateway.audit_line("up__release")
    assert line["decision"] == "approved" and line["outcome"] == "ok"
    assert line["approver"] == WHO[gateway.transport]


# -- what cannot be shown is not asked -----------------------------------------------------------
@GATEWAY_PROCESS
async def test_arguments_too_long_to_show_are_not_put_to_the_human(shared: Gateway) -> None:
    """The padding attack: the real target after enough padding to fall past a cut. The
    human is not asked for a blind yes: ``needs_approval``, with the reason."""
    gateway = shared
    human = Human("accept")
    padded = {"comment": "x" * (MAX_SHOWN_CHARS + 10), "path": "/srv/prod/ALL"}
    async with gateway.http(human) as session:
        answer = envelope(await session.call_tool("up__deploy", padded))
        # just within the budget: asked, and shown whole
        fits = {"comment": "x" * (MAX_SHOWN_CHARS - 60), "path": "/srv/prod/ALL"}
        fitted = await session.call_tool("up__deploy", fits)
    assert answer["error_type"] == "needs_approval" and answer["retryable"] is False, answer
    assert "characters" in answer["message"] and f"{MAX_SHOWN_CHARS:,}" in answer["message"]
    assert fitted.is_error is not True, fitted
    [asked] = human.asked
    assert '"path": "/srv/prod/ALL"' in asked.message and fits["comment"] in asked.message
    assert [event["arguments"] for event in gateway.upstream_events()] == [fits]
    first, _ = await gateway.audit_lines("up__deploy", 2)
    assert first["decision"] == "needs_approval" and first["outcome"] == "needs_approval"


@GATEWAY_PROCESS
@pytest.mark.parametrize(
    "arguments",
    [
        {"path": "/srv/staging", "deploy_token": "rm -rf /srv/prod"},  # a secret-named key
        {"path": "/srv/staging", "note": f"password={SECRET}"},  # a secret-shaped value
        {"path": "/srv/staging", "steps": [{"apiKey": 1}]},  # nested, any type
        {"path": "/srv/staging", "ticket": "corp-123456"},  # the operator's secret_patterns
    ],
)
async def test_arguments_that_would_be_masked_are_never_approvable(
    shared: Gateway, arguments: dict[str, Any]
) -> None:
    """The ``*_token`` key attack: what a mask would hide is never put to the human (it
    would be approved blind); a tool needing a secret gets it from the host, not the model."""
    gateway = shared  # deploy is dangerous; the operator's secret_patterns: corp-NNNNNN
    human = Human("accept")
    async with gateway.http(human) as session:
        answer = envelope(await session.call_tool("up__deploy", arguments))
    assert answer["error_type"] == "denied" and answer["retryable"] is False, answer
    assert "secret" in answer["message"] and "AuthContext" in answer["message"], answer
    assert SECRET not in answer["message"] and "rm -rf" not in answer["message"]
    assert human.asked == [] and gateway.upstream_calls() == []
    line = await gateway.audit_line("up__deploy")
    assert line["decision"] == "denied" and line["approver"] == "toolrelay", line


@GATEWAY_PROCESS
async def test_a_declined_or_cancelled_elicitation_denies(gateway: Gateway) -> None:
    """Declined, then cancelled: one gateway and session, a call (and an audit line) each."""
    human = Human(None)
    answers = {}
    async with gateway.session(human) as session:
        for asked, action in enumerate(("decline", "cancel"), start=1):
            human.action = action
            answers[action] = envelope(await session.call_tool("up__careful", {}))
            assert len(human.asked) == asked, action  # asked once per call
    for action, answer in answers.items():
        assert answer["error_type"] == "denied" and answer["retryable"] is False, action
        assert (action + "d") in answer["message"] or action in answer["message"], action
    assert gateway.upstream_calls() == []
    lines = await gateway.audit_lines("up__careful", 2)
    for line in lines:
        assert line["decision"] == "denied" and line["outcome"] == "denied", line
        assert line["approver"] == WHO[gateway.transport], line


@GATEWAY_PROCESS
@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_no_answer_denies_after_the_approval_timeout(tmp_path: Path, transport: str) -> None:
    gateway = Gateway(tmp_path, transport, serve="approval_timeout_s = 0.5")
    human = Human(None)
    async with gateway.session(human) as session:
        with anyio.fail_after(10):
            result = await session.call_tool("up__careful", {})
    answer = envelope(result)
    assert answer["error_type"] == "denied", answer
    assert "no answer within 0.5 s" in answer["message"]
    assert len(human.asked) == 1
    assert gateway.upstream_calls() == []
    assert (await gateway.audit_line("up__careful"))["decision"] == "denied"


@GATEWAY_PROCESS
async def test_a_call_cancelled_while_the_human_thinks_is_cancelled_not_answered(
    gateway: Gateway,
) -> None:
    human = Human(None)  # the gateway waits for an answer 60 s (the default)
    async with gateway.session(human) as session:
        with anyio.move_on_after(1.0) as scope:
            await session.call_tool("up__careful", {})
        assert scope.cancelled_caught
        with anyio.fail_after(5):
            while not human.asked:  # noqa: ASYNC110 - the other process asks
                await anyio.sleep(0.05)
        line = await gateway.audit_line("up__careful")
        # the session still serves: a read-only call answers at once
        ok = await session.call_tool("up__text", {"message": "still here"})
        assert ok.is_error is not True, ok
    assert line["decision"] == "pending" and line["outcome"] == "cancelled"
    assert gateway.upstream_calls() == ["text"]


# -- nobody to ask ----------------------------------------------------------------------------
@GATEWAY_PROCESS
async def test_a_client_without_elicitation_gets_needs_approval(gateway: Gateway) -> None:
    async with gateway.session(None) as session:
        result = await session.call_tool("up__careful", {})
    assert envelope(result)["error_type"] == "needs_approval"
    assert gateway.upstream_calls() == []
    line = await gateway.audit_line("up__careful")
    assert line["decision"] == "needs_approval" and "approver" not in line


@GATEWAY_PROCESS
async def test_approvals_none_never_asks(tmp_path: Path) -> None:
    gateway = Gateway(tmp_path, "stdio", serve='approvals = "none"')
    human = Human("accept")
    async with gateway.stdio(human) as session:
        result = await session.call_tool("up__careful", {})
    assert envelope(result)["error_type"] == "needs_approval"
    assert human.asked == [] and gateway.upstream_calls() == []


@GATEWAY_PROCESS
async def test_json_response_mode_cannot_ask_mid_call(tmp_path: Path) -> None:
    gateway = Gateway(tmp_path, "http", http="json_response = true")
    human = Human("accept")
    async with gateway.http(human) as session:
        result = await session.call_tool("up__careful", {})
    assert envelope(result)["error_type"] == "needs_approval"
    assert human.asked == [] and gateway.upstream_calls() == []


# -- the operator's risk overrides --------------------------------------------------------------
@GATEWAY_PROCESS
async def test_an_override_lets_an_unannotated_tool_run_without_approval(
    gateway: Gateway,
) -> None:
    # SHARED: tool_risk_override = { "dotted.name" = "read" }
    async with gateway.session(None) as session:
        listed = {tool.name: tool for tool in (await session.list_tools()).tools}
        ran = await session.call_tool("up__dotted_name", {})
        careful = await session.call_tool("up__careful", {})
    assert ran.is_error is not True, ran
    assert envelope(careful)["error_type"] == "needs_approval"  # only the named tool
    assert gateway.upstream_calls() == ["dotted.name"]
    # the override decides approval; the hints stay the server's (it gave none)
    assert listed["up__dotted_name"].annotations is None


@GATEWAY_PROCESS
async def test_overrides_beat_floors_and_hints_floors_beat_hints(tmp_path: Path) -> None:
    gateway = Gateway(
        tmp_path,
        "stdio",
        upstream="""risk = "write"
risk_override = "read"
tool_risk = { text = "dangerous" }
tool_risk_override = { wipe = "read" }
new_tool_risk = "read"  # tools no rule names (careful) may be "read" too
""",
    )
    floors = Gateway(tmp_path / "floors", "stdio", upstream='tool_risk = { text = "write" }')
    got: dict[str, types.CallToolResult] = {}

    async def overridden() -> None:
        async with gateway.stdio(None) as session:
            got["wipe"] = await session.call_tool("up__wipe", {})  # destructive, overridden
            got["careful"] = await session.call_tool("up__careful", {})  # write, overridden

    async def floored() -> None:
        async with floors.stdio(None) as session:
            got["text"] = await session.call_tool("up__text", {"message": "x"})  # floor
            got["wipe floored"] = await session.call_tool("up__wipe", {})  # dangerous hint

    async with anyio.create_task_group() as tg:  # two gateways, started side by side
        tg.start_soon(overridden)
        tg.start_soon(floored)
    assert got["wipe"].is_error is not True and got["careful"].is_error is not True
    assert gateway.upstream_calls() == ["wipe", "careful"]
    assert envelope(got["text"])["error_type"] == "needs_approval"
    assert envelope(got["wipe floored"])["error_type"] == "needs_approval"
    assert floors.upstream_calls() == []
    assert (await floors.audit_line("up__wipe"))["risk"] == "dangerous"


@GATEWAY_PROCESS
async def test_risk_rules_follow_a_renamed_tool(tmp_path: Path) -> None:
    """Issue 28, item 6. The rules name ``delete_repo``; the server offers it renamed.
    ``remove_repo`` (read-only by its hints) is named by no rule: ``dangerous``
    (``new_tool_risk``'s default), logged once and counted, and so is a tool added later.
    ``Delete-Repo`` is ``delete_repo`` with its case and separator changed: its floor holds
    even with ``new_tool_risk = "read"``, which lets an unnamed read tool run."""
    rules = 'tool_risk = { delete_repo = "dangerous" }'
    strict = Gateway(
        tmp_path / "strict", "stdio", upstream=rules, tools=("remove_repo",), admin=True
    )
    relaxed = Gateway(
        tmp_path / "relaxed",
        "stdio",
        upstream=rules + '\nnew_tool_risk = "read"',
        tools=("Delete-Repo",),
    )
    human = Human("decline")
    async with strict.stdio(human) as session:
        removed = envelope(await session.call_tool("up__remove_repo", {}))
        new = await strict.metric("toolrelay_mcp_upstream_new_tools_total")
        human.action = "accept"
        added = await session.call_tool("up__add_tool", {"name": "purge"})  # new: dangerous
        assert added.is_error is not True, added
        with anyio.fail_after(10):  # the server announces its new list; the gateway reads it
            while await strict.metric("toolrelay_mcp_upstream_new_tools_total") != new + 1:  # noqa: ASYNC110
                await anyio.sleep(0.05)
        listed = {tool.name: tool for tool in (await session.list_tools()).tools}
    assert removed["error_type"] == "denied", removed  # asked, and the human said no
    assert (await strict.audit_line("up__remove_repo"))["risk"] == "dangerous"
    # the server's hints, as stated: none (which the spec reads as possibly destructive)
    assert listed["up__purge"].annotations is None
    assert strict.upstream_calls() == ["add_tool"]
    warned = strict.errlog.read_text().count("rule names tool 'remove_repo'")
    assert warned == 1, strict.errlog.read_text()  # once, though the list was read twice

    async with relaxed.stdio(None) as session:
        renamed = envelope(await session.call_tool("up__Delete-Repo", {}))
        text = await session.call_tool("up__text", {"message": "hi"})
    assert renamed["error_type"] == "needs_approval", renamed
    assert text.is_error is not True, text
    assert relaxed.upstream_calls() == ["text"]


# -- what any approver may answer (the library, no gateway) ------------------------------------
@pytest.mark.parametrize(
    ("decision", "error_type", "message", "approver"),
    [
        (Approval(True, "alice"), None, None, "alice"),
        (Approval(False, "bob", "too risky today"), "denied", "too risky today", "bob"),
        (Approval(False, "bob"), "denied", "was not approved", "bob"),
        (UNASKED, "needs_approval", "needs approval first", None),
        (Unasked("nobody on call"), "needs_approval", "approval first (nobody on call)", None),
        (True, None, None, None),
        ("yes", "denied", "was not approved", None),
    ],
)
async def test_an_approvers_decision(
    decision: Any, error_type: str | None, message: str | None, approver: str | None
) -> None:
    plugin = MutablePlugin([ToolDeclaration("send", "Sends.", OBJ, risk="write")])
    registry = ToolRegistry()
    registry.register(plugin)
    records: list[dict[str, Any]] = []

    async def approve(call: ToolCall, decl: ToolDeclaration, ctx: AuthContext) -> Any:
        await anyio.lowlevel.checkpoint()
        return decision

    dispatcher = Dispatcher(
        registry, approver=approve, audit=records.append, metrics_registry=CollectorRegistry()
    )
    result = (await dispatcher.dispatch("send", {}, AuthContext(user_id="u"))).to_model()
    if error_type is None:
        assert result["ok"] is True and len(plugin.calls) == 1
    else:
        assert result["error_type"] == error_type and plugin.calls == []
        assert message is not None and message in result["message"]
    [record] = records
    assert record.get("approver") == approver
    assert ("approver" in record) is (approver is not None)


@pytest.mark.parametrize(
    ("section", "where"),
    [
        ({"approvals": "ask"}, "approvals"),
        ({"approval_timeout_s": 0}, "approval_timeout_s"),
        (
            {"upstreams": {"u": {"command": ["x"], "breaker_key": "k", "risk_override": "safe"}}},
            "risk_override",
        ),
        (
            {
                "upstreams": {
                    "u": {"command": ["x"], "breaker_key": "k", "tool_risk_override": {"t": "low"}}
                }
            },
            "tool_risk_override",
        ),
    ],
)
def test_bad_approval_and_override_settings_are_one_line_errors(
    section: dict[str, Any], where: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_serve_section(section)
    message = str(caught.value)
    assert where in message and "\n" not in message, message


def test_approval_settings_defaults() -> None:
    settings = parse_serve_section({})
    assert settings.approvals == "elicit" and settings.approval_timeout_s == 60.0
