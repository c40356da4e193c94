"""Per-client limits of ``toolrelay serve`` (issue 19): a token bucket of requests per second
and a cap on calls in flight, per client token.

One client over its rate gets ``overloaded`` with a ``retry_after_s`` while another client's
calls all succeed; a client at its concurrency cap is refused more calls until one ends;
``tools/list`` over the rate is a JSON-RPC error; refusals never reach a breaker; the
per-client metrics move. The bucket itself is tested on a fake clock.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp.types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from test_serve_mcp import (
    OPS_TOKEN,
    SUPPORT_TOKEN,
    HttpServer,
    http_session,
    start_http_server,
    stop_http_server,
)
from toolrelay.chaos.upstream import StandInUpstream
from toolrelay.serve.client_limits import (
    RATE_LIMITED,
    ClientLimit,
    ClientLimits,
    TokenBucket,
    configured_limits,
)
from toolrelay.serve.settings import parse_serve_section
from toolrelay.settings import ConfigError

# support: 3 requests at once, then one every 2 s; ops: no rate limit. Both: one call in
# flight at a time (the [serve.http] default), support overrides it.
LIMITS = """max_concurrent_calls = 1
[serve.http.clients.support]
token_env = "SUPPORT_TOKEN"
profile = "support"
rate_per_s = 0.5
burst = 3
max_concurrent_calls = 4
[serve.http.clients.ops]
token_env = "OPS_TOKEN"
profile = "all"
"""
OSLO = {"city": "Oslo"}


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# -- the bucket on a fake clock --------------------------------------------------------------
def test_bucket_gives_its_burst_then_one_token_per_interval() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate_per_s=4.0, burst=3, clock=clock)
    assert [bucket.take() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take() == pytest.approx(0.25)
    clock.now += 0.1
    assert bucket.take() == pytest.approx(0.15)  # a refusal takes nothing
    clock.now += 0.15
    assert bucket.take() == 0.0
    assert bucket.take() == pytest.approx(0.25)


def test_bucket_refills_to_its_burst_and_no_further() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate_per_s=10.0, burst=2, clock=clock)
    bucket.take(), bucket.take()
    clock.now += 3600.0
    assert [bucket.take() for _ in range(3)] == [0.0, 0.0, pytest.approx(0.1)]


@pytest.mark.parametrize(
    ("rate", "burst"), [(0.0, 1), (-1.0, 1), (float("inf"), 1), (float("nan"), 1), (1.0, 0)]
)
def test_bucket_refuses_nonsense(rate: float, burst: int) -> None:
    with pytest.raises(ValueError, match=r"rate_per_s|burst"):
        TokenBucket(rate, burst)


def test_limits_per_client_over_the_default() -> None:
    clock = FakeClock()
    limits = ClientLimits(
        ClientLimit(rate_per_s=2.0, max_concurrent_calls=1),
        {"ops": ClientLimit(max_concurrent_calls=2)},
        clock=clock,
    )
    assert limits.limit("ops") == ClientLimit(rate_per_s=2.0, max_concurrent_calls=2)
    assert limits.limit("unauthenticated") == ClientLimit(rate_per_s=2.0, max_concurrent_calls=1)
    # the default burst is one second's worth: two tokens
    assert limits.enter("ops") is None
    limits.leave("ops")
    assert limits.enter("ops") is None
    rate = limits.enter("ops")  # one in flight, no token left: refused for the rate
    assert rate is not None and rate.reason == "rate"
    assert rate.retry_after_s == pytest.approx(0.5)
    clock.now += 0.5
    assert limits.enter("ops") is None
    clock.now += 0.5
    busy = limits.enter("ops")  # two in flight: refused for that, and no token is taken
    assert busy is not None and busy.reason == "concurrency" and busy.retry_after_s is None
    limits.leave("ops")
    assert limits.enter("ops") is None
    # another client has its own bucket and places
    assert limits.enter("support") is None
    refused = limits.enter("support")
    assert refused is not None and refused.reason == "concurrency"
    # a list request takes a token but no place
    assert limits.check("support") is None
    over = limits.check("support")
    assert over is not None and over.reason == "rate"
    envelope = over.result("weather_current", "7").to_model()
    assert envelope["error_type"] == "overloaded" and envelope["retryable"] is True
    assert envelope["retry_after_s"] == pytest.approx(0.5)
    assert over.error().error.data == {"error_type": "overloaded", "retry_after_s": 0.5}


def test_no_limits_admit_everything() -> None:
    limits = ClientLimits()
    assert all(limits.enter("default") is None for _ in range(10_000))
    assert all(limits.check("default") is None for _ in range(10_000))


# -- a real toolrelay serve, real SDK clients ------------------------------------------------
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


@pytest.fixture
def server(upstream: StandInUpstream, tmp_path: Path) -> Iterator[HttpServer]:
    server = start_http_server(tmp_path, upstream.url, extra=LIMITS)
    yield server
    stop_http_server(server)


def envelope(result: types.CallToolResult) -> dict[str, Any]:
    assert result.is_error is True and result.structured_content is not None, result
    return dict(result.structured_content)


@pytest.mark.anyio
async def test_a_client_over_its_rate_is_refused_while_another_is_served(
    server: HttpServer,
) -> None:
    admin = server.admin
    rejected = "toolrelay_mcp_client_rejected_total"
    async with (
        http_session(server.mcp_url, SUPPORT_TOKEN) as (support, _),
        http_session(server.mcp_url, OPS_TOKEN) as (ops, _),
    ):
        await support.list_tools()  # token 1 of 3
        for _ in range(2):  # tokens 2 and 3
            ok = await support.call_tool("weather_current", OSLO)
            assert ok.is_error is False, ok
        refused = await support.call_tool("weather_current", OSLO)
        answer = envelope(refused)
        assert answer["error_type"] == "overloaded" and answer["retryable"] is True
        retry_after = answer["retry_after_s"]
        assert isinstance(retry_after, float) and 0 < retry_after <= 2.0
        # tools/list over the rate: a JSON-RPC error saying the same
        with pytest.raises(MCPError) as listing:
            await support.list_tools()
        assert listing.value.code == RATE_LIMITED
        assert listing.value.data["error_type"] == "overloaded"
        assert 0 < listing.value.data["retry_after_s"] <= 2.0
        # the other client is not held back at all
        assert "web_search" in {tool.name for tool in (await ops.list_tools()).tools}
        for _ in range(20):
            ok = await ops.call_tool("weather_current", OSLO)
            assert ok.is_error is False, ok
        # a token comes back after retry_after_s
        await anyio.sleep(listing.value.data["retry_after_s"] + 0.05)
        again = await support.call_tool("weather_current", OSLO)
        assert again.is_error is False, again
    assert await admin.metric(rejected, client="support", reason="rate") == 2
    assert await admin.metric(rejected, client="ops") == 0
    assert await admin.metric(rejected, client="support", reason="concurrency") == 0
    outcome = {"tool": "weather_current", "outcome": "overloaded"}
    assert await admin.metric("toolrelay_mcp_tool_calls_total", **outcome) == 1
    # refused calls never reached the dispatcher, so never a breaker
    assert await admin.metric("toolrelay_tool_calls_total", **outcome) == 0
    breaker = await admin.call("GET", "/breakers/open-meteo")
    assert breaker["state"] == "closed" and breaker["failures"] == 0


@pytest.mark.anyio
async def test_a_sessionless_call_takes_one_token(server: HttpServer) -> None:
    """A 2026-era ``tools/call`` costs its client one token: the ``tools/list`` the SDK's
    server makes to check its ``Mcp-Param`` headers is not charged (nor logged as a
    traceback when refused: ``stop_http_server`` checks the log)."""
    headers = {"Authorization": f"Bearer {SUPPORT_TOKEN}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        Client(streamable_http_client(server.mcp_url, http_client=http), cache=None) as client,
    ):
        assert client.protocol_version == "2026-07-28"
        await client.list_tools()  # token 1 of 3 (the client's own listing is charged)
        answers = [await client.call_tool("weather_current", OSLO) for _ in range(3)]
    assert [a.is_error for a in answers] == [False, False, True], answers
    assert envelope(answers[2])["error_type"] == "overloaded"
    rejected = "toolrelay_mcp_client_rejected_total"
    assert await server.admin.metric(rejected, client="support", reason="rate") == 1


@pytest.mark.anyio
async def test_a_client_at_its_concurrency_cap_waits_for_its_own_calls(
    server: HttpServer,
) -> None:
    admin = server.admin
    await admin.call("PUT", "/faults", {"kind": "hang", "tool": "weather_forecast"})
    inflight = "toolrelay_mcp_client_inflight"
    async with (
        http_session(server.mcp_url, OPS_TOKEN) as (ops, _),
        http_session(server.mcp_url, SUPPORT_TOKEN) as (support, _),
        anyio.create_task_group() as tg,
    ):
        await ops.list_tools()
        tg.start_soon(ops.call_tool, "weather_forecast", OSLO)  # hangs (deadline 30 s)
        with anyio.fail_after(10):
            while await admin.metric(inflight, client="ops") != 1:  # noqa: ASYNC110
                await anyio.sleep(0.05)
        busy = envelope(await ops.call_tool("weather_current", OSLO))
        assert busy["error_type"] == "overloaded" and busy["retryable"] is True
        assert "retry_after_s" not in busy  # a place frees when one of its calls ends
        # another client has its own places
        ok = await support.call_tool("weather_current", OSLO)
        assert ok.is_error is False, ok
        assert await admin.metric(inflight, client="support") == 0
        # the hung call is cancelled by the client: its place is free again
        tg.cancel_scope.cancel()
    await admin.call("DELETE", "/faults")
    with anyio.fail_after(10):
        while await admin.metric(inflight, client="ops") != 0:  # noqa: ASYNC110
            await anyio.sleep(0.05)
    async with http_session(server.mcp_url, OPS_TOKEN) as (ops, _):
        ok = await ops.call_tool("weather_current", OSLO)
        assert ok.is_error is False, ok
    rejected = "toolrelay_mcp_client_rejected_total"
    assert await admin.metric(rejected, client="ops", reason="concurrency") == 1
    assert await admin.metric(rejected, client="ops", reason="rate") == 0
    assert await admin.metric(rejected, client="support") == 0


# -- the settings -----------------------------------------------------------------------------
def test_limits_are_read_from_serve_http_and_each_client() -> None:
    settings = parse_serve_section(
        {
            "transport": "http",
            "http": {
                "rate_per_s": 10,
                "max_concurrent_calls": 3,
                "clients": {
                    "a": {"token": "token-a", "rate_per_s": 0.5, "burst": 2},
                    "b": {"token": "token-b"},
                },
            },
        }
    )
    limits = ClientLimits(*configured_limits(settings))
    assert limits.limit("a") == ClientLimit(rate_per_s=0.5, burst=2, max_concurrent_calls=3)
    assert limits.limit("b") == ClientLimit(rate_per_s=10, max_concurrent_calls=3)
    assert limits.limit("unauthenticated") == limits.limit("b")
    # over stdio: one client, no limits
    stdio = parse_serve_section({"http": {"rate_per_s": 1, "max_concurrent_calls": 1}})
    assert configured_limits(stdio) == (ClientLimit(), {})


@pytest.mark.parametrize(
    ("section", "needle"),
    [
        ({"http": {"rate_per_s": 0}}, "serve.http.rate_per_s"),
        ({"http": {"burst": 0}}, "serve.http.burst"),
        ({"http": {"max_concurrent_calls": 1.5}}, "serve.http.max_concurrent_calls"),
        ({"http": {"clients": {"a": {"token": "t", "rate_per_s": -1}}}}, "rate_per_s"),
        ({"ping_interval_s": 0}, "serve.ping_interval_s"),
    ],
)
def test_bad_limits_are_one_line_errors(section: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse_serve_section(section)
    assert needle in str(error.value) and "\n" not in str(error.value)


def test_new_limits_keep_calls_in_flight_and_unchanged_buckets() -> None:
    clock = FakeClock()
    limits = ClientLimits(ClientLimit(rate_per_s=1.0, max_concurrent_calls=2), clock=clock)
    assert limits.enter("a") is None and limits.enter("b") is None  # a's and b's only token
    limits.update(ClientLimit(rate_per_s=1.0, max_concurrent_calls=2), {"b": ClientLimit(burst=3)})
    over = limits.enter("a")  # unchanged: still no token
    assert over is not None and over.reason == "rate"
    assert limits.enter("b") is None  # a new bucket of 3 ...
    busy = limits.enter("b")  # ... but its call from before still holds a place
    assert busy is not None and busy.reason == "concurrency"
    limits.leave("b")
    limits.leave("b")
    assert limits.enter("b") is None  # token 2
    assert limits.enter("b") is None  # token 3
    limits.leave("b")
    over = limits.enter("b")
    assert over is not None and over.reason == "rate"
