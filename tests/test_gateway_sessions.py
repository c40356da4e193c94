"""Streamable HTTP sessions are shared fairly between clients (issue 16).

``[serve.http] max_sessions_per_client`` caps the sessions one client (its token, or its
address without tokens) has open: one more ``initialize`` is answered 429 while other
clients still get theirs. When ``max_sessions`` are open the least recently used idle session
is closed to admit a new one; only when every session is busy is a new one refused (503).
Refusals are counted in ``toolrelay_mcp_sessions_refused_total{reason}``.
"""

from __future__ import annotations

import re
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
from toolrelay.chaos.upstream import Upstream
from toolrelay.serve.settings import parse_serve_section

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
def upstream() -> Iterator[Upstream]:
    with Upstream().run_in_thread() as up:
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


def ping(http: httpx.Client, url: str, session_id: str, token: str) -> int:
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
    upstream: Upstream, tmp_path: Path
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
    upstream: Upstream, tmp_path: Path
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
    default = parse_serve_section({})
    assert (default.max_sessions, default.session_idle_s) == (1000, 1800.0)
    assert default.client_session_cap == 100
    small = parse_serve_section({"http": {"max_sessions": 5}})
    assert small.client_session_cap == 1
    set_ = parse_serve_section(
        {"http": {"max_sessions": 50, "max_sessions_per_client": 80, "session_idle_s": 60}}
    )
    assert (set_.max_sessions, set_.client_session_cap, set_.session_idle_s) == (50, 50, 60)
