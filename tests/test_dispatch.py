"""The dispatch pipeline through the public API: every stage, every error type."""

from __future__ import annotations

import datetime
import decimal
import enum
import json
import threading
import uuid
from typing import Any

import anyio
import pydantic
import pytest

from helpers import CITY, OBJ, MutablePlugin, SyncPlugin, wait_until
from toolrelay import (
    AuthContext,
    Dispatcher,
    DispatcherOptions,
    ErrorType,
    KeyPolicy,
    Limits,
    ModelSlot,
    Profile,
    RegistrationError,
    RetryOptions,
    ToolCall,
    ToolDeclaration,
    ToolError,
    ToolRegistry,
    ToolResult,
)
from toolrelay.testing import ScriptedPlugin, hang

pytestmark = pytest.mark.anyio
CTX = AuthContext(user_id="u1", tenant_id="t1", roles=frozenset({"support"}))


def weather_registry(calls: list[dict[str, Any]] | None = None) -> ToolRegistry:
    registry = ToolRegistry()

    @registry.tool(
        name="get_weather",
        description="Current weather for a city.",
        parameters=CITY,
        risk="read",
        timeout_s=2.0,
        breaker_key="open-meteo",
        tags={"weather"},
    )
    async def get_weather(args: dict[str, Any], ctx: AuthContext) -> dict[str, Any]:
        if calls is not None:
            calls.append(args)
        return {"city": args["city"], "temperature_c": 3.5, "user": ctx.user_id}

    return registry


# -- the answer envelope -------------------------------------------------------------------
async def test_success_envelope_and_host_fields() -> None:
    dispatcher = Dispatcher(weather_registry())
    result = await dispatcher.dispatch("get_weather", '{"city": "Oslo"}', CTX, call_id="call_1")
    assert isinstance(result, ToolResult)
    assert result.to_model() == {
        "ok": True,
        "data": {"city": "Oslo", "temperature_c": 3.5, "user": "u1"},
    }
    assert (result.tool, result.call_id, result.breaker_key) == (
        "get_weather",
        "call_1",
        "open-meteo",
    )
    assert result.attempts == 1
    assert result.duration_s >= 0


async def test_failure_envelope_is_json_with_stable_keys() -> None:
    result = await Dispatcher(weather_registry()).dispatch("nope", "{}", CTX)
    answer = result.to_model()
    assert set(answer) == {"ok", "error_type", "message", "retryable"}
    assert answer["ok"] is False and answer["error_type"] == "unknown_tool"
    json.dumps(answer)  # must serialise


# -- decode ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ('{"city": ', "not valid JSON"),
        ('{"city": NaN}', "NaN"),
        ('{"city": Infinity}', "Infinity"),
        ('{"city": -Infinity}', "Infinity"),
        ('{"city": 1e999}', "out of range"),
        ("[1, 2]", "not an array"),
        ('"Oslo"', "not a string"),
        ("3", "not a number"),
        ("null", "not null"),
        ('{"city": "a", "city": "b"}', "appears twice"),
        (b"\xff\xfe{}", "UTF-8"),
        ("1" * 5000, "not valid JSON"),
        (12, "not int"),
    ],
)
async def test_bad_arguments_are_invalid_arguments(raw: Any, needle: str) -> None:
    calls: list[dict[str, Any]] = []
    result = await Dispatcher(weather_registry(calls)).dispatch("get_weather", raw, CTX)
    assert result.error_type is ErrorType.INVALID_ARGUMENTS
    assert needle in result.message
    assert result.retryable is False
    assert calls == []


async def test_oversize_and_overdeep_arguments() -> None:
    dispatcher = Dispatcher(weather_registry())
    big = json.dumps({"city": "x" * (256 * 1024)})
    assert (await dispatcher.dispatch("get_weather", big)).message.startswith(
        "arguments are larger than"
    )
    multibyte = json.dumps({"city": "é" * 100_000}, ensure_ascii=False)  # 200 KB of text
    assert (await dispatcher.dispatch("get_weather", multibyte)).error_type is (
        ErrorType.VALIDATION_ERROR  # fits the size cap, fails maxLength
    )
    deep = '{"city": ' + "[" * 65 + "]" * 65 + "}"
    assert "nested deeper than 64" in (await dispatcher.dispatch("get_weather", deep)).message
    very_deep = '{"a": ' + "[" * 200_000 + "]" * 200_000 + "}"
    result = await dispatcher.dispatch("get_weather", very_deep.encode())
    assert result.error_type is ErrorType.INVALID_ARGUMENTS  # no RecursionError escapes


async def test_limits_are_configurable() -> None:
    dispatcher = Dispatcher(
        weather_registry(),
        DispatcherOptions(limits=Limits(max_argument_bytes=20, max_argument_depth=2)),
    )
    assert (await dispatcher.dispatch("get_weather", '{"city": "Oslo"}')).ok
    assert not (await dispatcher.dispatch("get_weather", '{"city": "Oslo, Norway, Europe"}')).ok
    nested = {"city": "x", "more": {"a": [1]}}
    deep = Dispatcher(
        weather_registry(),
        DispatcherOptions(limits=Limits(max_argument_bytes=100, max_argument_depth=2)),
    )
    result = await deep.dispatch("get_weather", nested)
    assert "nested deeper than 2" in result.message


async def test_mapping_arguments_have_the_same_byte_cap_as_text() -> None:
    """A host (or the MCP gateway) passing a dict gets the same 256 KiB cap as JSON text."""
    dispatcher = Dispatcher(weather_registry())
    huge = {"city": "x" * (5 * 1024 * 1024)}
    refused = await dispatcher.dispatch("get_weather", huge)
    assert refused.error_type is ErrorType.INVALID_ARGUMENTS
    assert "larger than 262144 bytes" in refused.message
    many = {"city": "Oslo", "tags": ["abcdefgh"] * 40_000}  # ~440 KB as JSON, small strings
    assert "larger than" in (await dispatcher.dispatch("get_weather", many)).message
    small = Dispatcher(weather_registry(), DispatcherOptions(limits=Limits(max_argument_bytes=40)))
    assert (await small.dispatch("get_weather", {"city": "Oslo"})).ok
    # counted in UTF-8 bytes, like text: 12 characters of 4 bytes each are 48 bytes
    wide = await small.dispatch("get_weather", {"city": "😀" * 12})
    assert "larger than 40 bytes" in wide.message
    text = await small.dispatch("get_weather", '{"city": "' + "😀" * 12 + '"}')
    assert "larger than 40 bytes" in text.message


async def test_accepted_argument_forms() -> None:
    calls: list[dict[str, Any]] = []
    dispatcher = Dispatcher(weather_registry(calls))
    assert (await dispatcher.dispatch("get_weather", b'{"city": "Oslo"}')).ok
    assert (await dispatcher.dispatch("get_weather", {"city": "Bergen"})).ok
    assert calls == [{"city": "Oslo"}, {"city": "Bergen"}]
    registry = ToolRegistry()

    @registry.tool(name="ping", parameters=OBJ)
    async def ping(args: dict[str, Any], ctx: AuthContext) -> str:
        return "pong"

    for empty in ("", "  ", None):
        assert (await Dispatcher(registry).dispatch("ping", empty)).data == "pong"


# -- resolve and policy ----------------------------------------------------------------------
def policy_registry() -> tuple[ToolRegistry, MutablePlugin]:
    registry = ToolRegistry()
    plugin = MutablePlugin(
        [
            ToolDeclaration("read_doc", "Read a doc.", OBJ, tags=frozenset({"docs"})),
            ToolDeclaration("edit_doc", "Edit a doc.", OBJ, risk="write", tags=frozenset({"docs"})),
            ToolDeclaration("drop_db", "Drop it.", OBJ, risk="dangerous"),
            ToolDeclaration("search", "Search.", OBJ, tags=frozenset({"web"})),
        ]
    )
    registry.register(plugin)
    return registry, plugin


PROFILES = {
    "by_name": Profile(allow={"read_doc", "search"}),
    "by_tag": Profile(allow_tags={"docs"}, require_approval=()),
    "deny": Profile(deny={"search"}, deny_tags={"docs"}),
    "readonly": Profile(max_risk="read"),
    "writer": Profile(max_risk="write", require_approval=()),
}


@pytest.mark.parametrize(
    ("profile", "callable_tools"),
    [
        ("by_name", {"read_doc", "search"}),
        ("by_tag", {"read_doc", "edit_doc"}),
        ("deny", {"drop_db"}),
        ("readonly", {"read_doc", "search"}),
        ("writer", {"read_doc", "edit_doc", "search"}),
        ("nobody-defined-this", set()),
        (None, {"read_doc", "edit_doc", "drop_db", "search"}),
    ],
)
async def test_profiles_and_specs_agree(profile: str | None, callable_tools: set[str]) -> None:
    registry, _ = policy_registry()
    dispatcher = Dispatcher(registry, DispatcherOptions(profiles=PROFILES))
    listed = {spec["function"]["name"] for spec in dispatcher.specs(profile)}
    assert listed == callable_tools
    for name in ("read_doc", "edit_doc", "drop_db", "search"):
        result = await dispatcher.dispatch(name, "{}", CTX, profile=profile)
        if name in callable_tools:
            assert result.error_type is not ErrorType.TOOL_POLICY
        else:
            assert result.error_type is ErrorType.TOOL_POLICY, (profile, name)
    unknown = await dispatcher.dispatch("no_such_tool", "{}", CTX, profile=profile)
    assert unknown.error_type is ErrorType.UNKNOWN_TOOL


async def test_model_supplied_names_are_sanitised_in_messages() -> None:
    dispatcher = Dispatcher(weather_registry())
    result = await dispatcher.dispatch("x\n" * 500, "{}")
    assert result.error_type is ErrorType.UNKNOWN_TOOL
    assert "\n" not in result.message and len(result.message) < 140
    weird = await dispatcher.dispatch(12345, "{}")  # type: ignore[arg-type]
    assert weird.error_type is ErrorType.UNKNOWN_TOOL


# -- validation ------------------------------------------------------------------------------
async def test_validation_error_names_paths_and_never_calls_handler() -> None:
    calls: list[dict[str, Any]] = []
    dispatcher = Dispatcher(weather_registry(calls))
    result = await dispatcher.dispatch("get_weather", {"city": "x" * 41, "extra": 1})
    assert result.error_type is ErrorType.VALIDATION_ERROR
    assert "/city" in result.message and "extra" in result.message
    assert "x" * 41 not in result.message  # the offending value is masked
    assert len(result.message) <= 240
    assert calls == []


async def test_validator_compiled_once_per_declaration_content() -> None:
    registry, plugin = policy_registry()
    first = registry.resolve("read_doc")
    assert first is not None
    again = registry.resolve("read_doc")
    assert again is first  # same compiled validator, no recompilation
    plugin.decls[0] = ToolDeclaration("read_doc", "Read a doc.", OBJ, tags=frozenset({"docs"}))
    assert registry.resolve("read_doc") is first  # equal content: still cached
    changed = dict(OBJ, properties={"id": {"type": "integer"}})
    plugin.decls[0] = ToolDeclaration("read_doc", "Read a doc.", changed)
    recompiled = registry.resolve("read_doc")
    assert recompiled is not None and recompiled is not first
    assert not recompiled.validator.is_valid({"id": "x"})


def test_invalid_schema_refused_at_register() -> None:
    registry = ToolRegistry()
    bad = MutablePlugin([ToolDeclaration("t", "", {"type": "object", "properties": 3})])
    with pytest.raises(RegistrationError, match="not a valid JSON Schema"):
        registry.register(bad)
    with pytest.raises(RegistrationError, match="object schema"):
        registry.register(MutablePlugin([ToolDeclaration("t", "", {"type": "string"})]))
    bad_out = ToolDeclaration("t", "", OBJ, output_schema={"type": "nope"})
    with pytest.raises(RegistrationError, match="output_schema"):
        registry.register(MutablePlugin([bad_out]))
    assert len(registry) == 0


def test_remote_ref_is_never_fetched() -> None:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    hits: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            body = b'{"type": "string"}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/schema.json"
        schema = {"type": "object", "properties": {"x": {"$ref": url}}}
        with pytest.raises(RegistrationError):
            ToolRegistry().register(MutablePlugin([ToolDeclaration("t", "", schema)]))
        assert hits == []
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"user_id": {"type": "string"}}},
        {
            "type": "object",
            "properties": {"q": {"type": "object", "properties": {"tenant_id": {}}}},
        },
    ],
)
def test_identity_properties_refused(schema: dict[str, Any]) -> None:
    with pytest.raises(RegistrationError, match="identity"):
        ToolRegistry().register(MutablePlugin([ToolDeclaration("t", "", schema)]))


def test_reserved_properties_are_configurable() -> None:
    schema = {"type": "object", "properties": {"account": {"type": "string"}, "user_id": {}}}
    registry = ToolRegistry(reserved_properties={"account"})
    with pytest.raises(RegistrationError, match="account"):
        registry.register(MutablePlugin([ToolDeclaration("t", "", schema)]))


def test_registration_errors() -> None:
    registry = ToolRegistry()
    registry.register(MutablePlugin([ToolDeclaration("a", "", OBJ)]))
    with pytest.raises(RegistrationError, match="twice"):
        registry.register(MutablePlugin([ToolDeclaration("a", "", OBJ)]))
    with pytest.raises(RegistrationError, match="twice"):
        registry.register(
            MutablePlugin([ToolDeclaration("b", "", OBJ), ToolDeclaration("b", "", OBJ)])
        )
    with pytest.raises(RegistrationError, match="twice"):

        @registry.tool(name="a")
        def again(args: dict[str, Any], ctx: AuthContext) -> None:
            return None

    with pytest.raises(RegistrationError, match="must match"):
        registry.register(MutablePlugin([ToolDeclaration("has space", "", OBJ)]))
    with pytest.raises(RegistrationError, match="timeout_s"):
        registry.register(MutablePlugin([ToolDeclaration("c", "", OBJ, timeout_s=0)]))
    with pytest.raises(RegistrationError, match="not a plugin"):
        registry.register(object())  # type: ignore[arg-type]
    assert [d.name for d in registry.declarations()] == ["a"]


# -- declarations read per invocation ----------------------------------------------------
async def test_plugin_changes_are_seen_without_restart() -> None:
    registry = ToolRegistry()
    plugin = MutablePlugin([ToolDeclaration("alpha", "First.", OBJ)])
    registry.register(plugin)
    dispatcher = Dispatcher(registry)
    assert [s["name"] for s in dispatcher.specs(format="mcp")] == ["alpha"]

    plugin.decls = [
        ToolDeclaration("alpha", "First, reconfigured.", CITY),
        ToolDeclaration("beta", "Second.", OBJ),
    ]
    specs = {s["name"]: s for s in dispatcher.specs(format="mcp")}
    assert set(specs) == {"alpha", "beta"}
    assert specs["alpha"]["description"] == "First, reconfigured."
    assert (await dispatcher.dispatch("alpha", "{}")).error_type is ErrorType.VALIDATION_ERROR
    assert (await dispatcher.dispatch("beta", "{}")).ok

    plugin.decls = [ToolDeclaration("beta", "Second.", OBJ)]
    assert (await dispatcher.dispatch("alpha", '{"city": "x"}')).error_type is (
        ErrorType.UNKNOWN_TOOL
    )
    assert [s["name"] for s in dispatcher.specs(format="mcp")] == ["beta"]

    # A declaration changed into an invalid one is refused at call time, never run.
    plugin.decls = [ToolDeclaration("beta", "Second.", {"type": "object", "properties": 1})]
    broken = await dispatcher.dispatch("beta", "{}")
    assert broken.error_type is ErrorType.INTERNAL_ERROR
    assert dispatcher.specs() == []
    assert [c[0] for c in plugin.calls] == ["beta"]


async def test_unregister() -> None:
    registry = ToolRegistry()
    plugin = MutablePlugin([ToolDeclaration("alpha", "First.", OBJ)])
    registry.register(plugin)
    registry.unregister(plugin)
    assert (await Dispatcher(registry).dispatch("alpha", "{}")).error_type is (
        ErrorType.UNKNOWN_TOOL
    )


# -- approval --------------------------------------------------------------------------------
async def test_risky_tools_need_approval_without_approver() -> None:
    registry, plugin = policy_registry()
    dispatcher = Dispatcher(registry)
    for name in ("edit_doc", "drop_db"):
        result = await dispatcher.dispatch(name, "{}", CTX)
        assert result.error_type is ErrorType.NEEDS_APPROVAL
        assert name in result.message
    assert (await dispatcher.dispatch("read_doc", "{}", CTX)).ok
    assert [c[0] for c in plugin.calls] == ["read_doc"]


async def test_approver_decides() -> None:
    registry, plugin = policy_registry()
    seen: list[tuple[ToolCall, ToolDeclaration, AuthContext]] = []

    async def approver(call: ToolCall, decl: ToolDeclaration, ctx: AuthContext) -> bool:
        seen.append((call, decl, ctx))
        return decl.risk == "write"

    dispatcher = Dispatcher(registry, approver=approver)
    assert (await dispatcher.dispatch("edit_doc", "{}", CTX, call_id="c9")).ok
    denied = await dispatcher.dispatch("drop_db", "{}", CTX)
    assert denied.error_type is ErrorType.DENIED
    assert [c[0] for c in plugin.calls] == ["edit_doc"]
    call, decl, ctx = seen[0]
    assert (call.name, call.arguments, call.call_id, decl.risk, ctx) == (
        "edit_doc",
        {},
        "c9",
        "write",
        CTX,
    )


async def test_failing_approver_denies() -> None:
    registry, plugin = policy_registry()

    def approver(call: ToolCall, decl: ToolDeclaration, ctx: AuthContext) -> bool:
        raise RuntimeError("approval service down")

    result = await Dispatcher(registry, approver=approver).dispatch("edit_doc", "{}")
    assert result.error_type is ErrorType.DENIED
    assert "RuntimeError" not in result.message and plugin.calls == []


async def test_profile_can_waive_approval() -> None:
    registry, _ = policy_registry()
    dispatcher = Dispatcher(registry, DispatcherOptions(profiles=PROFILES))
    assert (await dispatcher.dispatch("edit_doc", "{}", profile="writer")).ok


async def test_slow_approver_is_bounded_by_the_slot() -> None:
    registry, plugin = policy_registry()

    async def approver(call: ToolCall, decl: ToolDeclaration, ctx: AuthContext) -> bool:
        await anyio.sleep(30)
        return True

    dispatcher = Dispatcher(registry, approver=approver)
    async with ModelSlot(budget_s=0.1).hold() as slot:
        result = await dispatcher.dispatch("edit_doc", "{}", slot=slot)
    assert result.error_type is ErrorType.TIMEOUT and plugin.calls == []


# -- deadlines -------------------------------------------------------------------------------
async def test_async_handler_cancelled_at_deadline_and_finally_runs() -> None:
    registry = ToolRegistry()
    cleaned = anyio.Event()

    @registry.tool(name="hang", parameters=OBJ, timeout_s=0.1)
    async def hang(args: dict[str, Any], ctx: AuthContext) -> None:
        try:
            await anyio.sleep(60)
        finally:
            cleaned.set()

    start = anyio.current_time()
    result = await Dispatcher(registry).dispatch("hang", "{}")
    elapsed = anyio.current_time() - start
    assert result.error_type is ErrorType.TIMEOUT and result.retryable
    assert "hang" in result.message and "0.1 s" in result.message
    assert cleaned.is_set()
    assert 0.1 <= elapsed < 5  # a sanity bound, not a speed check (see bench/)


async def test_sync_handler_abandoned_without_blocking_the_loop() -> None:
    registry = ToolRegistry()
    release, entered = threading.Event(), threading.Event()

    # The deadline leaves a loaded machine time to start the thread: a job whose thread
    # starts after its deadline is skipped, not abandoned.
    @registry.tool(name="block", parameters=OBJ, timeout_s=0.5, breaker_key="legacy")
    def block(args: dict[str, Any], ctx: AuthContext) -> str:
        entered.set()
        release.wait(30)
        return "late"

    dispatcher = Dispatcher(registry)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await anyio.sleep(0.01)
            ticks += entered.is_set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        result = await dispatcher.dispatch("block", "{}")
        tg.cancel_scope.cancel()
    assert result.error_type is ErrorType.TIMEOUT
    # the event loop kept running while the thread blocked (a blocked loop ticks 0 times)
    assert entered.is_set() and ticks >= 1
    assert dispatcher.workers.abandoned() == {"legacy": 1}
    release.set()
    await wait_until(lambda: not dispatcher.workers.live()["legacy"])
    assert dispatcher.workers.abandoned() == {"legacy": 0}


async def test_sync_handler_success_and_errors() -> None:
    registry = ToolRegistry()
    plugin = SyncPlugin([ToolDeclaration("s", "", OBJ)])
    registry.register(plugin)

    @registry.tool(name="boom", parameters=OBJ)
    def boom(args: dict[str, Any], ctx: AuthContext) -> None:
        raise ToolError("no such order", error_type="tool_error")

    dispatcher = Dispatcher(registry)
    result = await dispatcher.dispatch("s", "{}")
    assert result.to_model() == {"ok": True, "data": {"tool": "s", "sync": True}}
    failed = await dispatcher.dispatch("boom", "{}")
    assert (failed.error_type, failed.message) == (ErrorType.TOOL_ERROR, "no such order")


async def test_slot_budget_caps_the_deadline() -> None:
    registry = ToolRegistry()
    plugin = ScriptedPlugin()
    plugin.script("slow", hang(), parameters=OBJ, timeout_s=30)
    registry.register(plugin)

    dispatcher = Dispatcher(registry)
    slot = ModelSlot(budget_s=0.15)
    async with slot.hold() as lease:
        result = await dispatcher.dispatch("slow", "{}", slot=lease)
        assert result.error_type is ErrorType.TIMEOUT
        assert "time budget" in result.message
        assert lease.elapsed() < 5
        spent = await dispatcher.dispatch("slow", "{}", slot=lease)
        assert spent.error_type is ErrorType.TIMEOUT and "spent" in spent.message


async def test_model_slot_has_capacity_one() -> None:
    slot = ModelSlot(budget_s=5)
    order: list[str] = []
    first_in = anyio.Event()

    async def first() -> None:
        async with slot.hold():
            order.append("first-in")
            first_in.set()
            await anyio.sleep(0.05)
            order.append("first-out")

    async def second() -> None:
        await first_in.wait()
        async with slot.hold():
            order.append("second-in")

    async with anyio.create_task_group() as tg:
        tg.start_soon(first)
        tg.start_soon(second)
    assert order == ["first-in", "first-out", "second-in"]


# -- errors are answers ----------------------------------------------------------------------
async def test_handler_exception_is_a_short_tool_error() -> None:
    registry = ToolRegistry()

    @registry.tool(name="crash", parameters=OBJ)
    async def crash(args: dict[str, Any], ctx: AuthContext) -> None:
        raise KeyError("secret internal detail " * 50)

    result = await Dispatcher(registry).dispatch("crash", "{}")
    assert result.error_type is ErrorType.TOOL_ERROR
    assert result.message == "crash failed unexpectedly (KeyError)"
    assert "Traceback" not in json.dumps(result.to_model())


async def test_tool_error_is_precise_and_capped() -> None:
    registry = ToolRegistry()

    @registry.tool(name="lookup", parameters=OBJ)
    async def lookup(args: dict[str, Any], ctx: AuthContext) -> None:
        raise ToolError("upstream busy\n" + "x" * 1000, retryable=True, retry_after_s=2.5)

    result = await Dispatcher(registry, DispatcherOptions(default_key=_no_retry())).dispatch(
        "lookup", "{}"
    )
    answer = result.to_model()
    assert answer["error_type"] == "tool_error" and answer["retryable"] is True
    assert answer["retry_after_s"] == 2.5
    assert len(answer["message"]) <= 240 and "\n" not in answer["message"]


def _no_retry() -> Any:

    return KeyPolicy(retry=RetryOptions(max_attempts=1))


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ({"x": [1, {"y": object()}]}, "a non-JSON value at /x/1/y (object)"),
        ({"x": float("nan")}, "not finite"),
        (object(), "a non-JSON value (object)"),
    ],
)
async def test_non_json_output_is_invalid_output(value: Any, needle: str) -> None:
    registry = ToolRegistry()

    @registry.tool(name="odd", parameters=OBJ)
    async def odd(args: dict[str, Any], ctx: AuthContext) -> Any:
        return value

    result = await Dispatcher(registry).dispatch("odd", "{}")
    assert result.error_type is ErrorType.INVALID_OUTPUT
    assert needle in result.message


class _Mood(enum.Enum):
    CALM = "calm"


class _Reading(pydantic.BaseModel):
    at: datetime.datetime


async def test_nested_values_pydantic_can_serialise_come_back_as_json() -> None:
    """A dict holding a date, UUID, Decimal, Enum, set or model is converted as a bare one
    is (pydantic's JSON mode), for an ``(args, ctx)`` handler as for a typed one."""
    when = datetime.datetime(2026, 12, 3, 10, 0, tzinfo=datetime.UTC)
    value = {
        "day": when.date(), "id": uuid.UUID(int=1), "price": decimal.Decimal("1.50"),
        "mood": _Mood.CALM, "tags": {"a"}, "readings": [_Reading(at=when)],
    }  # fmt: skip
    registry = ToolRegistry()
    registry.tool(name="raw", parameters=OBJ)(lambda args, ctx: value)

    @registry.tool()
    async def typed() -> dict[str, Any]:
        return value

    dispatcher = Dispatcher(registry)
    for name in ("raw", "typed"):
        result = await dispatcher.dispatch(name, "{}")
        assert result.ok, result.to_model()
        assert json.loads(json.dumps(result.to_model()))["data"] == {
            "day": "2026-12-03", "id": "00000000-0000-0000-0000-000000000001",
            "price": "1.50", "mood": "calm", "tags": ["a"],
            "readings": [{"at": "2026-12-03T10:00:00Z"}],
        }  # fmt: skip


async def test_circular_output_is_invalid_output() -> None:
    registry = ToolRegistry()
    loop: dict[str, Any] = {}
    loop["self"] = loop

    @registry.tool(name="loop", parameters=OBJ)
    async def loop_tool(args: dict[str, Any], ctx: AuthContext) -> Any:
        return loop

    result = await Dispatcher(registry).dispatch("loop", "{}")
    assert result.error_type is ErrorType.INVALID_OUTPUT and "circular" in result.message


async def test_output_schema_is_enforced() -> None:
    registry = ToolRegistry()
    out_schema = {"type": "object", "required": ["temp"]}

    @registry.tool(name="t", parameters=OBJ, output_schema=out_schema)
    async def t(args: dict[str, Any], ctx: AuthContext) -> Any:
        return {"temperature": 3}

    result = await Dispatcher(registry).dispatch("t", "{}")
    assert result.error_type is ErrorType.INVALID_OUTPUT and "temp" in result.message


async def test_oversized_output_refused_or_truncated_with_marker() -> None:
    registry = ToolRegistry()

    @registry.tool(name="big", parameters=OBJ)
    async def big(args: dict[str, Any], ctx: AuthContext) -> Any:
        return {"text": "y" * 5000}

    refused = await Dispatcher(
        registry, DispatcherOptions(limits=Limits(max_output_bytes=1000))
    ).dispatch("big", "{}")
    assert refused.error_type is ErrorType.INVALID_OUTPUT and "1000-byte cap" in refused.message
    cut = await Dispatcher(
        registry, DispatcherOptions(limits=Limits(max_output_bytes=1000, truncate_output=True))
    ).dispatch("big", "{}")
    assert cut.ok and cut.data["truncated"] is True and cut.data["original_bytes"] > 5000
    assert cut.data["text"].endswith("[truncated by toolrelay]")
    assert len(json.dumps(cut.to_model())) <= 1100


# -- cancellation ------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_host_cancellation_propagates(kind: str) -> None:
    registry = ToolRegistry()
    started = anyio.Event()
    release, entered = threading.Event(), threading.Event()

    if kind == "async":

        @registry.tool(name="wait", parameters=OBJ, timeout_s=30)
        async def wait_async(args: dict[str, Any], ctx: AuthContext) -> None:
            started.set()
            await anyio.sleep(60)

    else:

        @registry.tool(name="wait", parameters=OBJ, timeout_s=30)
        def wait_sync(args: dict[str, Any], ctx: AuthContext) -> None:
            entered.set()
            release.wait(30)

    dispatcher = Dispatcher(registry)
    results: list[ToolResult] = []
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:

            async def run() -> None:
                results.append(await dispatcher.dispatch("wait", "{}"))

            tg.start_soon(run)
            await wait_until(lambda: started.is_set() or entered.is_set())  # in the handler
            scope.cancel()
    release.set()
    assert scope.cancelled_caught
    assert results == []  # never turned into an answer


# -- dispatch_many -----------------------------------------------------------------------------
async def test_dispatch_many_is_concurrent_and_ordered() -> None:
    registry = ToolRegistry()
    arrived = 0
    all_in = anyio.Event()

    @registry.tool(name="meet", parameters={"type": "object"}, timeout_s=5)
    async def meet(args: dict[str, Any], ctx: AuthContext) -> Any:
        nonlocal arrived
        arrived += 1
        if arrived == 3:
            all_in.set()
        await all_in.wait()  # only returns if all three run at once
        return args["n"]

    seen: list[int] = []
    others_answered = anyio.Event()

    @registry.tool(name="last", parameters=OBJ, timeout_s=5)
    async def last(args: dict[str, Any], ctx: AuthContext) -> str:
        await others_answered.wait()  # a timeout if the others waited for this one
        return "last"

    def on_result(index: int, result: ToolResult) -> None:
        seen.append(index)
        if len(seen) == 4:
            others_answered.set()

    calls = [
        ToolCall("last", "{}", "h"),
        *(ToolCall("meet", {"n": n}, f"c{n}") for n in range(3)),
        ToolCall("missing", "{}", "m"),
    ]
    results = await Dispatcher(registry).dispatch_many(calls, CTX, on_result=on_result)
    assert [r.call_id for r in results] == ["h", "c0", "c1", "c2", "m"]
    assert [r.data for r in results[1:4]] == [0, 1, 2]
    assert results[0].data == "last"
    assert seen[-1] == 0  # the slow call was answered last; the others did not wait for it


async def test_dispatch_many_survives_a_failing_on_result(caplog: pytest.LogCaptureFixture) -> None:
    """A host callback that raises must not cancel the sibling calls."""
    registry = ToolRegistry()
    finished: list[int] = []

    @registry.tool(name="slow", parameters={"type": "object"}, timeout_s=5)
    async def slow(args: dict[str, Any], ctx: AuthContext) -> Any:
        await anyio.sleep(0.05 * args["n"])
        finished.append(args["n"])
        return args["n"]

    def on_result(index: int, result: ToolResult) -> None:
        if index == 0:
            raise RuntimeError("host bug")

    calls = [ToolCall("slow", {"n": n}, f"c{n}") for n in range(3)]
    results = await Dispatcher(registry).dispatch_many(calls, CTX, on_result=on_result)
    assert [r.data for r in results] == [0, 1, 2], results
    assert sorted(finished) == [0, 1, 2]  # (trio runs tasks woken together in any order)
    assert any("on_result raised for call 0" in r.getMessage() for r in caplog.records)


# -- formats, multiple dispatchers, public API ------------------------------------------------
def test_spec_formats() -> None:
    dispatcher = Dispatcher(weather_registry())
    (openai,) = dispatcher.specs(format="openai")
    assert openai == {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": CITY,
            "strict": True,  # closed, every property required: strict as it is
        },
    }
    (anthropic,) = dispatcher.specs(format="anthropic")
    assert anthropic["input_schema"] == CITY and anthropic["name"] == "get_weather"
    (mcp,) = dispatcher.specs(format="mcp")
    assert mcp["inputSchema"] == CITY
    assert mcp["annotations"] == {
        "readOnlyHint": True,
        "destructiveHint": False,
        "idempotentHint": True,
    }
    (responses,) = dispatcher.specs(format="openai-responses")
    assert responses["name"] == "get_weather" and responses["type"] == "function"
    with pytest.raises(ValueError, match="unknown format"):
        dispatcher.specs(format="gopher")


async def test_dispatchers_sharing_a_registry_are_independent() -> None:
    registry = weather_registry()
    one = Dispatcher(registry, DispatcherOptions(profiles={"p": Profile(allow=())}))
    two = Dispatcher(registry, DispatcherOptions(profiles={"p": Profile()}))
    assert (await one.dispatch("get_weather", '{"city": "Oslo"}', profile="p")).error_type is (
        ErrorType.TOOL_POLICY
    )
    assert (await two.dispatch("get_weather", '{"city": "Oslo"}', profile="p")).ok
    one.breakers.force_open("open-meteo")
    assert two.breakers.state("open-meteo") == "closed"


def test_public_api() -> None:
    import toolrelay

    assert toolrelay.__all__ == sorted(toolrelay.__all__)
    for name in toolrelay.__all__:
        assert getattr(toolrelay, name) is not None
    assert {"AuthContext", "Dispatcher", "ModelSlot", "Profile", "ToolCall"} <= set(
        toolrelay.__all__
    )


async def test_internal_error_never_escapes() -> None:
    registry = ToolRegistry()

    class Hostile:
        def describe(self) -> list[ToolDeclaration]:
            return [ToolDeclaration("h", "", OBJ)]

        def declaration(self, name: str) -> ToolDeclaration:
            raise RuntimeError("plugin bug")

        async def execute(self, name: str, args: dict[str, Any], ctx: AuthContext) -> None:
            return None

    registry.register(Hostile())
    result = await Dispatcher(registry).dispatch("h", "{}")
    assert result.error_type is ErrorType.INTERNAL_ERROR
    assert result.message == "toolrelay could not run this call"


def test_tool_result_is_frozen() -> None:
    result = ToolResult(True, "t", None, 1)
    with pytest.raises(AttributeError):
        result.ok = False  # type: ignore[misc]
