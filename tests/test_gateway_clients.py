"""``toolrelay serve`` in front of ``mcp-server-time``, through strict MCP clients.

The clients validate ``structuredContent`` against the tool's ``outputSchema``: the official
TypeScript SDK (``@modelcontextprotocol/sdk`` 1.x, which does so even when ``isError`` is
true, and ``@modelcontextprotocol/client`` 2.x), the MCP Inspector CLI (``npx
@modelcontextprotocol/inspector --cli``), and the MCP Python SDK. Each one makes the same
three calls, and each must hand over, without throwing:

* a good call: ``structuredContent`` that matches the listed schema;
* a bad timezone (the upstream's ``isError``): ``isError: true`` and the answer envelope
  (``error_type``, ``message``, ``retryable``) as the JSON text;
* an output over ``max_output_bytes`` with ``truncate_output = true``: ``isError: true``,
  an ``invalid_output`` envelope, then the cut output as text — never ``structuredContent``
  that breaks the schema.

The npm packages are pinned in ``tests/node/package.json`` and installed once per machine by
``tests/node_packages.py``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import mcp.types as types
import pytest
from mcp import Client, ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

import node_packages
from toolrelay import AuthContext, ToolRegistry
from toolrelay.contract import ErrorType
from toolrelay.jsonlimits import TRUNCATION_MARKER, truncated
from toolrelay.result import ToolResult

ROOT = Path(__file__).resolve().parent.parent
NODE_SOURCES = node_packages.NODE_SOURCES
ADMIN_TOKEN = "admin-token-for-the-client-tests-0123"
CAP = 160  # bytes: get_current_time (~105) fits, convert_time (~250) is cut
MCP_LINE = re.compile(r"(admin API on|MCP on) (http://[0-9.:]+(?:/mcp)?)")
GOOD = ("time__get_current_time", {"timezone": "Europe/Oslo"})
BAD = ("time__get_current_time", {"timezone": "Nowhere/Bad"})
CUT = (
    "time__convert_time",
    {"source_timezone": "Europe/Oslo", "time": "12:00", "target_timezone": "Asia/Tokyo"},
)
CALLS = [GOOD, BAD, CUT]


# -- what every client must have handed over --------------------------------------------------
def check_good(result: dict[str, Any]) -> None:
    assert result.get("isError") is not True, result
    data = result["structuredContent"]
    assert set(data) == {"timezone", "datetime", "day_of_week", "is_dst"}, data
    assert data["timezone"] == "Europe/Oslo"
    assert json.loads(result["content"][0]["text"]) == data


def check_bad(result: dict[str, Any]) -> None:
    assert result["isError"] is True, result
    assert result.get("structuredContent") is None, "a failure with structuredContent"
    envelope = json.loads(result["content"][0]["text"])
    assert envelope["ok"] is False and envelope["error_type"] == "tool_error", envelope
    assert envelope["retryable"] is False and "Nowhere/Bad" in envelope["message"], envelope


def check_cut(result: dict[str, Any]) -> None:
    assert result["isError"] is True, result
    assert result.get("structuredContent") is None, "cut output as structuredContent"
    envelope = json.loads(result["content"][0]["text"])
    assert envelope["error_type"] == "invalid_output" and envelope["retryable"] is False
    assert "output schema" in envelope["message"], envelope
    partial = json.loads(result["content"][1]["text"])
    assert partial["truncated"] is True and partial["original_bytes"] > CAP, partial
    assert partial["text"].endswith(TRUNCATION_MARKER), partial


CHECKS = {id(GOOD): check_good, id(BAD): check_bad, id(CUT): check_cut}


def check_calls(calls: list[dict[str, Any]], who: str, made: list[Any] = CALLS) -> None:
    """``calls``: per call made (of CALLS), ``{"result": <CallToolResult as JSON>}``, or
    ``{"error": ...}`` when the client threw instead of handing the result over."""
    assert len(calls) == len(made)
    for call, spec in zip(calls, made, strict=True):
        assert "error" not in call, f"{who} threw on {call['name']}: {call['error']}"
        CHECKS[id(spec)](call["result"])


# -- the gateway --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A toolrelay.toml with mcp-server-time behind the gateway and a small output cap."""
    if importlib.util.find_spec("mcp_server_time") is None:
        node_packages.unavailable("mcp-server-time is not installed (pip install mcp-server-time)")
    upstream = [sys.executable, "-m", "mcp_server_time", "--local-timezone", "UTC"]
    path = tmp_path_factory.mktemp("gateway") / "toolrelay.toml"
    path.write_text(f"""
[dispatcher]
max_output_bytes = {CAP}
truncate_output = true
[serve]
transport = "stdio"
[serve.http]
port = 0
[serve.upstreams.time]
command = {json.dumps(upstream)}
breaker_key = "mcp-time"
prefix = "time"
timeout_s = 10
""")
    return path


def serve_command(config: Path) -> list[str]:
    return [sys.executable, "-m", "toolrelay", "serve", "--config", str(config)]


def serve_env() -> dict[str, str]:
    return {**os.environ, "TOOLRELAY_ADMIN_TOKEN": ADMIN_TOKEN}


@dataclass
class HttpGateway:
    mcp_url: str
    admin_url: str

    def metric(self, name: str, **labels: str) -> float:
        response = httpx.get(
            self.admin_url + "/metrics",
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            timeout=10,
        )
        response.raise_for_status()
        total = 0.0
        for line in response.text.splitlines():
            if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total


@pytest.fixture(scope="module")
def http_gateway(config: Path) -> Iterator[HttpGateway]:
    """``toolrelay serve --transport http`` on 127.0.0.1, port chosen by the system."""
    errlog = config.parent / "serve-http.err"
    with errlog.open("w") as err:
        proc = subprocess.Popen(
            [*serve_command(config), "--transport", "http", "--admin-port", "0"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=serve_env(),
        )
    try:
        deadline = time.monotonic() + 30
        urls: dict[str, str] = {}
        while len(urls) < 2:
            assert proc.poll() is None, errlog.read_text()
            assert time.monotonic() < deadline, errlog.read_text()
            time.sleep(0.05)
            urls = dict(MCP_LINE.findall(errlog.read_text()))
        yield HttpGateway(urls["MCP on"], urls["admin API on"])
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(timeout=15) == 0, errlog.read_text()
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert "Traceback" not in errlog.read_text()


# -- the Node clients ---------------------------------------------------------------------------
@dataclass
class NodeClients:
    """The installed npm packages, and a workspace whose node_modules links to them."""

    workspace: Path
    node: str
    npx: list[str]

    def env(self) -> dict[str, str]:
        home = self.workspace / "home"
        home.mkdir(exist_ok=True)
        return {
            **serve_env(),
            "HOME": str(home),  # the Inspector's files (~/.mcp-inspector) stay in the workspace
            "npm_config_offline": "true",  # npx finds the installed packages, never the registry
            "npm_config_update_notifier": "false",
        }

    def sdk(self, sdk: str, target: list[str], *, era: str = "legacy") -> dict[str, Any]:
        """Run tests/node/mcp_call.mjs: CALLS through one TypeScript SDK client."""
        where = ["--url", target[0]] if target[0].startswith("http") else ["--", *target]
        command = [self.node, "mcp_call.mjs", "--sdk", sdk, "--era", era]
        command += ["--calls", json.dumps(CALLS), *where]
        proc = subprocess.run(
            command, cwd=self.workspace, env=self.env(), capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, f"mcp_call.mjs failed:\n{proc.stdout}\n{proc.stderr}"
        out: dict[str, Any] = json.loads(proc.stdout)
        return out

    def inspector(self, target: list[str], calls: list[Any]) -> list[dict[str, Any]]:
        """``calls`` through ``npx @modelcontextprotocol/inspector --cli``, one process each
        (side by side): ``{"result": ...}`` when it handed a result over, else its error."""
        procs = []
        for name, arguments in calls:
            command = [*self.npx, "--no", "--", "@modelcontextprotocol/inspector", "--cli"]
            command += ["--method", "tools/call", "--tool-name", name, "--tool-arg"]
            command += [f"{key}={value}" for key, value in arguments.items()]
            command += ["--format", "json", "--quiet", "--", *target]
            procs.append(
                subprocess.Popen(
                    command,
                    cwd=self.workspace,
                    env=self.env(),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        answers = []
        for (name, _), proc in zip(calls, procs, strict=True):
            stdout, stderr = proc.communicate(timeout=120)
            # exit 0: a result; 5: a result with isError (the Inspector's TOOL_ERROR); else
            # the Inspector refused the answer (its error on stderr)
            if proc.returncode in (0, 5):
                answers.append({"name": name, **json.loads(stdout)})
            else:
                error = {"exit": proc.returncode, "stderr": stderr.strip()[-2000:]}
                answers.append({"name": name, "error": error})
        return answers


@pytest.fixture(scope="session")
def node_clients(tmp_path_factory: pytest.TempPathFactory) -> NodeClients:
    packages = node_packages.installed()
    workspace = tmp_path_factory.mktemp("node-clients")
    (workspace / "node_modules").symlink_to(packages.modules, target_is_directory=True)
    shutil.copy2(NODE_SOURCES / "package.json", workspace / "package.json")
    shutil.copy2(NODE_SOURCES / "mcp_call.mjs", workspace / "mcp_call.mjs")
    return NodeClients(workspace, packages.node, packages.npx)


@pytest.mark.servers
@pytest.mark.parametrize(
    ("sdk", "transport", "era"),
    [("v1", "stdio", "legacy"), ("v1", "http", "legacy"), ("v2", "stdio", "legacy"),
     ("v2", "http", "auto")],
)  # fmt: skip
def test_typescript_sdk_client(
    node_clients: NodeClients,
    config: Path,
    request: pytest.FixtureRequest,
    sdk: str,
    transport: str,
    era: str,
) -> None:
    if transport == "http":
        target = [request.getfixturevalue("http_gateway").mcp_url]
    else:
        target = serve_command(config)
    out = node_clients.sdk(sdk, target, era=era)
    # both tools are listed with their schema, so the SDK validates what they answer
    assert out["tools"]["time__get_current_time"] is not None
    assert out["tools"]["time__convert_time"] is not None
    if era == "auto":
        assert out["protocolVersion"] == "2026-07-28", out
    check_calls(out["calls"], f"TypeScript SDK {sdk} over {transport}")


@pytest.mark.servers
@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_inspector_cli(
    node_clients: NodeClients, config: Path, request: pytest.FixtureRequest, transport: str
) -> None:
    # over stdio every call starts a gateway and mcp-server-time: just the repro there
    if transport == "http":
        target, calls = [request.getfixturevalue("http_gateway").mcp_url], CALLS
    else:
        target, calls = serve_command(config), [BAD]
    answers = node_clients.inspector(target, calls)
    check_calls(answers, f"the MCP Inspector CLI over {transport}", calls)


# -- the Python SDK -----------------------------------------------------------------------------
def as_json(result: types.CallToolResult) -> dict[str, Any]:
    dumped: dict[str, Any] = result.model_dump(mode="json", by_alias=True, exclude_none=True)
    return dumped


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_python_sdk_stdio_session(config: Path) -> None:
    command = serve_command(config)
    params = StdioServerParameters(command=command[0], args=command[1:], env=serve_env())
    calls: list[dict[str, Any]] = []
    with (config.parent / "serve-stdio.err").open("w") as err:
        async with (
            stdio_client(params, errlog=err) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            listing = await session.list_tools()
            assert all(tool.output_schema for tool in listing.tools)
            for name, arguments in CALLS:
                try:
                    result = await session.call_tool(name, arguments)
                except RuntimeError as exc:  # the SDK's own output-schema check
                    calls.append({"name": name, "error": str(exc)})
                else:
                    calls.append({"name": name, "result": as_json(result)})
    check_calls(calls, "the Python SDK's ClientSession over stdio")


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_python_sdk_2026_client_over_http(http_gateway: HttpGateway) -> None:
    refused = http_gateway.metric("toolrelay_mcp_tool_calls_total", outcome="invalid_output")
    calls: list[dict[str, Any]] = []
    async with Client(http_gateway.mcp_url, cache=None) as client:
        assert client.protocol_version == "2026-07-28"
        await client.list_tools()
        for name, arguments in CALLS:
            try:
                result = await client.call_tool(name, arguments)
            except RuntimeError as exc:
                calls.append({"name": name, "error": str(exc)})
            else:
                calls.append({"name": name, "result": as_json(result)})
    check_calls(calls, "the Python SDK's 2026 Client over HTTP")
    # the cut output is counted as what the client got: invalid_output
    labels = {"tool": "time__convert_time", "outcome": "invalid_output"}
    assert http_gateway.metric("toolrelay_mcp_tool_calls_total", **labels) >= 1
    now = http_gateway.metric("toolrelay_mcp_tool_calls_total", outcome="invalid_output")
    assert now == refused + 1


# -- the rules, one by one (no processes) --------------------------------------------------
SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer"}},
    "required": ["n"],
    "additionalProperties": False,
}


def compiled_tools() -> ToolRegistry:
    registry = ToolRegistry()

    @registry.tool(name="typed", description="Has an output schema.", output_schema=SCHEMA)
    def typed(args: dict[str, Any], ctx: AuthContext) -> dict[str, int]:
        return {"n": 1}

    @registry.tool(name="loose", description="Has none.")
    def loose(args: dict[str, Any], ctx: AuthContext) -> dict[str, int]:
        return {"n": 1}

    return registry


def test_answers_by_output_schema() -> None:
    from toolrelay.serve.answers import answer

    registry = compiled_tools()
    typed, loose = registry.resolve("typed"), registry.resolve("loose")
    assert typed is not None and typed.output_validator is not None
    assert loose is not None and loose.output_validator is None
    failed = ToolResult(
        ok=False, tool="x", call_id="1", error_type=ErrorType.TIMEOUT, message="slow",
        retryable=True, retry_after_s=0.5,
    )  # fmt: skip
    envelope = failed.to_model()

    # a failure: always the envelope as JSON text; as structuredContent only without a schema
    for tool, structured in ((loose, envelope), (typed, None), (None, None)):
        sent = answer(failed, tool)
        assert sent.outcome == "timeout"
        assert sent.result.is_error is True
        assert sent.result.structured_content == structured
        assert [json.loads(block.text) for block in sent.result.content] == [envelope]  # type: ignore[union-attr]

    # a success that matches the schema: structuredContent and JSON text
    good = ToolResult(ok=True, tool="typed", call_id="2", data={"n": 3})
    for tool in (typed, loose):
        sent = answer(good, tool)
        assert sent.outcome == "ok" and sent.result.is_error is False
        assert sent.result.structured_content == {"n": 3}

    # a cut output: breaks the schema, so an invalid_output failure with the part that fits
    big = json.dumps({"n": 1, "x": "y" * 500})
    cut = ToolResult(ok=True, tool="typed", call_id="3", data=truncated(big, 520, 200))
    sent = answer(cut, typed)
    assert sent.outcome == "invalid_output" and sent.result.is_error is True
    assert sent.result.structured_content is None
    first, second = (json.loads(block.text) for block in sent.result.content)  # type: ignore[union-attr]
    assert first["error_type"] == "invalid_output" and first["retryable"] is False
    assert "520 bytes" in first["message"] and second == cut.data
    # ... while a tool without a schema keeps it as a success (nothing to break)
    sent = answer(cut, loose)
    assert sent.outcome == "ok" and sent.result.structured_content == cut.data

    # any other output that breaks the listed schema is refused the same way, without a part
    odd = ToolResult(ok=True, tool="typed", call_id="4", data={"n": "three"})
    sent = answer(odd, typed)
    assert sent.outcome == "invalid_output" and sent.result.structured_content is None
    assert len(sent.result.content) == 1
