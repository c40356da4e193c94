"""Secrets never leave toolrelay (issue 15): canaries planted where secrets really turn up.

Canaries (a host's own ``secret_patterns`` shape and the shapes the defaults must know)
are planted in tool arguments, a plugin's ``ToolError`` message, an unexpected exception,
an MCP server's error text and an HTTP upstream's error body. Each test then reads every
sink a secret could leave through and proves no canary is there, whole or in part:

- the model's answer (``ToolResult.to_model()``),
- log records of every logger at DEBUG (message, exception text, stack),
- the audit line (the records given to the sink, and the default sink's JSON line),
- spans (name, attributes, status, events) from the OTel SDK, with and without
  ``capture_content``,
- the Prometheus exposition text.

The MCP server and the HTTP upstream are real processes/sockets on loopback; nothing is
mocked.
"""

from __future__ import annotations

import json
import logging
import secrets
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry, generate_latest

from helpers import dispatcher_with
from toolrelay import (
    AuthContext,
    BreakerOptions,
    Dispatcher,
    ErrorType,
    KeyPolicy,
    Profile,
    RetryOptions,
    ToolError,
    ToolRegistry,
    ToolResult,
)
from toolrelay.pipeline.audit import log_sink
from toolrelay.redact import Redactor

pytestmark = pytest.mark.anyio

CUSTOM_PATTERN = r"CANARY-[0-9a-f]{16}"
ALICE = AuthContext(user_id="alice", tenant_id="acme")
OPEN = {"open": Profile(require_approval=())}
FAST = KeyPolicy(
    breaker=BreakerOptions(fail_max=10_000),
    retry=RetryOptions(max_attempts=2, backoff_initial_s=0.001, backoff_max_s=0.002),
)


# -- canaries --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Canary:
    shape: str
    text: str  # how an upstream or a user would write it
    secret: str  # the part that must never be seen
    random: str  # the secret's random part (16 hex digits): partial leaks are looked for

    def seen_in(self, text: str) -> bool:
        return self.random[:8] in text or self.random[8:] in text


def _canary(shape: str, template: str, tag: str = "") -> Canary:
    random = secrets.token_hex(8)
    secret = f"{tag}{random}"
    return Canary(shape, template.format(secret), secret, random)


def _custom() -> Canary:
    random = secrets.token_hex(8)
    secret = f"CANARY-{random}"
    return Canary("custom secret_patterns", f"account {secret} is locked", secret, random)


CUSTOM = _custom()
CANARIES: tuple[Canary, ...] = (
    CUSTOM,
    _canary("JSON api_key", '{{"api_key": "{}"}}', "Ak"),
    _canary("JSON api_key, no spaces", '{{"apiKey":"{}","q":1}}', "Bk"),
    _canary("YAML password", "password: {}", "Pw"),
    _canary("Bearer + tab", "Authorization: Bearer\t{}", "Bt"),
    _canary("Bearer + two spaces", "Bearer  {}", "Bs"),
    _canary("Basic + newline", "Authorization: Basic\n{}", "Ba"),
    _canary("token: value", "token: {}", "Tk"),
    _canary('"secret": "value"', 'error {{"secret": "{}", "code": 7}}', "Se"),
    _canary("client_secret=", "POST /oauth client_secret={}&grant=x", "Cs"),
    _canary("access_token JSON", '{{"access_token":"{}"}}', "At"),
    _canary("refresh_token YAML", "refresh_token:   {}", "Rt"),
    _canary("passwd=", "passwd={}", "Pd"),
    _canary("private_key repr", "{{'private_key': '{}'}}", "Pk"),
    _canary("escaped JSON in text", '{{\\"password\\": \\"{}\\"}}', "Ej"),
    _canary("Authorization: Token", "Authorization: Token {}", "9f"),
    _canary("Authorization JSON, other scheme", '{{"authorization": "ApiKey {}"}}', "Ak"),
    _canary("Cookie header", "Cookie: theme=dark; session={}; lang=en", "Ck"),
    _canary("Set-Cookie header", "set-cookie: sid={}; Path=/; HttpOnly", "Sc"),
    _canary("URL-encoded api_key", "GET /cb?next=%2Fv1%3Fq%3Dx%26api_key%3D{}%26n%3D1", "Ue"),
)
DEFAULT_SHAPES = CANARIES[1:]
EVERYTHING = " | ".join(c.text for c in CANARIES)


# -- sinks -----------------------------------------------------------------------------------
class Sinks:
    """Every place a secret could leave through, read back as text."""

    def __init__(self, caplog: pytest.LogCaptureFixture) -> None:
        self.caplog = caplog
        caplog.set_level(logging.DEBUG)  # every logger
        caplog.set_level(logging.DEBUG, logger="toolrelay")
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.metrics = CollectorRegistry()
        self.audited: list[dict[str, Any]] = []
        self.answers: list[str] = []

    def audit(self, record: dict[str, Any]) -> None:
        self.audited.append(record)
        log_sink(record)  # the default sink's JSON line too (read back from the logs)

    def dispatcher(self, registry: ToolRegistry, **kw: Any) -> Dispatcher:
        kw.setdefault("default_key", FAST)
        return dispatcher_with(
            registry,
            profiles=OPEN,
            secret_patterns=[CUSTOM_PATTERN],
            audit=self.audit,
            tracer_provider=self.provider,
            metrics_registry=self.metrics,
            **kw,
        )

    async def call(self, dispatcher: Dispatcher, name: str, args: Any) -> ToolResult:
        raw = args if isinstance(args, str) else json.dumps(args)
        result = await dispatcher.dispatch(name, raw, ALICE, profile="open", call_id="c1")
        self.answers.append(json.dumps(result.to_model()))
        return result

    def texts(self, *, skip_loggers: Sequence[str] = ()) -> dict[str, str]:
        formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
        records = [r for r in self.caplog.records if not r.name.startswith(tuple(skip_loggers))]
        return {
            "answer": "\n".join(self.answers),
            "log": "\n".join(formatter.format(record) for record in records),
            "audit": json.dumps(self.audited, default=str),
            "span": "\n".join(span.to_json() for span in self.exporter.get_finished_spans()),
            "metrics": generate_latest(self.metrics).decode(),
        }

    def leaks(
        self,
        canaries: Sequence[Canary] = CANARIES,
        *,
        only: Sequence[str] | None = None,
        skip_loggers: Sequence[str] = (),
    ) -> dict[str, list[str]]:
        """``{sink: [shapes seen there]}``; empty when nothing leaked."""
        found: dict[str, list[str]] = {}
        for sink, text in self.texts(skip_loggers=skip_loggers).items():
            if only is not None and sink not in only:
                continue
            seen = [c.shape for c in canaries if c.seen_in(text)]
            if seen:
                found[sink] = seen
        return found

    def assert_clean(self, **kw: Any) -> None:
        assert self.leaks(**kw) == {}
        assert self.exporter.get_finished_spans(), "no span was recorded: the test proves nothing"


@pytest.fixture
def sinks(caplog: pytest.LogCaptureFixture) -> Iterator[Sinks]:
    sinks = Sinks(caplog)
    yield sinks
    sinks.provider.shutdown()


# -- arguments -------------------------------------------------------------------------------
STRING_ARG = {
    "type": "object",
    "properties": {"q": {"type": "string", "maxLength": 4}},
    "additionalProperties": False,
}


def secret_arguments() -> dict[str, Any]:
    """Canaries as free text, under secret-named keys, nested and in lists."""
    return {
        "note": EVERYTHING,
        "api_key": DEFAULT_SHAPES[0].secret,
        "nested": {"password": DEFAULT_SHAPES[2].secret, "items": [c.text for c in CANARIES]},
        "ids": [CUSTOM.secret],
    }


def argument_tools() -> ToolRegistry:
    registry = ToolRegistry()

    @registry.tool(name="store", parameters={"type": "object"}, risk="write")
    async def store(args: dict[str, Any], ctx: AuthContext) -> str:
        return "stored"

    @registry.tool(name="store_sync", parameters={"type": "object"}, risk="dangerous")
    def store_sync(args: dict[str, Any], ctx: AuthContext) -> str:
        return "stored"

    @registry.tool(name="search", parameters=STRING_ARG, risk="write")
    async def search(args: dict[str, Any], ctx: AuthContext) -> str:
        return "found"

    return registry


async def _call_with_secret_arguments(sinks: Sinks, dispatcher: Dispatcher) -> None:
    args = secret_arguments()
    assert (await sinks.call(dispatcher, "store", args)).ok
    assert (await sinks.call(dispatcher, "store_sync", args)).ok
    for canary in CANARIES:  # refused by the schema: the message names the path, not the value
        refused = await sinks.call(dispatcher, "search", {"q": canary.text})
        assert refused.error_type is ErrorType.VALIDATION_ERROR
    broken = await sinks.call(dispatcher, "store", json.dumps(args)[:-1])  # not JSON
    assert broken.error_type is ErrorType.INVALID_ARGUMENTS


@pytest.mark.parametrize("audit_arguments", [False, True])
async def test_secret_arguments_reach_no_sink(sinks: Sinks, audit_arguments: bool) -> None:
    dispatcher = sinks.dispatcher(argument_tools(), audit_arguments=audit_arguments)
    await _call_with_secret_arguments(sinks, dispatcher)
    assert sinks.audited and all(r["tool"] for r in sinks.audited)
    if audit_arguments:
        assert sinks.audited[0]["arguments"]["nested"]["items"], "arguments were audited"
        # the default shapes are masked in the audit line; the custom pattern: see below
        assert sinks.leaks(DEFAULT_SHAPES) == {}
        assert sinks.leaks([CUSTOM], only=["answer", "span", "metrics"]) == {}
    else:
        sinks.assert_clean()


async def test_custom_secret_in_audited_arguments(sinks: Sinks) -> None:
    dispatcher = sinks.dispatcher(argument_tools(), audit_arguments=True)
    await _call_with_secret_arguments(sinks, dispatcher)
    assert sinks.leaks([CUSTOM], only=["audit", "log"]) == {}


async def test_captured_content_leaks_nowhere_else(sinks: Sinks) -> None:
    dispatcher = sinks.dispatcher(argument_tools(), capture_content=True)
    await _call_with_secret_arguments(sinks, dispatcher)
    assert sinks.leaks(only=["answer", "log", "audit", "metrics"]) == {}


async def test_captured_arguments_are_redacted_in_spans(sinks: Sinks) -> None:
    dispatcher = sinks.dispatcher(argument_tools(), capture_content=True)
    await _call_with_secret_arguments(sinks, dispatcher)
    spans = sinks.texts()["span"]
    assert "gen_ai.tool.call.arguments" in spans  # content was captured…
    assert "***" in spans  # …and masked
    sinks.assert_clean()


async def test_an_unknown_tool_name_is_redacted_in_spans(sinks: Sinks) -> None:
    dispatcher = sinks.dispatcher(argument_tools())
    result = await sinks.call(dispatcher, CUSTOM.secret, "{}")
    assert result.error_type is ErrorType.UNKNOWN_TOOL
    sinks.assert_clean(canaries=[CUSTOM])


async def test_secret_argument_names_are_not_echoed(sinks: Sinks) -> None:
    dispatcher = sinks.dispatcher(argument_tools())
    unexpected = await sinks.call(dispatcher, "search", {CUSTOM.secret: 1})
    assert unexpected.error_type is ErrorType.VALIDATION_ERROR
    twice = await sinks.call(
        dispatcher, "search", f'{{"{CUSTOM.secret}": 1, "{CUSTOM.secret}": 2}}'
    )
    assert twice.error_type is ErrorType.INVALID_ARGUMENTS
    sinks.assert_clean(canaries=[CUSTOM])


# -- plugin exceptions -----------------------------------------------------------------------
INDEX = {
    "type": "object",
    "properties": {"i": {"type": "integer", "minimum": 0}},
    "required": ["i"],
    "additionalProperties": False,
}


def raising_tools() -> ToolRegistry:
    registry = ToolRegistry()

    @registry.tool(name="tool_error", parameters=INDEX, risk="read")  # read: retried
    async def tool_error(args: dict[str, Any], ctx: AuthContext) -> None:
        raise ToolError("upstream said: " + CANARIES[args["i"]].text, retryable=True)

    @registry.tool(name="tool_error_sync", parameters=INDEX, risk="write")
    def tool_error_sync(args: dict[str, Any], ctx: AuthContext) -> None:
        raise ToolError(CANARIES[args["i"]].text)

    @registry.tool(name="crash", parameters=INDEX, risk="write")
    async def crash(args: dict[str, Any], ctx: AuthContext) -> None:
        try:
            raise KeyError(CANARIES[args["i"]].text)
        except KeyError as exc:
            raise RuntimeError(f"lookup failed for {CANARIES[args['i']].text}") from exc

    @registry.tool(name="crash_sync", parameters=INDEX, risk="dangerous")
    def crash_sync(args: dict[str, Any], ctx: AuthContext) -> None:
        raise ValueError(CANARIES[args["i"]].text)

    return registry


@pytest.mark.parametrize("capture_content", [False, True])
async def test_plugin_exceptions_reach_no_sink(sinks: Sinks, capture_content: bool) -> None:
    dispatcher = sinks.dispatcher(raising_tools(), capture_content=capture_content)
    for index in range(len(CANARIES)):
        for name in ("tool_error", "tool_error_sync"):
            result = await sinks.call(dispatcher, name, {"i": index})
            assert result.error_type is ErrorType.TOOL_ERROR
            assert "***" in result.message, result.message
        for name, kind in (("crash", "RuntimeError"), ("crash_sync", "ValueError")):
            result = await sinks.call(dispatcher, name, {"i": index})
            # the exception's type, never its text (a write also says its effect is unknown)
            assert result.message.startswith(f"{name} failed unexpectedly ({kind})")
            assert result.message.count("(") == 1
    logged = sinks.texts()["log"]
    assert "Traceback" in logged and "KeyError" in logged  # still useful: the cause is there
    assert "***" in logged
    assert "toolrelay.retry" in sinks.texts()["span"]  # span events were recorded too
    sinks.assert_clean()


# -- an MCP server's error text --------------------------------------------------------------
MCP_SERVER = """
import json, sys
import anyio
import mcp.types as types
from mcp.server.lowlevel.server import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError

TEXTS = json.loads(open(sys.argv[1], encoding="utf-8").read())
INDEX = {"type": "object", "properties": {"i": {"type": "integer"}}, "required": ["i"]}
READ = types.ToolAnnotations(read_only_hint=True)
TOOLS = [
    types.Tool(name=name, description=name, input_schema=INDEX, annotations=READ)
    for name in ("fail_text", "fail_long", "fail_rpc", "fail_rpc_long")
]


def text(value):
    return [types.TextContent(type="text", text=value)]


async def list_tools(ctx, params):
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx, params):
    name = params.name
    entry = TEXTS[int((params.arguments or {})["i"])]
    if name == "fail_text":
        return types.CallToolResult(content=text("upstream said: " + entry["text"]), is_error=True)
    if name == "fail_long":
        return types.CallToolResult(content=text(entry["long"]), is_error=True)
    if name == "fail_rpc":
        raise MCPError(code=types.INTERNAL_ERROR, message="backend failed: " + entry["text"])
    raise MCPError(code=types.INVALID_REQUEST, message=entry["long"])


SERVER = Server("canaries", version="1", on_list_tools=list_tools, on_call_tool=call_tool)


async def main():
    async with stdio_server() as (read_stream, write_stream):
        await SERVER.run(read_stream, write_stream, SERVER.create_initialization_options())


anyio.run(main)
"""


def straddling(canary: Canary, cut: int = 200) -> str:
    """Text whose secret straddles the MCP source's 200-character cap: the first 12 random
    characters fall before it."""
    text = " ".join(canary.text.split())  # the cap collapses whitespace first
    where = text.index(canary.random)
    return "x" * (cut - 1 - 12 - where - 1) + " " + text


async def test_mcp_error_text_reaches_no_sink(
    sinks: Sinks, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """One canary server (a process) for both settings of ``capture_content``: each setting
    has its own dispatcher and sinks, and both must stay clean."""
    pytest.importorskip("mcp", reason="needs the MCP SDK: pip install 'toolrelay[mcp]'")
    from toolrelay.sources.mcp import McpSource, McpSourceOptions

    script = tmp_path / "canary_server.py"
    script.write_text(MCP_SERVER, encoding="utf-8")
    texts = tmp_path / "texts.json"
    texts.write_text(json.dumps([{"text": c.text, "long": straddling(c)} for c in CANARIES]))
    captured = Sinks(caplog)  # capture_content=True; ``sinks`` has it off
    errlog = (tmp_path / "server.log").open("a")
    try:
        source = McpSource.stdio(
            [sys.executable, str(script), str(texts)],
            McpSourceOptions(breaker_key="mcp"),
            errlog=errlog,
        )
        async with source:
            for case in (sinks, captured):
                capture_content = case is captured
                registry = ToolRegistry()
                registry.register(source)
                dispatcher = case.dispatcher(registry, capture_content=capture_content)
                for index in range(len(CANARIES)):
                    for name in ("fail_text", "fail_long", "fail_rpc", "fail_rpc_long"):
                        result = await case.call(dispatcher, name, {"i": index})
                        assert result.error_type is ErrorType.TOOL_ERROR, (capture_content, result)
                        assert len(result.message) <= 240, (capture_content, result.message)
    finally:
        errlog.close()
    try:
        for case in (sinks, captured):
            assert case.leaks() == {}, f"capture_content={case is captured}"
            case.assert_clean()
    finally:
        captured.provider.shutdown()


# -- an HTTP upstream's error body -----------------------------------------------------------
class _Upstream(BaseHTTPRequestHandler):
    """Answers ``GET /<status>/…`` with that status, secrets in the body and the headers."""

    def do_GET(self) -> None:
        status = int(self.path.split("/")[1])
        body = json.dumps(
            {"error": EVERYTHING, "detail": [c.text for c in CANARIES], "results": "odd"}
        ).encode()
        if status == 299:  # a success that is not JSON at all
            status, body = 200, f"<html>{EVERYTHING}</html>".encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("x-debug", DEFAULT_SHAPES[7].text)
        self.send_header("www-authenticate", f'Bearer realm="{CUSTOM.secret}"')
        if 300 <= status < 400:
            self.send_header("location", f"/200/next?token={DEFAULT_SHAPES[7].secret}")
        if status in (429, 503):
            self.send_header("retry-after", "1")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: http.server writes to stderr."""


@contextmanager
def http_upstream() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@asynccontextmanager
async def weather_at(url: str) -> AsyncIterator[ToolRegistry]:
    from toolrelay_plugins.weather import WeatherPlugin

    plugin = WeatherPlugin({"base_url": url, "geocoding_url": url, "trust_env": False})
    registry = ToolRegistry()
    registry.register(plugin)
    try:
        yield registry
    finally:
        await plugin.aclose()


STATUSES = (299, 200, 301, 400, 401, 403, 404, 429, 500, 502, 503)


@pytest.mark.parametrize("capture_content", [False, True])
async def test_http_error_bodies_reach_no_sink(sinks: Sinks, capture_content: bool) -> None:
    with http_upstream() as url:
        for status in STATUSES:
            async with weather_at(f"{url}/{status}") as registry:
                dispatcher = sinks.dispatcher(
                    registry,
                    capture_content=capture_content,
                    keys={
                        "open-meteo": KeyPolicy(
                            breaker=BreakerOptions(fail_max=10_000),
                            retry=RetryOptions(max_attempts=1),
                        )
                    },
                )
                result = await sinks.call(dispatcher, "weather_current", {"city": "Oslo"})
                assert not result.ok and result.error_type is ErrorType.TOOL_ERROR, result
    # httpcore's own DEBUG trace logs every response header as received (not toolrelay's
    # doing: keep ``httpcore`` above DEBUG in production). Nothing else carries a canary.
    trace = [r for r in sinks.caplog.records if r.name.startswith("httpcore")]
    assert all(r.levelno == logging.DEBUG for r in trace)
    sinks.assert_clean(skip_loggers=["httpcore."])


# -- the patterns themselves -----------------------------------------------------------------
@pytest.mark.parametrize("canary", DEFAULT_SHAPES, ids=lambda c: c.shape)
def test_default_patterns_mask_each_shape(canary: Canary) -> None:
    masked = Redactor()(canary.text)
    assert not canary.seen_in(masked), masked
    assert "***" in masked


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ('{"api_key": "abc123"}', '{"api_key": "***"}'),
        ("password: hunter2", "password: ***"),
        ("Authorization: Bearer\tabcdef012345", "Authorization: Bearer\t***"),
        ("https://bob:hunter2@example.org/x", "https://***@example.org/x"),
        ("Authorization: Token 0123456789abcdef", "Authorization: Token ***"),
        ('{"Authorization": "Token abc123"}', '{"Authorization": "Token ***"}'),
        ("authorization=abc123&x=1", "authorization=***&x=1"),
        ("Cookie: session=abc123; theme=dark\nnext", "Cookie: ***\nnext"),
        ("next=%2Fx%3Fapi_key%3Dabc123 then", "next=%2Fx%3Fapi_key%3D*** then"),
        ("the token refresh failed: authorization required, cookie jar empty", None),
        ("max_tokens: 512, tokenizer=cl100k, token_type: bearer", None),
        ("the request failed (HTTP 401)", None),
    ],
)
def test_default_patterns_keep_the_key_and_spare_the_rest(text: str, kept: str | None) -> None:
    assert Redactor()(text) == (text if kept is None else kept)


@pytest.mark.parametrize(
    "text",
    [
        "password" * 20_000,
        "password:" + " " * 100_000,
        "Bearer" + "\t" * 100_000,
        '"api_key"' + '"' * 100_000,
        "token=" * 20_000,
        "authorization:" + " " * 100_000,
        "Authorization: " + "Token " * 20_000,
        "cookie: " * 20_000,
        "api_key%3D" * 20_000,
        "://" + "a:" * 50_000,
        "a-" * 100_000,
        "x" * 200_000,
    ],
    ids=lambda t: repr(t[:12]),
)
def test_redaction_is_linear_on_hostile_text(text: str) -> None:
    redact = Redactor([CUSTOM_PATTERN])
    # this thread's CPU time: what a quadratic pattern would spend (wall time also counts
    # the time a loaded machine gives other processes)
    started = time.thread_time()
    redact(text)
    assert time.thread_time() - started < 0.5


def test_structured_values_are_masked_by_key_and_by_text() -> None:
    redact = Redactor([CUSTOM_PATTERN])
    masker = getattr(redact, "value", None)
    assert masker is not None, "Redactor.value() redacts arguments and results"
    original: Mapping[str, Any] = secret_arguments()
    before = json.dumps(original)
    masked = json.dumps(masker(original))
    assert json.dumps(original) == before  # the handler's arguments are never changed
    assert not any(c.seen_in(masked) for c in CANARIES), masked
    assert masker({"max_tokens": 5, "tokens": [1], "q": "hi"}) == {
        "max_tokens": 5,
        "tokens": [1],
        "q": "hi",
    }
