"""Streamable HTTP sessions are shared fairly between clients (issue 16).

``[serve.http] max_sessions_per_client`` caps the sessions one client (its token, or its
address without tokens) has open: one more ``initialize`` is answered 429 while other
clients still get theirs. When ``max_sessions`` are open the least recently used idle session
is closed to admit a new one; only when every session is busy is a new one refused (503).
Refusals are counted in ``toolrelay_mcp_sessions_refused_total{reason}``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from test_serve_mcp import (
    OPS_TOKEN,
    SUPPORT_TOKEN,
    TOKEN,
    HttpServer,
    start_http_server,
    stop_http_server,
)
from toolrelay.chaos.upstream import StandInUpstream
from toolrelay.serve.settings import parse_serve_section

MCP_TEST_SERVER = Path(__file__).parent / "servers" / "mcp_test_server.py"
VERSION = "2025-06-18"
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": VERSION,
        "capabilities": {},
        "clientInfo": {"name": "sessions-test", "version": "1"},
    },
}
PING = {"jsonrpc": "2.0", "id": 2, "method": "ping"}


@pytest.fixture(scope="module")
def upstream() -> Iterator[StandInUpstream]:
    with StandInUpstream().run_in_thread() as up:
        yield up


def initialize(http: httpx.Client, url: str, token: str | None = None) -> httpx.Response:
    headers = dict(HEADERS)
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return http.post(url, json=INITIALIZE, headers=headers)


def session_headers(session_id: str, token: str | None = None) -> dict[str, str]:
    headers = {**HEADERS, "Mcp-Session-Id": session_id, "Mcp-Protocol-Version": VERSION}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def ping(http: httpx.Client, url: str, session_id: str, token: str | None) -> int:
    return http.post(url, json=PING, headers=session_headers(session_id, token)).status_code


def opened(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return response.headers["mcp-session-id"]


def metric(server: HttpServer, name: str, labels: str = "") -> float:
    text = httpx.get(
        server.admin.url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"}
    ).text
    found = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.MULTILINE)
    assert found is not None, name + labels
    return float(found.group(1))


def refusal(response: httpx.Response, status: int) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["jsonrpc"] == "2.0" and body["id"] is None
    assert "Too many open sessions" in body["error"]["message"]


CLIENTS = """max_sessions = 10
max_sessions_per_client = 2
[serve.http.clients.support]
token_env = "SUPPORT_TOKEN"
profile = "support"
[serve.http.clients.ops]
token_env = "OPS_TOKEN"
profile = "all"
"""


def test_one_client_over_its_cap_is_refused_and_others_still_initialize(
    upstream: StandInUpstream, tmp_path: Path
) -> None:
    server = start_http_server(tmp_path, upstream.url, extra=CLIENTS)
    try:
        url = server.mcp_url
        with httpx.Client(timeout=10) as http:
            for _ in range(2):
                opened(initialize(http, url, SUPPORT_TOKEN))
            refusal(initialize(http, url, SUPPORT_TOKEN), 429)
            refusal(initialize(http, url, SUPPORT_TOKEN), 429)
            ops = opened(initialize(http, url, OPS_TOKEN))
            pong = http.post(url, json=PING, headers=session_headers(ops, OPS_TOKEN))
            assert pong.status_code == 200, pong.text
            # a session the client ends frees its place
            first = opened(initialize(http, url, OPS_TOKEN))
            gone = http.delete(url, headers=session_headers(first, OPS_TOKEN))
            assert gone.status_code == 200, gone.text
            opened(initialize(http, url, OPS_TOKEN))
            refusal(initialize(http, url, OPS_TOKEN), 429)
        refused = "toolrelay_mcp_sessions_refused_total"
        assert metric(server, refused, '{reason="client_limit"}') == 3
        assert metric(server, refused, '{reason="full"}') == 0
        assert metric(server, "toolrelay_mcp_sessions_open") == 4
    finally:
        stop_http_server(server)


def test_when_full_the_least_recently_used_idle_session_makes_room(
    upstream: StandInUpstream, tmp_path: Path
) -> None:
    extra = CLIENTS.replace("max_sessions = 10", "max_sessions = 3\nsession_idle_s = 600")
    server = start_http_server(tmp_path, upstream.url, extra=extra)
    try:
        url = server.mcp_url
        with httpx.Client(timeout=10) as http:
            a, b = (opened(initialize(http, url, SUPPORT_TOKEN)) for _ in range(2))
            c = opened(initialize(http, url, OPS_TOKEN))
            assert ping(http, url, a, SUPPORT_TOKEN) == 200  # b is now the oldest idle one
            d = opened(initialize(http, url, OPS_TOKEN))
            assert ping(http, url, b, SUPPORT_TOKEN) == 404
            assert ping(http, url, a, SUPPORT_TOKEN) == 200
            assert [ping(http, url, s, OPS_TOKEN) for s in (c, d)] == [200, 200]
            assert metric(server, "toolrelay_mcp_sessions_reaped_total") == 1
            assert metric(server, "toolrelay_mcp_sessions_open") == 3

            # every session busy (an open GET stream each): nothing to reap, so 503
            with ExitStack() as streams:
                for session, token in ((a, SUPPORT_TOKEN), (c, OPS_TOKEN), (d, OPS_TOKEN)):
                    headers = {**session_headers(session, token), "Accept": "text/event-stream"}
                    stream = streams.enter_context(http.stream("GET", url, headers=headers))
                    assert stream.status_code == 200
                refusal(initialize(http, url, SUPPORT_TOKEN), 503)
            refused = "toolrelay_mcp_sessions_refused_total"
            assert metric(server, refused, '{reason="full"}') == 1
            assert metric(server, refused, '{reason="client_limit"}') == 0
    finally:
        stop_http_server(server)


def test_session_settings_parse_and_default() -> None:
    default = parse_serve_section({}).http
    assert (default.max_sessions, default.session_idle_s) == (1000, 1800.0)
    assert default.client_session_cap == 100
    small = parse_serve_section({"http": {"max_sessions": 5}}).http
    assert small.client_session_cap == 1
    set_ = parse_serve_section(
        {"http": {"max_sessions": 50, "max_sessions_per_client": 80, "session_idle_s": 60}}
    ).http
    assert (set_.max_sessions, set_.client_session_cap, set_.session_idle_s) == (50, 50, 60)


# -- who a client is (issue 28, item 2) ----------------------------------------------------
def from_address(address: str) -> httpx.Client:
    """A client whose connections come from ``address`` (any of 127.0.0.0/8 is loopback)."""
    return httpx.Client(timeout=10, transport=httpx.HTTPTransport(local_address=address))


def forwarded(http: httpx.Client, url: str, address: str) -> httpx.Response:
    headers = {**HEADERS, "X-Forwarded-For": address}
    return http.post(url, json=INITIALIZE, headers=headers)


def test_a_forged_forwarded_for_is_not_a_new_client(
    upstream: StandInUpstream, tmp_path: Path
) -> None:
    """Without tokens a client is its peer address: a local process sending a new
    ``X-Forwarded-For`` with each ``initialize`` is one client, over its cap after 2, and is
    refused (429) without closing anyone's session to make room (before: 40 forged clients
    filled the table and the reaper closed the victim's session)."""
    extra = "max_sessions = 3\nmax_sessions_per_client = 2\nsession_idle_s = 600\n"
    server = start_http_server(tmp_path, upstream.url, extra=extra)
    try:
        url = server.mcp_url
        with from_address("127.0.0.2") as victim, from_address("127.0.0.1") as attacker:
            mine = opened(initialize(victim, url))
            statuses = [forwarded(attacker, url, f"10.9.{n}.1").status_code for n in range(40)]
            assert statuses == [200] * 2 + [429] * 38
            assert ping(victim, url, mine, None) == 200
        assert metric(server, "toolrelay_mcp_sessions_open") == 3  # full, and nobody reaped
        assert metric(server, "toolrelay_mcp_sessions_reaped_total") == 0
        refused = "toolrelay_mcp_sessions_refused_total"
        assert metric(server, refused, '{reason="client_limit"}') == 38
        log = server.errlog.read_text()
        assert "refusing a new MCP session for peer:127.0.0.1: client_limit" in log
        assert "10.9." not in log
        assert "MCP clients are told apart by their peer address" in log
    finally:
        stop_http_server(server)


def test_a_trusted_proxys_forwarded_for_names_the_client(
    upstream: StandInUpstream, tmp_path: Path
) -> None:
    """``trusted_proxies``: the ``X-Forwarded-For`` of a request from a listed address names
    its client; any other peer's is ignored (it is its own address)."""
    extra = 'max_sessions = 10\nmax_sessions_per_client = 1\ntrusted_proxies = ["127.0.0.1"]\n'
    server = start_http_server(tmp_path, upstream.url, extra=extra)
    try:
        url = server.mcp_url
        with from_address("127.0.0.1") as proxy, from_address("127.0.0.2") as other:
            opened(forwarded(proxy, url, "10.0.0.1"))
            opened(forwarded(proxy, url, "10.0.0.2"))
            refusal(forwarded(proxy, url, "10.0.0.1"), 429)
            opened(forwarded(other, url, "10.0.0.3"))
            refusal(forwarded(other, url, "10.0.0.4"), 429)
        log = server.errlog.read_text()
        assert "refusing a new MCP session for peer:10.0.0.1: client_limit" in log
        assert "refusing a new MCP session for peer:127.0.0.2: client_limit" in log
        assert "X-Forwarded-For of 127.0.0.1" in log
    finally:
        stop_http_server(server)


# -- a vanished client's calls -------------------------------------------------------------
KILLED_CLIENT = """
import sys, anyio, httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

async def main(url: str, calls: int) -> None:
    async with (
        httpx2.AsyncClient(timeout=httpx2.Timeout(30.0, read=300.0)) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        async with anyio.create_task_group() as tg:
            for n in range(calls):
                tg.start_soon(session.call_tool, "up__hang", {"seconds": 60, "tag": f"gone-{n}"})
            print("calling", flush=True)
            await anyio.sleep(120)

anyio.run(main, sys.argv[1], int(sys.argv[2]))
"""


def recorded(record: Path, event: str) -> list[dict[str, object]]:
    lines = record.read_text().splitlines() if record.exists() else []
    return [e for e in map(json.loads, lines) if e.get("event") == event]


def test_a_killed_clients_calls_are_cancelled(upstream: StandInUpstream, tmp_path: Path) -> None:
    """A client killed with calls in flight (2025-era session over HTTP) has them cancelled
    on the upstream at once; they no longer fill the bulkhead, so another client is not
    answered ``overloaded`` (before: they ran for their whole 60 s)."""
    record = tmp_path / "calls.jsonl"
    server_cmd = [sys.executable, str(MCP_TEST_SERVER), "--record", str(record)]
    extra = f"""
[serve.upstreams.test]
command = {json.dumps(server_cmd)}
breaker_key = "mcp-test"
prefix = "up"
timeout_s = 90
[breakers.mcp-test]
max_concurrent = 4
bulkhead_wait_s = 0
"""
    calls = 4
    server = start_http_server(tmp_path, upstream.url, extra=extra)
    try:
        script = tmp_path / "client.py"
        script.write_text(KILLED_CLIENT)
        client = subprocess.Popen(
            [sys.executable, str(script), server.mcp_url, str(calls)], stdout=subprocess.PIPE
        )
        try:
            deadline = time.monotonic() + 30
            while len([c for c in recorded(record, "call") if c["tool"] == "hang"]) < calls:
                assert time.monotonic() < deadline, "the upstream never saw the calls"
                assert client.poll() is None, "the client died early"
                time.sleep(0.05)
        finally:
            client.kill()  # SIGKILL: no goodbye, no DELETE, no notifications/cancelled
            client.wait(10)
        deadline = time.monotonic() + 10
        while len(recorded(record, "cancelled")) < calls:
            assert time.monotonic() < deadline, recorded(record, "cancelled")
            time.sleep(0.05)
        assert sorted(str(e["tag"]) for e in recorded(record, "cancelled")) == [
            f"gone-{n}" for n in range(calls)
        ]
        with httpx.Client(timeout=30) as http:
            session_id = opened(initialize(http, server.mcp_url))
            http.post(
                server.mcp_url,
                json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                headers=session_headers(session_id),
            )
            call = {
                "jsonrpc": "2.0",
                "id": 3,
                "method": "tools/call",
                "params": {"name": "up__hang", "arguments": {"seconds": 0.05, "tag": "other"}},
            }
            answered = http.post(server.mcp_url, json=call, headers=session_headers(session_id))
        assert answered.status_code == 200
        assert '"isError":false' in answered.text.replace(" ", ""), answered.text
        assert "overloaded" not in answered.text
    finally:
        stop_http_server(server)
