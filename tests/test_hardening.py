"""Issue 16: hardening of risk hints, call ids, upstream tool lists, identity schemas,
unauthenticated gateway callers and the chaos stand-in's admin endpoint."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from toolrelay import (
    AuthContext,
    Dispatcher,
    DispatcherOptions,
    Profile,
    ToolCall,
    ToolRegistry,
)
from toolrelay.config import ConfigError

pytestmark = pytest.mark.anyio

pytest.importorskip("mcp", reason="needs the MCP SDK: pip install 'toolrelay[mcp]'")
import mcp.types as mcp_types  # noqa: E402

from toolrelay.serve.settings import parse_serve_section  # noqa: E402
from toolrelay.serve.upstreams import build_source  # noqa: E402
from toolrelay.sources.mcp import McpSource, McpSourceOptions  # noqa: E402


def _no_transport() -> Any:  # pragma: no cover - these sources are never connected
    raise AssertionError("not connected in these tests")


def source(**options: Any) -> McpSource:
    return McpSource(_no_transport, McpSourceOptions(breaker_key="up", **options))


def tool(name: str, schema: dict[str, Any] | None = None, **fields: Any) -> mcp_types.Tool:
    return mcp_types.Tool(
        name=name, input_schema=schema or {"type": "object", "properties": {}}, **fields
    )


def hints(**values: bool) -> mcp_types.ToolAnnotations:
    return mcp_types.ToolAnnotations(**values)


# -- 1. risk: destructive wins, and operator floors ---------------------------------------
def test_contradictory_hints_resolve_to_dangerous() -> None:
    src = source()
    src._install(
        [
            tool("both", annotations=hints(read_only_hint=True, destructive_hint=True)),
            tool("reader", annotations=hints(read_only_hint=True, destructive_hint=False)),
            tool("plain", annotations=hints(read_only_hint=True)),
        ]
    )
    risks = {d.name: d.risk for d in src.describe()}
    assert risks == {"both": "dangerous", "reader": "read", "plain": "read"}

    registry = ToolRegistry()
    registry.register(src)
    dispatcher = Dispatcher(
        registry, DispatcherOptions(profiles={"ro": Profile(max_risk="read")}, telemetry=False)
    )
    listed = {spec["name"] for spec in dispatcher.specs("ro", format="mcp")}
    assert listed == {"reader", "plain"}  # the contradictory tool is not offered as "read"


def test_risk_floors_per_upstream_and_per_tool() -> None:
    src = source(
        prefix="gh",
        risk="write",
        tool_risk={"delete_repo": "dangerous", "gh__wipe": "dangerous", "get": "read"},
    )
    src._install(
        [
            tool("get", annotations=hints(read_only_hint=True)),
            tool("delete_repo", annotations=hints(read_only_hint=True)),
            tool("wipe", annotations=hints(read_only_hint=True)),
            tool("nuke", annotations=hints(destructive_hint=True)),
        ]
    )
    risks = {d.name: d.risk for d in src.describe()}
    assert risks == {
        "gh__get": "write",  # a per-tool "read" floor never lowers the upstream's floor
        "gh__delete_repo": "dangerous",  # by the server's name
        "gh__wipe": "dangerous",  # by toolrelay's name
        "gh__nuke": "dangerous",  # a floor never lowers the hints either
    }
    with pytest.raises(ValueError, match="risk"):
        source(risk="harmless")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tool_risk"):
        source(tool_risk={"x": "none"})  # type: ignore[dict-item]


def test_per_tool_rules_follow_renamed_tools(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 28, item 6: a floor matches its tool renamed in case or separators; an override
    (which may lower the risk) only the exact name; a tool no rule names is ``dangerous``
    (``new_tool_risk``'s default with per-tool rules), logged once and counted."""
    read = hints(read_only_hint=True)
    src = source(tool_risk={"delete_repo": "dangerous"}, tool_risk_override={"wipe": "read"})
    offered = [
        tool("Delete.Repo", annotations=read),
        tool("WIPE", annotations=read),
        tool("wipe", annotations=hints(destructive_hint=True)),
        tool("get", annotations=read),
    ]
    with caplog.at_level(logging.WARNING, "toolrelay.sources.mcp"):
        src._install(offered)
        src._install(offered)  # listed again: logged once
    assert {d.name: d.risk for d in src.describe()} == {
        "Delete_Repo": "dangerous",  # the floor, by its normalised name
        "WIPE": "dangerous",  # not the override's tool: a new one
        "wipe": "read",  # the override
        "get": "dangerous",  # a new one
    }
    assert src.new_tools == {"WIPE", "get"}
    logged = [r.getMessage() for r in caplog.records if "new_tool_risk" in r.getMessage()]
    assert len(logged) == 2 and "'get'" in " ".join(logged), logged

    relaxed = source(tool_risk={"delete_repo": "dangerous"}, new_tool_risk="write")
    relaxed._install(offered)
    risks = {d.name: d.risk for d in relaxed.describe()}
    assert risks["get"] == "write" and risks["Delete_Repo"] == "dangerous"
    assert relaxed.new_tools == {"WIPE", "wipe", "get"}
    overridden = source(risk_override="read", tool_risk_override={"wipe": "dangerous"})
    overridden._install(offered)  # risk_override does not lower a new tool's floor
    assert {d.name: d.risk for d in overridden.describe()}["get"] == "dangerous"
    no_rules = source()
    no_rules._install(offered)
    assert {d.name: d.risk for d in no_rules.describe()}["get"] == "read"
    assert no_rules.new_tools == frozenset()


def test_risk_floors_in_serve_settings() -> None:
    settings = parse_serve_section(
        {
            "upstreams": {
                "gh": {
                    "command": ["gh-mcp"],
                    "breaker_key": "gh",
                    "risk": "write",
                    "tool_risk": {"delete_repo": "dangerous"},
                }
            }
        }
    )
    (upstream,) = settings.upstreams.values()
    assert upstream.risk == "write"
    assert dict(upstream.tool_risk) == {"delete_repo": "dangerous"}
    built = build_source(upstream, {})
    assert built.options.risk == "write" and built.options.tool_risk == {"delete_repo": "dangerous"}
    for bad in ({"risk": "low"}, {"tool_risk": {"x": "low"}}):
        with pytest.raises(ConfigError, match=r"serve\.upstreams\.gh"):
            parse_serve_section(
                {"upstreams": {"gh": {"command": ["x"], "breaker_key": "gh", **bad}}}
            )


# -- 2. call ids: capped and printable at dispatch entry ----------------------------------
async def test_call_id_is_capped_and_sanitised_for_every_sink() -> None:
    registry = ToolRegistry()
    seen: list[str | None] = []

    @registry.tool(name="save", risk="write")
    def save(args: dict[str, Any], ctx: AuthContext) -> str:
        return "saved"

    def approver(call: ToolCall, decl: Any, ctx: AuthContext) -> bool:
        seen.append(call.call_id)
        return True

    audit: list[dict[str, Any]] = []
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    dispatcher = Dispatcher(
        registry,
        audit=audit.append,
        approver=approver,
        tracer_provider=provider,
        metrics_registry=CollectorRegistry(),
    )
    huge = "\x1b[31mevil\r\n" + "x" * (2 * 1024 * 1024)
    result = await dispatcher.dispatch("save", "{}", call_id=huge)
    assert result.ok
    ids = {
        "result": result.call_id,
        "audit": audit[0]["call_id"],
        "span": dict(exporter.get_finished_spans()[-1].attributes or {})["gen_ai.tool.call.id"],
        "approver": seen[0],
    }
    for where, call_id in ids.items():
        assert isinstance(call_id, str), where
        assert len(call_id) <= 128, where
        assert call_id.isprintable(), where
        assert call_id.startswith("?[31mevil??xxx"), where
    assert len(json.dumps(audit[0])) < 1024

    short = await dispatcher.dispatch("save", "{}", call_id="call_42")
    assert short.call_id == "call_42" and audit[-1]["call_id"] == "call_42"
    none = await dispatcher.dispatch("save", "{}")
    assert none.call_id is None


# -- 3. caps on upstream tool lists ---------------------------------------------------------
def nested(levels: int) -> dict[str, Any]:
    """An object schema nesting ``levels`` objects (two JSON levels each)."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def test_upstream_descriptions_and_schemas_are_capped(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="toolrelay.sources.mcp")
    big = {
        "type": "object",
        "properties": {f"p{i}": {"type": "string", "description": "d" * 100} for i in range(700)},
    }
    src = source()
    src._install(
        [
            tool("wordy", description="w" * 100_000),
            tool("fine", nested(10), description="ok"),
            tool("huge_input", big),
            tool("huge_output", output_schema=big),
            tool("deep_input", nested(20)),
            tool("deep_output", output_schema=nested(20)),
        ]
    )
    decls = {d.name: d for d in src.describe()}
    assert set(decls) == {"wordy", "fine"}
    assert len(decls["wordy"].description) == 2000
    assert decls["wordy"].description.endswith("…")
    assert decls["fine"].description == "ok"
    skipped = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(skipped) == 4  # one line per skipped tool
    text = " ".join(skipped)
    for name in ("huge_input", "huge_output", "deep_input", "deep_output"):
        assert repr(name) in text
    assert "larger than 65536 bytes" in text and "deeper than 32 levels" in text
    assert len(text) < 2000  # the log lines do not quote the schemas


# -- 4. the reserved-identity check reads every way a schema admits a property -------------
def obj(**keywords: Any) -> dict[str, Any]:
    return {"type": "object", **keywords}


ADMITS_IDENTITY = {
    "properties": obj(properties={"user_id": {"type": "string"}}),
    "required": obj(required=["user_id"]),
    "required_nested": obj(
        properties={"filter": obj(required=["q", "tenant_id"], properties={"q": {}})}
    ),
    "pattern_properties": obj(patternProperties={"^user_": {"type": "string"}}),
    "pattern_properties_ecma": obj(patternProperties={"^\\p{Ll}+_id$": {}}),
    "pattern_properties_in_defs": obj(
        **{"$defs": {"who": obj(patternProperties={"_id$": {}})}},
        properties={"who": {"$ref": "#/$defs/who"}},
    ),
    "dependent_required_key": obj(dependentRequired={"user_id": ["q"]}),
    "dependent_required_value": obj(dependentRequired={"q": ["user_id"]}),
    "dependent_schemas": obj(dependentSchemas={"tenant_id": obj()}),
    "dependencies": obj(dependencies={"q": ["tenant_id"]}),
    "property_names_enum": obj(propertyNames={"enum": ["q", "user_id"]}),
    "property_names_const": obj(propertyNames={"anyOf": [{"const": "tenant_id"}]}),
    "property_names_pattern": obj(propertyNames={"pattern": "^(q|user_id)$"}),
    "in_any_of": obj(anyOf=[obj(required=["user_id"]), obj(required=["q"])]),
}

ACCEPTED = {
    "plain": obj(properties={"q": {"type": "string"}}, required=["q"]),
    "forbids": obj(properties={"q": {}, "user_id": False}),
    "forbids_by_pattern": obj(patternProperties={"_id$": False}),
    "unrelated_pattern": obj(patternProperties={"^x-": {"type": "string"}}),
    "value_pattern": obj(properties={"q": {"type": "string", "pattern": "user_id"}}),
    "property_names_length": obj(propertyNames={"maxLength": 20}),
    "dependent_required_other": obj(dependentRequired={"a": ["b"]}),
}


@pytest.mark.parametrize("case", sorted(ADMITS_IDENTITY))
def test_schemas_admitting_identity_are_refused(case: str) -> None:
    from toolrelay.registry import RegistrationError

    registry = ToolRegistry()
    with pytest.raises(RegistrationError, match="identity"):
        registry.tool(name="t", parameters=ADMITS_IDENTITY[case])(lambda args, ctx: None)


@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_schemas_not_admitting_identity_are_accepted(case: str) -> None:
    registry = ToolRegistry()
    registry.tool(name="t", parameters=ACCEPTED[case])(lambda args, ctx: None)
    assert "t" in registry


def test_upstream_tool_admitting_identity_is_skipped() -> None:
    src = source()
    src._install(
        [
            tool("ok", obj(properties={"q": {}})),
            tool("sneaky", obj(patternProperties={"^user_id$": {"type": "string"}})),
            tool("required", obj(required=["tenant_id"])),
        ]
    )
    assert [d.name for d in src.describe()] == ["ok"]


# -- 5. unauthenticated callers fail closed when client tokens are configured --------------
def test_unauthenticated_caller_gets_nothing_when_tokens_are_configured() -> None:
    import contextvars

    from mcp.server.auth.middleware.auth_context import auth_context_var
    from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
    from mcp.server.auth.provider import AccessToken

    from toolrelay.serve.callers import Callers
    from toolrelay.serve.settings import ClientSettings

    registry = ToolRegistry()
    registry.tool(name="lookup")(lambda args, ctx: "ok")
    registry.tool(name="wipe", risk="dangerous")(lambda args, ctx: "gone")
    dispatcher = Dispatcher(
        registry, DispatcherOptions(profiles={"ops": Profile()}, telemetry=False)
    )

    def as_client(client_id: str | None, callers: Callers) -> tuple[str, set[str]]:
        def run() -> tuple[str, set[str]]:
            if client_id is not None:
                token = AccessToken(token="t", client_id=client_id, scopes=[])
                auth_context_var.set(AuthenticatedUser(token))
            caller = callers.current()
            specs = dispatcher.specs(caller.profile, format="mcp")
            return caller.name, {spec["name"] for spec in specs}

        return contextvars.copy_context().run(run)

    open_server = Callers(None)  # no tokens configured: everyone is the default caller
    assert as_client(None, open_server) == ("default", {"lookup", "wipe"})

    guarded = Callers(None, [ClientSettings("ops-bot", token="secret", profile="ops")])
    assert as_client("ops-bot", guarded) == ("ops-bot", {"lookup", "wipe"})
    assert as_client(None, guarded) == ("unauthenticated", set())
    assert as_client("someone-else", guarded) == ("unauthenticated", set())
    assert guarded.default.ctx.user_id is None
    assert guarded.default.profile in {caller.profile for caller in guarded.all()}


async def test_unauthenticated_caller_cannot_call() -> None:
    from toolrelay import ErrorType
    from toolrelay.serve.callers import Callers
    from toolrelay.serve.settings import ClientSettings

    registry = ToolRegistry()
    registry.tool(name="lookup")(lambda args, ctx: "ok")
    dispatcher = Dispatcher(registry, DispatcherOptions(telemetry=False))
    caller = Callers(None, [ClientSettings("a", token="secret")]).current()
    result = await dispatcher.dispatch("lookup", "{}", caller.ctx, profile=caller.profile)
    assert not result.ok and result.error_type is not ErrorType.INTERNAL_ERROR


def test_the_unauthenticated_profile_name_is_reserved() -> None:
    from toolrelay.config import parse_config
    from toolrelay.serve.settings import ServeSection

    config = parse_config({"profiles": {"toolrelay:unauthenticated": {}}})
    with pytest.raises(ConfigError, match="reserved"):
        ServeSection().check(config)


# -- 6. the chaos stand-in's admin endpoint refuses what a web page can send ---------------
FAULT = b'{"path": "/v1/forecast", "fault": "status", "status": 503}'


async def test_chaos_admin_refuses_cross_site_requests() -> None:
    import httpx

    from toolrelay.chaos.upstream import StandInUpstream

    async with (
        StandInUpstream(host="127.0.0.1", port=0) as up,
        httpx.AsyncClient(base_url=up.url, timeout=5, trust_env=False) as client,
    ):
        here = f"127.0.0.1:{up.port}"
        refused = {
            "text/plain from a page": (
                {"content-type": "text/plain", "origin": "http://evil.example"},
                403,
            ),
            "text/plain, same origin": (
                {"content-type": "text/plain;charset=UTF-8", "origin": f"http://{here}"},
                415,
            ),
            "form, no origin": ({"content-type": "application/x-www-form-urlencoded"}, 415),
            "no content type, with origin": ({"origin": f"http://{here}"}, 415),
            "json from a foreign origin": (
                {"content-type": "application/json", "origin": "http://evil.example"},
                403,
            ),
            "json, null origin": ({"content-type": "application/json", "origin": "null"}, 403),
            "json, other loopback port": (
                {"content-type": "application/json", "origin": f"http://127.0.0.1:{up.port + 1}"},
                403,
            ),
            "dns rebinding": (
                {"content-type": "application/json", "host": f"evil.example:{up.port}"},
                403,
            ),
            "wrong port in host": (
                {"content-type": "application/json", "host": f"127.0.0.1:{up.port + 1}"},
                403,
            ),
        }
        for case, (headers, status) in refused.items():
            response = await client.post("/_admin/faults", content=FAULT, headers=headers)
            assert response.status_code == status, case
            assert up.faults == [], case
        rebound = await client.get("/_admin/faults", headers={"host": f"evil.example:{up.port}"})
        assert rebound.status_code == 403
        cleared = await client.delete("/_admin/faults", headers={"origin": "http://evil.example"})
        assert cleared.status_code == 403

        accepted = [
            {"content-type": "application/json"},
            {"content-type": "application/json; charset=utf-8", "origin": f"http://{here}"},
            {"content-type": "application/json", "host": f"localhost:{up.port}"},
            {},  # a script sending neither Content-Type nor Origin
        ]
        for headers in accepted:
            up.clear_faults()
            response = await client.post("/_admin/faults", content=FAULT, headers=headers)
            assert response.status_code == 200, headers
            assert len(up.faults) == 1
        assert (await client.get("/v1/forecast?latitude=1&longitude=1")).status_code == 503
