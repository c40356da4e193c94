"""The admin API of ``toolrelay serve``: auth, every endpoint with good and bad input, and a
property-based run of its OpenAPI document (schemathesis) that must find no 5xx and no
answer that breaks the document.

The app is driven in-process (httpx's ASGI transport), on asyncio and trio; the MCP tests
drive it over real HTTP next to a running gateway.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import hypothesis
import pytest
import schemathesis
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from starlette.routing import Route

from helpers import CITY, OBJ
from toolrelay import (
    AuthContext,
    BreakerOptions,
    Dispatcher,
    DispatcherOptions,
    KeyPolicy,
    Profile,
    ToolRegistry,
)
from toolrelay.config import ConfigError, parse_config
from toolrelay.serve.admin import MAX_BODY_BYTES, MAX_FAULTS, AdminState, admin_app

TOKEN = "admin-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def build_state(*, ready: bool = True) -> AdminState:
    registry = ToolRegistry()

    @registry.tool(name="get_weather", description="Weather.", parameters=CITY,
                   breaker_key="open-meteo", tags={"weather"})  # fmt: skip
    async def get_weather(args: dict[str, Any], ctx: AuthContext) -> dict[str, Any]:
        return {"city": args["city"], "temperature_c": 4.5}

    @registry.tool(name="web_search", description="Search.", parameters=OBJ, breaker_key="searxng")
    async def web_search(args: dict[str, Any], ctx: AuthContext) -> list[str]:
        return ["result"]

    @registry.tool(name="delete_all", description="Dangerous.", parameters=OBJ, risk="dangerous")
    def delete_all(args: dict[str, Any], ctx: AuthContext) -> str:
        return "gone"

    metrics = CollectorRegistry()
    dispatcher = Dispatcher(
        registry,
        DispatcherOptions(
            profiles={"support": Profile(allow={"get_weather"})},
            keys={"open-meteo": KeyPolicy(breaker=BreakerOptions(fail_max=2, reset_timeout_s=60))},
        ),
        metrics_registry=metrics,
        audit=None,
    )
    state = AdminState(dispatcher, metrics, TOKEN)
    if ready:
        state.set_ready(True)
    return state


@pytest.fixture
def state() -> AdminState:
    return build_state()


@pytest.fixture
async def api(state: AdminState) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=admin_app(state))
    async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
        yield client


async def call(
    api: httpx.AsyncClient, method: str, path: str, body: Any = None, **kwargs: Any
) -> httpx.Response:
    content = kwargs.pop("content", None if body is None else json.dumps(body))
    return await api.request(method, path, headers=AUTH, content=content, **kwargs)


def assert_error(response: httpx.Response, status: int, error: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error", "message"} and body["error"] == error
    assert isinstance(body["message"], str) and 0 < len(body["message"]) <= 240
    return dict(body)


# -- auth --------------------------------------------------------------------------------------
AUTHED = [
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("GET", "/breakers"),
    ("GET", "/breakers/open-meteo"),
    ("POST", "/breakers/open-meteo/open"),
    ("POST", "/breakers/open-meteo/close"),
    ("POST", "/breakers/open-meteo/reset"),
    ("GET", "/faults"),
    ("PUT", "/faults"),
    ("DELETE", "/faults"),
    ("DELETE", "/faults/1"),
    ("GET", "/tools"),
    ("GET", "/tools/{name}/drift"),
    ("POST", "/reload"),
    ("GET", "/openapi.json"),
]


@pytest.mark.anyio
@pytest.mark.parametrize(("method", "path"), AUTHED)
@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "Bearer wrong-token",
        f"Basic {TOKEN}",
        "Bearer",
        f"Bearer {TOKEN}x",
        f"bearer {TOKEN[:-1]}",
    ],
)
async def test_401_without_the_token(
    api: httpx.AsyncClient, state: AdminState, method: str, path: str, authorization: str | None
) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    response = await api.request(method, path, headers=headers, content=b"{}")
    assert_error(response, 401, "unauthorized")
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert state.dispatcher.faults.list() == {}
    assert state.dispatcher.breakers.state("open-meteo") == "closed"


@pytest.mark.anyio
async def test_the_scheme_is_case_insensitive(api: httpx.AsyncClient) -> None:
    response = await api.get("/breakers", headers={"Authorization": f"bearer {TOKEN}"})
    assert response.status_code == 200


@pytest.mark.anyio
async def test_healthz_needs_no_token(api: httpx.AsyncClient) -> None:
    response = await api.get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


# -- health ------------------------------------------------------------------------------------
@pytest.mark.anyio
async def test_readyz_follows_readiness(api: httpx.AsyncClient, state: AdminState) -> None:
    assert (await call(api, "GET", "/readyz")).json() == {"ready": True, "tools": 3}
    state.set_ready(False, "loading upstream MCP servers")
    response = await call(api, "GET", "/readyz")
    assert response.status_code == 503
    assert response.json() == {"ready": False, "reason": "loading upstream MCP servers"}


@pytest.mark.anyio
async def test_metrics_is_prometheus_text(api: httpx.AsyncClient, state: AdminState) -> None:
    await state.dispatcher.dispatch("get_weather", {"city": "Oslo"})
    response = await call(api, "GET", "/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=")
    assert 'toolrelay_tool_calls_total{outcome="ok",tool="get_weather"} 1.0' in response.text


# -- breakers ----------------------------------------------------------------------------------
@pytest.mark.anyio
async def test_breakers_lists_every_tool_key(api: httpx.AsyncClient) -> None:
    body = (await call(api, "GET", "/breakers")).json()
    assert set(body["breakers"]) == {"open-meteo", "searxng", "delete_all"}
    assert body["breakers"]["open-meteo"] == {
        "state": "closed", "failures": 0, "trials_in_flight": 0,
        "retry_after_s": None, "pinned_open": False,
        "failure_rate": None, "slow_call_rate": None, "break_s": 60.0,
    }  # fmt: skip
    one = (await call(api, "GET", "/breakers/searxng")).json()
    assert one["key"] == "searxng" and one["state"] == "closed"
    assert_error(await call(api, "GET", "/breakers/nope"), 404, "unknown_breaker")


@pytest.mark.anyio
async def test_open_close_reset(api: httpx.AsyncClient, state: AdminState) -> None:
    opened = (await call(api, "POST", "/breakers/open-meteo/open")).json()
    assert opened["state"] == "open" and opened["pinned_open"] is True
    result = await state.dispatcher.dispatch("get_weather", {"city": "Oslo"})
    assert str(result.error_type) == "circuit_open"
    listed = (await call(api, "GET", "/tools")).json()["tools"]
    assert {t["name"]: t["offered"] for t in listed}["get_weather"] is False
    closed = (await call(api, "POST", "/breakers/open-meteo/close")).json()
    assert closed["state"] == "closed" and closed["pinned_open"] is False
    await call(api, "POST", "/breakers/open-meteo/open")
    reset = (await call(api, "POST", "/breakers/open-meteo/reset")).json()
    assert reset == {"key": "open-meteo", **state.dispatcher.breakers.get("open-meteo").snapshot()}
    assert reset["state"] == "closed"
    assert (await state.dispatcher.dispatch("get_weather", {"city": "Oslo"})).ok


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("method", "path", "status", "error"),
    [
        ("POST", "/breakers/nope/open", 404, "unknown_breaker"),
        ("POST", "/breakers/open-meteo/explode", 404, "not_found"),
        ("GET", "/breakers/open-meteo/open", 405, "method_not_allowed"),
        ("PUT", "/breakers", 405, "method_not_allowed"),
        ("POST", "/faults", 405, "method_not_allowed"),
        ("GET", "/no/such/path", 404, "not_found"),
    ],
)
async def test_routing_errors_are_json(
    api: httpx.AsyncClient, method: str, path: str, status: int, error: str
) -> None:
    response = await call(api, method, path)
    assert_error(response, status, error)
    if status == 405:
        assert "allow" in response.headers


# -- faults ------------------------------------------------------------------------------------
@pytest.mark.anyio
async def test_faults_put_get_delete(api: httpx.AsyncClient, state: AdminState) -> None:
    assert (await call(api, "GET", "/faults")).json() == {"faults": []}
    fault = {"kind": "error", "tool": "get_weather", "message": "x", "retryable": False}
    one = await call(api, "PUT", "/faults", fault)
    assert one.status_code == 200
    assert one.json()["added"] == [1]
    result = await state.dispatcher.dispatch("get_weather", {"city": "Oslo"})
    assert not result.ok and result.message == "x"
    many = await call(api, "PUT", "/faults?seed=7", [
        {"kind": "latency", "breaker_key": "searxng", "latency_s": 0.01, "rate": 0.5},
        {"kind": "bad_output", "tool": "web_search", "output": {"nested": [1, None]}},
    ])  # fmt: skip
    assert many.json()["added"] == [2, 3]
    listed = (await call(api, "GET", "/faults")).json()["faults"]
    assert [f["id"] for f in listed] == [1, 2, 3]
    assert listed[0] == {
        "id": 1, "kind": "error", "tool": "get_weather", "rate": 1.0, "latency_s": 0.0,
        "jitter_s": 0.0, "error_type": "tool_error", "message": "x", "retryable": False,
    }  # fmt: skip
    assert listed[2]["output"] == {"nested": [1, None]}
    assert (await call(api, "DELETE", "/faults/2")).json() == {"removed": 1}
    assert_error(await call(api, "DELETE", "/faults/2"), 404, "unknown_fault")
    assert_error(await call(api, "DELETE", "/faults/abc"), 404, "unknown_fault")
    replaced = await call(api, "PUT", "/faults?replace=true", {"kind": "hang", "tool": "x"})
    assert [f["id"] for f in replaced.json()["faults"]] == [4]
    assert (await call(api, "DELETE", "/faults")).json() == {"removed": 1}
    assert state.dispatcher.faults.list() == {}
    assert (await state.dispatcher.dispatch("get_weather", {"city": "Oslo"})).ok


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("body", "status", "error", "needle"),
    [
        ('{"kind": "error", "tool": ', 400, "invalid_json", "not valid JSON"),
        ('{"kind": "latency", "tool": "t", "latency_s": NaN}', 400, "invalid_json", "NaN"),
        ("", 400, "invalid_json", "not valid JSON"),
        ("[]", 422, "invalid_fault", "empty"),
        ('"error"', 422, "invalid_fault", "not of type"),
        ('{"kind": "nope", "tool": "t"}', 422, "invalid_fault", "kind"),
        ('{"kind": "error"}', 422, "invalid_fault", "the fault"),
        ('{"kind": "error", "tool": "t", "breaker_key": "k"}', 422, "invalid_fault", "the fault"),
        ('{"kind": "error", "tool": "t", "rate": 2}', 422, "invalid_fault", "rate"),
        ('{"kind": "error", "tool": "t", "rate": true}', 422, "invalid_fault", "rate"),
        ('{"kind": "error", "tool": "t", "surprise": 1}', 422, "invalid_fault", "surprise"),
        ('{"kind": "error", "tool": 5}', 422, "invalid_fault", "tool"),
        ('[{"kind": "hang", "tool": "t"}, {"kind": "x"}]', 422, "invalid_fault", "fault 1"),
        ('{"kind": "error", "tool": "t", "error_type": "x"}', 422, "invalid_fault", "error_type"),
        (json.dumps({"kind": "error", "tool": "t", "message": "m" * 241}), 422, "invalid_fault",
         "message"),
        ('{"kind": "bad_output", "tool": "t", "output": ' + "[" * 65 + "]" * 65 + "}", 422,
         "invalid_fault", "nested deeper than 64 levels"),
        ('{"kind": "bad_output", "tool": "t", "output": ' + "[" * 900 + "]" * 900 + "}", 400,
         "invalid_json", "nested deeper than 66 levels"),
        ('{"kind": "bad_output", "tool": "t", "output": ' + "[" * 5000 + "]" * 5000 + "}", 400,
         "invalid_json", "not valid JSON"),
        (json.dumps({"kind": "bad_output", "tool": "t", "output": ["x" * 100] * 3000}), 413,
         "payload_too_large", "larger than"),
    ],
)  # fmt: skip
async def test_bad_faults_are_4xx(
    api: httpx.AsyncClient, state: AdminState, body: str, status: int, error: str, needle: str
) -> None:
    response = await call(api, "PUT", "/faults", content=body)
    assert needle in assert_error(response, status, error)["message"]
    assert state.dispatcher.faults.list() == {}  # all or nothing
    assert (await call(api, "GET", "/faults")).status_code == 200  # still answering


@pytest.mark.anyio
@pytest.mark.parametrize("query", ["seed=x", "seed=1.5", "seed=", "replace=maybe", "seed=1_000"])
async def test_bad_query_parameters_are_400(api: httpx.AsyncClient, query: str) -> None:
    response = await call(api, "PUT", f"/faults?{query}", {"kind": "hang", "tool": "t"})
    assert_error(response, 400, "invalid_query")


@pytest.mark.anyio
async def test_fault_limits(api: httpx.AsyncClient) -> None:
    fault = {"kind": "hang", "tool": "t"}
    too_big = {"kind": "error", "tool": "t", "output": "x" * MAX_BODY_BYTES}
    assert_error(await call(api, "PUT", "/faults", too_big), 413, "payload_too_large")

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: the limit is on the stream
        for chunk in (b'{"kind": "hang", "tool": "', b"x" * MAX_BODY_BYTES, b'"}'):
            yield chunk

    response = await api.put("/faults", headers=AUTH, content=chunks())
    assert_error(response, 413, "payload_too_large")
    assert (await call(api, "PUT", "/faults", [fault] * MAX_FAULTS)).status_code == 200
    assert_error(await call(api, "PUT", "/faults", fault), 409, "too_many_faults")
    assert_error(
        await call(api, "PUT", "/faults", [fault] * (MAX_FAULTS + 1)), 422, "invalid_fault"
    )
    replaced = await call(api, "PUT", "/faults?replace=1", fault)
    assert len(replaced.json()["faults"]) == 1


@pytest.mark.anyio
async def test_seed_makes_injection_repeatable(api: httpx.AsyncClient, state: AdminState) -> None:
    async def draws() -> list[bool]:
        await call(api, "PUT", "/faults?replace=true&seed=42", {
            "kind": "error", "tool": "get_weather", "rate": 0.5, "retryable": False,
        })  # fmt: skip
        results = [
            await state.dispatcher.dispatch("get_weather", {"city": "Oslo"}) for _ in range(12)
        ]
        return [r.ok for r in results]

    first = await draws()
    assert first == await draws() and True in first and False in first


# -- tools -------------------------------------------------------------------------------------
@pytest.mark.anyio
async def test_tools(api: httpx.AsyncClient) -> None:
    tools = (await call(api, "GET", "/tools")).json()["tools"]
    assert [t["name"] for t in tools] == ["get_weather", "web_search", "delete_all"]
    assert tools[0] == {
        "name": "get_weather", "description": "Weather.", "risk": "read",
        "breaker_key": "open-meteo", "timeout_s": 10.0, "idempotent": True,
        "tags": ["weather"], "version": "1", "breaker_state": "closed", "offered": True,
    }  # fmt: skip
    support = (await call(api, "GET", "/tools?profile=support")).json()["tools"]
    assert [t["name"] for t in support] == ["get_weather"]
    assert_error(await call(api, "GET", "/tools?profile=nope"), 404, "unknown_profile")


# -- the OpenAPI document ----------------------------------------------------------------------
@pytest.mark.anyio
async def test_openapi_document_covers_every_route(api: httpx.AsyncClient) -> None:
    doc = (await call(api, "GET", "/openapi.json")).json()
    assert doc["openapi"] == "3.1.0"
    assert doc["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http", "scheme": "bearer", "description": doc["components"]["securitySchemes"][
            "bearerAuth"]["description"],
    }  # fmt: skip
    documented = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    expected = {("GET", "/healthz")} | set(AUTHED)
    expected = {(m, p.replace("open-meteo", "{key}").replace("/1", "/{id}")) for m, p in expected}
    assert documented == expected
    assert doc["paths"]["/healthz"]["get"]["security"] == []
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            public = path == "/healthz"
            assert ("401" in op["responses"]) is not public, (method, path)
    key = doc["paths"]["/breakers/{key}"]["get"]["parameters"][0]["schema"]
    assert key == {"type": "string", "enum": ["delete_all", "open-meteo", "searxng"]}


SCHEMA = schemathesis.openapi.from_asgi("/openapi.json", admin_app(build_state()), headers=AUTH)


@SCHEMA.parametrize()
@hypothesis.settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=list(hypothesis.HealthCheck),
    derandomize=True,
)
def test_openapi_property_based(case: schemathesis.Case) -> None:
    """Generated requests, valid and invalid: no 5xx, every answer as documented."""
    case.call_and_validate(headers=AUTH)


def _nested(depth: int, leaf: str) -> str:
    return "[" * depth + leaf + "]" * depth


@pytest.mark.anyio
async def test_deep_and_huge_bodies_never_answer_5xx(api: httpx.AsyncClient) -> None:
    """Bodies of every depth and size, anywhere in a fault: a 4xx (or a fault within the
    limits), never a 5xx, and the API keeps answering after each."""
    rng = __import__("random").Random(7)
    bodies = []
    for depth in (1, 63, 64, 65, 200, 900, 999, 1001, 3000, 100_000):
        leaf = rng.choice(['"x"', "1", "{}", '{"a": null}', "[]"])
        bodies.append('{"kind": "bad_output", "tool": "t", "output": ' + _nested(depth, leaf) + "}")
        bodies.append(_nested(depth, '{"kind": "hang", "tool": "t"}'))
        bodies.append('{"kind": "error", "tool": "t", "message": ' + _nested(depth, '"m"') + "}")
    for size in (250_000, 262_144, 262_145, 1_000_000, 5_000_000):
        bodies.append(json.dumps({"kind": "bad_output", "tool": "t", "output": "y" * size}))
    for body in bodies:
        response = await call(api, "PUT", "/faults", content=body)
        assert response.status_code < 500, (len(body), response.text[:200])
        listed = await call(api, "GET", "/faults")
        assert listed.status_code == 200
        await call(api, "DELETE", "/faults")


# -- what the move to FastAPI must keep --------------------------------------------------------
def _routes() -> list[tuple[str, str]]:
    """Every (method, path) the app routes, read from the app itself."""
    app = admin_app(build_state())
    routes = [route for route in app.routes if isinstance(route, Route)]
    return sorted((method, route.path) for route in routes for method in route.methods or ())


ROUTES = _routes()
FAULT = '{"kind": "hang", "tool": "t"}'


def _concrete(path: str) -> str:
    return path.replace("{key}", "open-meteo").replace("{id}", "1")


def test_the_routes_are_read_from_the_app() -> None:
    assert {("GET", "/healthz"), *AUTHED} <= {(method, _concrete(path)) for method, path in ROUTES}


@pytest.mark.anyio
@pytest.mark.parametrize(("method", "path"), ROUTES)
async def test_every_route_but_healthz_needs_the_token(
    api: httpx.AsyncClient, state: AdminState, method: str, path: str
) -> None:
    """A route added without the auth dependency fails here."""
    response = await api.request(method, _concrete(path), content=FAULT)
    if path == "/healthz":
        assert response.status_code == 200
    else:
        assert_error(response, 401, "unauthorized")
        assert response.headers["www-authenticate"] == 'Bearer realm="toolrelay-admin"'
    assert state.dispatcher.faults.list() == {}
    assert state.dispatcher.breakers.state("open-meteo") == "closed"


@pytest.mark.anyio
@pytest.mark.parametrize(
    "body", ["{", "x" * (MAX_BODY_BYTES + 1), "[" * 5000, "", '{"kind": "x"}', FAULT]
)
async def test_no_body_is_judged_without_the_token(api: httpx.AsyncClient, body: str) -> None:
    """The token is checked before the body is read: 401, not 400, 413 or 422."""
    response = await api.put("/faults?seed=x", content=body)
    assert_error(response, 401, "unauthorized")


@pytest.mark.anyio
@pytest.mark.parametrize(("method", "path"), ROUTES)
@pytest.mark.parametrize("query", ["surprise=1", "seed=1&seed=2", "profile=a&profile=a"])
async def test_unknown_and_repeated_query_parameters_are_refused_everywhere(
    api: httpx.AsyncClient, state: AdminState, method: str, path: str, query: str
) -> None:
    response = await call(api, method, f"{_concrete(path)}?{query}", content=FAULT)
    assert_error(response, 400, "invalid_query")
    assert state.dispatcher.faults.list() == {}
    assert state.dispatcher.breakers.state("open-meteo") == "closed"


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("method", "path", "body", "content_type", "status", "error", "needle"),
    [
        ("PUT", "/faults", FAULT, "text/plain", 415, "unsupported_media_type", "application/json"),
        ("PUT", "/faults", FAULT, "application/x-www-form-urlencoded", 415,
         "unsupported_media_type", "application/json"),
        ("PUT", "/faults?replace=maybe", FAULT, None, 400, "invalid_query", "replace"),
        ("PUT", "/faults?seed=%201", FAULT, None, 400, "invalid_query", "seed"),
        ("PUT", "/faults?seed=1" + "0" * 30, FAULT, None, 400, "invalid_query", "seed"),
        ("DELETE", "/faults/0", None, None, 404, "unknown_fault", "'0'"),
        ("DELETE", "/faults/-3", None, None, 404, "unknown_fault", "'-3'"),
        ("DELETE", "/faults/" + "9" * 50, None, None, 404, "unknown_fault", "999"),
        ("PUT", "/faults", '{"kind": "hang", "tool": null}', None, 422, "invalid_fault", "tool"),
        ("PUT", "/faults", '{"kind": "hang", "tool": "t", "breaker_key": null}', None, 422,
         "invalid_fault", "breaker_key"),
        ("PUT", "/faults", '[{"kind": "hang", "tool": "t", "rate": "0.5"}]', None, 422,
         "invalid_fault", "fault 0 at rate"),
        ("PUT", "/faults", '{"kind": "hang", "tool": "t", "retryable": "yes"}', None, 422,
         "invalid_fault", "retryable"),
        ("PUT", "/faults", '{"kind": "latency", "tool": "t", "latency_s": 1e400}', None, 400,
         "invalid_json", "not finite"),
        ("PUT", "/faults", '{"kind": "latency", "tool": "t", "jitter_s": -1}', None, 422,
         "invalid_fault", "jitter_s"),
        ("PUT", "/faults", '{"kind": "hang", "tool": "t", "id": 1}', None, 422, "invalid_fault",
         "id"),
        ("PUT", "/faults", "[" + ",".join([FAULT] * (MAX_FAULTS + 1)) + "]", None, 422,
         "invalid_fault", f"at most {MAX_FAULTS}"),
        ("PUT", "/faults", "7", None, 422, "invalid_fault", "not of type"),
        ("PUT", "/faults", "null", None, 422, "invalid_fault", "not of type"),
    ],
)  # fmt: skip
async def test_validation_errors_keep_the_error_shape(
    api: httpx.AsyncClient,
    state: AdminState,
    method: str,
    path: str,
    body: str | None,
    content_type: str | None,
    status: int,
    error: str,
    needle: str,
) -> None:
    headers = {**AUTH} if content_type is None else {**AUTH, "Content-Type": content_type}
    response = await api.request(method, path, headers=headers, content=body)
    assert needle in assert_error(response, status, error)["message"]
    assert state.dispatcher.faults.list() == {}


@pytest.mark.anyio
async def test_json_content_types_are_accepted(api: httpx.AsyncClient) -> None:
    for content_type in ("application/json", "application/json; charset=utf-8",
                         "application/merge-patch+json"):  # fmt: skip
        headers = {**AUTH, "Content-Type": content_type}
        response = await api.put("/faults?replace=true", headers=headers, content=FAULT)
        assert response.status_code == 200, response.text


@pytest.mark.anyio
async def test_405_allows_every_method_of_the_path(api: httpx.AsyncClient) -> None:
    response = await call(api, "OPTIONS", "/faults")
    assert_error(response, 405, "method_not_allowed")
    allowed = {method.strip() for method in response.headers["allow"].split(",")}
    assert {"GET", "PUT", "DELETE"} <= allowed and "POST" not in allowed


@pytest.mark.anyio
async def test_openapi_document_follows_the_running_server(
    api: httpx.AsyncClient, state: AdminState
) -> None:
    first = (await call(api, "GET", "/openapi.json")).json()
    state.dispatcher.breakers.get("late-key")  # a breaker created after the first document
    doc = (await call(api, "GET", "/openapi.json")).json()
    assert first != doc
    key = doc["paths"]["/breakers/{key}/open"]["post"]["parameters"][0]["schema"]
    assert key["enum"] == ["delete_all", "late-key", "open-meteo", "searxng"]
    profile = doc["paths"]["/tools"]["get"]["parameters"][0]["schema"]
    assert profile == {"type": "string", "enum": ["support"]}
    error = {"$ref": "#/components/schemas/Error"}
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            for status, answer in operation["responses"].items():
                if status.startswith("4"):  # every refusal is {error, message}
                    assert answer["content"] == {"application/json": {"schema": error}}, (
                        method, path, status)  # fmt: skip
    assert set(doc["components"]["schemas"]["Error"]["required"]) == {"error", "message"}


FAULT_FIELDS = ["kind", "tool", "breaker_key", "rate", "latency_s", "jitter_s", "error_type",
                "message", "retryable", "output", "surprise"]  # fmt: skip
FAULT_VALUES = st.one_of(
    st.sampled_from(["latency", "error", "hang", "bad_output", "nope", "timeout", "tool_error"]),
    st.text(max_size=3),
    st.text(min_size=239, max_size=242),
    st.integers(-2, 2),
    st.floats(-1, 2, allow_nan=False),
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)


@hypothesis.settings(
    max_examples=150, deadline=None, suppress_health_check=list(hypothesis.HealthCheck)
)
@hypothesis.given(fault=st.dictionaries(st.sampled_from(FAULT_FIELDS), FAULT_VALUES, max_size=6))
@pytest.mark.anyio
async def test_the_admin_api_and_the_config_accept_the_same_faults(
    api: httpx.AsyncClient, fault: dict[str, Any]
) -> None:
    try:
        parse_config({"faults": [fault]})
    except ConfigError:
        in_config = False
    else:
        in_config = True
    response = await call(api, "PUT", "/faults?replace=true", fault)
    assert response.status_code == (200 if in_config else 422), (fault, response.text)
