"""Pathological upstream answers, served over real loopback HTTP (our issue 16).

Every call must answer within its deadline (plus a small margin), never raise, never let
an internal address's body through, and the loop watchdog must see no stall over 50 ms.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest

from helpers import entered_together
from loop_watchdog import watchdog
from toolrelay import (
    BreakerOptions,
    Dispatcher,
    DispatcherOptions,
    KeyPolicy,
    RetryOptions,
    ToolError,
    ToolRegistry,
)
from toolrelay.chaos.upstream import StandInUpstream
from toolrelay.jsonlimits import json_values
from toolrelay.sources.mcp import McpSource, McpSourceOptions
from toolrelay_plugins import _http, _redirects
from toolrelay_plugins._http import HttpPlugin
from toolrelay_plugins._text import clean_text
from toolrelay_plugins.feeds import FeedsPlugin
from toolrelay_plugins.weather import WeatherPlugin
from toolrelay_plugins.websearch import WebSearchPlugin

pytestmark = pytest.mark.anyio

DEADLINE_S = 2.0
MARGIN_S = 0.5
MAX_STALL_S = 0.05
CAP = 2 * 1024 * 1024
ONCE = KeyPolicy(breaker=BreakerOptions(fail_max=1), retry=RetryOptions(max_attempts=1))
BREAKERS = {"open-meteo": ONCE, "searxng": ONCE, "feeds": ONCE}

BOMBS: dict[str, str] = {
    "comments": "<!--" * 30000,
    "cdata": "<![" * 30000,
    "entities": "&lt;a" * 20000,
    "charrefs": "&#" * 50000,
    "open-tags": "<a " * 5000,
    "unclosed-script": "<script" * 30000,
    "script-ends": "<script>" + "</script " * 20000,
    "bogus-ends": "</" * 30000,
    "lone-lt": "<" * 100000,
}


@pytest.fixture
async def upstream() -> AsyncIterator[StandInUpstream]:
    async with StandInUpstream(host="127.0.0.1", port=0) as up:
        yield up


@asynccontextmanager
async def relay(*plugins: HttpPlugin) -> AsyncIterator[Dispatcher]:
    registry = ToolRegistry()
    for plugin in plugins:
        registry.register(plugin)
    try:
        yield Dispatcher(registry, DispatcherOptions(keys=BREAKERS))
    finally:
        for plugin in plugins:
            await plugin.aclose()


async def call(plugin: HttpPlugin, tool: str, args: Mapping[str, Any]) -> tuple[Any, Dispatcher]:
    """One call under the watchdog: in time, no stall, an envelope (never an exception)."""
    plugin.client._http()  # build the client (and its TLS context: ~30 ms) before watching
    async with relay(plugin) as dispatcher, watchdog() as dog:
        started = time.perf_counter()
        result = await dispatcher.dispatch(tool, json.dumps(args))
        elapsed = time.perf_counter() - started
    got = result.to_model()
    assert elapsed < DEADLINE_S + MARGIN_S, f"answered after {elapsed:.2f} s: {got}"
    assert dog.max_gap < MAX_STALL_S, f"the loop stalled {dog.max_gap * 1000:.0f} ms"
    assert isinstance(got, dict) and isinstance(got.get("ok"), bool)
    return got, dispatcher


def search_body(text: str) -> bytes:
    result = {"url": "https://example.org/a", "title": text, "content": text, "engine": "x"}
    return json.dumps({"query": "q", "results": [result]}).encode()


def geocoder_body(text: str) -> bytes:
    place = {"name": text, "country": text, "latitude": 59.9, "longitude": 10.7}
    return json.dumps({"results": [place]}).encode()


def feed_body(text: str) -> bytes:
    escaped = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return (
        '<?xml version="1.0"?>\n<rss version="2.0"><channel><title>'
        f"{escaped}</title><item><title>{escaped}</title><link>https://example.org/1</link>"
        f"<description>{escaped}</description></item></channel></rss>"
    ).encode()


def padded(make: Callable[[str], bytes], unit: str, size: int) -> bytes:
    """``make(unit * n)`` grown to exactly ``size`` bytes (padded with spaces)."""
    small = len(make(""))
    n = (size - small) // max(1, len(make(unit)) - small)
    body = make(unit * n)
    while len(body) > size:
        n -= 1
        body = make(unit * n)
    return body + b" " * (size - len(body))


UNREADABLE = {
    "ok": False,
    "error_type": "tool_error",
    "message": "searxng sent an answer that could not be read",
    "retryable": False,
}


# -- clean_text itself ---------------------------------------------------------------------
@pytest.mark.serial  # a time ratio with 2 ms of slack
@pytest.mark.parametrize("name", sorted(BOMBS))
def test_clean_text_is_fast_and_total(name: str) -> None:
    """Linear in its window, whatever the input's size: 100× the input costs no more (it is
    cut first), and no window takes long (a quadratic pattern on a 41,000-character window
    would take seconds; the worst case here is ~9 ms on a quiet machine). Each time is the
    best of three, so another process taking the CPU cannot fail the test."""
    for limit in (20, 300, 5000):
        best: dict[int, float] = {}
        for size in (1, 10, 100):
            text = BOMBS[name] * size
            times = []
            for _ in range(3):
                started = time.perf_counter()
                out = clean_text(text, limit)
                times.append(time.perf_counter() - started)
                assert out is None or len(out) <= limit
            best[size] = min(times)
        assert max(best.values()) < 0.1, (name, limit, best)
        assert best[100] < 2 * best[1] + 0.002, (name, limit, best)


def test_clean_text_keeps_normal_text() -> None:
    assert clean_text("<p>a</p><p>b &amp; c</p>", 100) == "a b & c"
    assert clean_text("<style>x{}</style>kept<script>gone()</script>", 100) == "kept"
    assert clean_text("<SCRIPT type=x>gone</Script >kept", 100) == "kept"
    assert clean_text("a<br/>b<!-- c -->d<![CDATA[e]]>f", 100) == "a bdf"
    assert clean_text("1 < 2 and 3 > 2, &lt;b&gt; stays text", 100) == (
        "1 < 2 and 3 > 2, <b> stays text"
    )
    assert clean_text("x&#x202e;y&#0;", 100) == "x y\ufffd"
    assert clean_text("abcdef", 4) == "abc…"


# -- websearch -----------------------------------------------------------------------------
def search(up: StandInUpstream) -> WebSearchPlugin:
    return WebSearchPlugin({"base_url": up.url, "timeout_s": DEADLINE_S})


@pytest.mark.serial  # under the loop watchdog: no stall over 50 ms
@pytest.mark.parametrize("name", sorted(BOMBS))
async def test_search_snippet_bombs(upstream: StandInUpstream, name: str) -> None:
    body = search_body(BOMBS[name])
    upstream.serve_static("/search", body, "application/json")
    got, _ = await call(search(upstream), "web_search", {"query": "q"})
    if json_values(body, _http.MAX_JSON_ITEMS) > _http.MAX_JSON_ITEMS:  # too many to decode
        assert got == UNREADABLE
        return
    (result,) = got["data"]["results"]
    assert result["title"] == result["url"] or len(result["title"]) <= 200
    assert result["snippet"] is None or len(result["snippet"]) <= 300


@pytest.mark.serial  # under the loop watchdog: no stall over 50 ms
@pytest.mark.parametrize("unit", ["<!--", "&lt;a", "<a "])
async def test_search_body_at_the_cap(upstream: StandInUpstream, unit: str) -> None:
    body = padded(search_body, unit, CAP)
    assert len(body) == CAP
    upstream.serve_static("/search", body, "application/json")
    got, _ = await call(search(upstream), "web_search", {"query": "q"})
    assert got["ok"] is True


@pytest.mark.serial  # under the loop watchdog: no stall over 50 ms
async def test_search_body_over_the_cap(upstream: StandInUpstream) -> None:
    upstream.serve_static("/search", padded(search_body, "<!--", CAP + 1), "application/json")
    got, _ = await call(search(upstream), "web_search", {"query": "q"})
    assert got == {
        "ok": False,
        "error_type": "tool_error",
        "message": f"searxng sent more than {CAP} bytes",
        "retryable": False,
    }


@pytest.mark.serial  # under the loop watchdog: no stall over 50 ms
@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"results": [{}] * 100_000}, id="100k-items"),
        pytest.param({"results": [[]] * 300_000}, id="300k-lists"),
        pytest.param(None, id="deep-10000"),
    ],
)
async def test_search_huge_json_is_refused(upstream: StandInUpstream, body: Any) -> None:
    raw = b'{"results": ' + b"[" * 10_000 + b"]" * 10_000 + b"}" if body is None else b""
    upstream.serve_static("/search", raw or json.dumps(body).encode(), "application/json")
    got, _ = await call(search(upstream), "web_search", {"query": "q"})
    assert got == UNREADABLE


@pytest.mark.serial  # under the loop watchdog: no stall over 50 ms
async def test_search_many_junk_results(upstream: StandInUpstream) -> None:
    junk = [{"url": "javascript:x", "title": "<!--" * 5} for _ in range(12_000)]
    good = {"url": "https://example.org/z", "title": "late"}
    body = json.dumps({"results": [*junk, good]}).encode()
    upstream.serve_static("/search", body, "application/json")
    got, _ = await call(search(upstream), "web_search", {"query": "q"})
    assert got == {"ok": True, "data": {"results": []}}


# -- weather's geocoder --------------------------------------------------------------------
def weather(up: StandInUpstream) -> WeatherPlugin:
    return WeatherPlugin({"base_url": up.url, "geocoding_url": up.url, "timeout_s": DEADLINE_S})


@pytest.mark.serial  # under the loop watchdog: no stall over 50 ms
@pytest.mark.parametrize("name", sorted(BOMBS))
async def test_geocoder_name_bombs(upstream: StandInUpstream, name: str) -> None:
    body = geocoder_body(BOMBS[name])
    upstream.serve_static("/v1/search", body, "application/json")
    got, _ = await call(weather(upstream), "weather_current", {"city": "Oslo"})
    if json_values(body, _http.MAX_JSON_ITEMS) > _http.MAX_JSON_ITEMS:
        assert got == {**UNREADABLE, "message": "open-meteo sent an answer that could not be read"}
        return
    assert got["ok"] is True
    place = got["data"]["place"]
    for key in ("name", "country"):
        assert place[key] is None or len(place[key]) <= 80


@pytest.mark.serial  # under the loop watchdog: no stall over 50 ms
async def test_geocoder_body_at_the_cap(upstream: StandInUpstream) -> None:
    upstream.serve_static("/v1/search", padded(geocoder_body, "<!--", CAP), "application/json")
    got, _ = await call(weather(upstream), "weather_current", {"city": "Oslo"})
    assert got["ok"] is True


@pytest.mark.serial  # under the loop watchdog: no stall over 50 ms
@pytest.mark.parametrize(
    "body",
    [
        pytest.param(json.dumps({"results": [{}] * 100_000}).encode(), id="100k-items"),
        pytest.param(b'{"results": ' + b"[" * 10_000 + b"]" * 10_000 + b"}", id="deep-10000"),
    ],
)
async def test_geocoder_huge_json_is_refused(upstream: StandInUpstream, body: bytes) -> None:
    upstream.serve_static("/v1/search", body, "application/json")
    got, _ = await call(weather(upstream), "weather_current", {"city": "Oslo"})
    assert got == {**UNREADABLE, "message": "open-meteo sent an answer that could not be read"}


@pytest.mark.serial  # under the loop watchdog: no stall over 50 ms
async def test_forecast_with_huge_columns(upstream: StandInUpstream) -> None:
    n = 9_000
    body = {
        "timezone": "GMT",
        "daily_units": {
            "temperature_2m_max": "°C",
            "temperature_2m_min": "°C",
            "precipitation_sum": "mm",
        },
        "daily": {
            "time": ["2025-06-01"] * n,
            "temperature_2m_max": [1.0] * n,
            "temperature_2m_min": [0.0] * n,
            "precipitation_sum": [0.0] * n,
            "weather_code": [3] * n,
        },
    }
    upstream.serve_static("/v1/forecast", json.dumps(body).encode(), "application/json")
    got, _ = await call(weather(upstream), "weather_forecast", {"latitude": 1, "longitude": 2})
    assert got["ok"] is True and len(got["data"]["days"]) == 3


# -- feeds ---------------------------------------------------------------------------------
def feeds(**urls: str) -> FeedsPlugin:
    return FeedsPlugin({"feeds": urls, "timeout_s": DEADLINE_S})


@pytest.mark.serial  # under the loop watchdog: no stall over 50 ms
@pytest.mark.parametrize("name", sorted(BOMBS))
async def test_feed_text_bombs(upstream: StandInUpstream, name: str) -> None:
    upstream.serve_static("/feed.xml", feed_body(BOMBS[name]), "application/rss+xml")
    got, _ = await call(feeds(news=f"{upstream.url}/feed.xml"), "feed_latest", {"feed": "news"})
    assert got["ok"] is True
    (item,) = got["data"]["items"]
    assert got["data"]["title"] is None or len(got["data"]["title"]) <= 300
    assert item["summary"] is None or len(item["summary"]) <= 280


@pytest.mark.serial  # under the loop watchdog: no stall over 50 ms
async def test_feed_over_the_cap(upstream: StandInUpstream) -> None:
    upstream.serve_static("/feed.xml", padded(feed_body, "<!--", CAP + 1), "application/rss+xml")
    got, _ = await call(feeds(news=f"{upstream.url}/feed.xml"), "feed_latest", {"feed": "news"})
    assert got["ok"] is False
    assert got["message"] == f"feed 'news' sent more than {CAP} bytes"


# -- feeds: redirects ----------------------------------------------------------------------
class Redirector:
    """A tiny HTTP/1.1 server: ``routes[path] = (status, location or None, body)``."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = 0
        self.routes: dict[str, tuple[int, str | None, bytes]] = {}
        self.hits: list[str] = []

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def _serve(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            data = b""
            with anyio.move_on_after(5):
                while b"\r\n\r\n" not in data and len(data) < 65536:
                    chunk = await stream.receive()
                    data += chunk
            path = data.split(b" ", 2)[1].decode() if data.count(b" ") >= 2 else "/"
            self.hits.append(path)
            status, location, body = self.routes.get(path.split("?")[0], (404, None, b""))
            head = f"HTTP/1.1 {status} X\r\ncontent-length: {len(body)}\r\nconnection: close\r\n"
            if location is not None:
                head += f"location: {location}\r\n"
            if body:
                head += "content-type: application/rss+xml\r\n"
            await stream.send(head.encode() + b"\r\n" + body)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Redirector]:
        listener = await anyio.create_tcp_listener(local_host=self.host, local_port=0)
        self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
        async with listener, anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, self._serve)
            try:
                yield self
            finally:
                tg.cancel_scope.cancel()


SECRET = "SECRET-INSTANCE-CREDENTIALS"
REFUSED = {
    "ok": False,
    "error_type": "tool_error",
    "message": "feed 'news' redirected to an address it may not use",
    "retryable": False,
}


@asynccontextmanager
async def servers() -> AsyncIterator[tuple[Redirector, Redirector]]:
    """The feed host, and an "internal" service (another loopback port) with a secret."""
    async with Redirector().running() as feed, Redirector().running() as internal:
        internal.routes["/latest/meta-data/"] = (200, None, feed_body(SECRET))
        feed.routes["/real.xml"] = (200, None, feed_body("public news"))
        yield feed, internal


@pytest.mark.parametrize(
    "target",
    [
        "http://127.0.0.1:{port}/latest/meta-data/",
        "http://localhost:{port}/latest/meta-data/",
        "http://LOCALHOST.:{port}/latest/meta-data/",
        "http://127.1:{port}/latest/meta-data/",
        "http://[::ffff:127.0.0.1]:{port}/latest/meta-data/",
        "http://[::1]:{port}/latest/meta-data/",
        "http://169.254.169.254/latest/meta-data/",
        "http://[fd00:ec2::254]/latest/meta-data/",
        "http://10.0.0.1/",
        "http://192.168.1.1/",
        "http://0.0.0.0:{port}/latest/meta-data/",
        "ftp://example.org/feed.xml",
        "file:///etc/passwd",
    ],
)
async def test_redirect_chain_to_an_internal_address_is_refused(target: str) -> None:
    async with servers() as (feed, internal):
        feed.routes["/feed.xml"] = (302, "/hop", b"")  # same host: allowed
        feed.routes["/hop"] = (301, target.format(port=internal.port), b"")
        plugin = feeds(news=f"{feed.url}/feed.xml")
        got, dispatcher = await call(plugin, "feed_latest", {"feed": "news"})
    assert SECRET not in json.dumps(got)
    assert got == REFUSED
    assert internal.hits == []
    assert feed.hits == ["/feed.xml", "/hop"]
    assert dispatcher.breakers.state("feeds") == "open"  # counts as a failure (fail_max=1)


async def test_redirects_on_the_configured_host_are_followed() -> None:
    async with servers() as (feed, _):
        feed.routes["/feed.xml"] = (302, "/a", b"")
        feed.routes["/a"] = (307, f"http://127.0.0.1:{feed.port}/real.xml", b"")
        got, _ = await call(feeds(news=f"{feed.url}/feed.xml"), "feed_latest", {"feed": "news"})
    assert got["ok"] is True and got["data"]["title"] == "public news"
    assert feed.hits == ["/feed.xml", "/a", "/real.xml"]


async def test_a_checked_address_is_connected_to_without_resolving_again() -> None:
    """DNS rebinding: a redirect's host is resolved and checked once, and the connection
    then goes to the checked address. ``.invalid`` never resolves (RFC 6761), so the fetch
    can reach the listener only through the pinned address; the Host header keeps the name.
    (A real rebinding DNS server cannot run here; the pin is what defeats one.)"""
    heads: list[str] = []

    async def serve(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            head = b""
            while b"\r\n\r\n" not in head:
                head += await stream.receive()
            heads.append(head.decode())
            await stream.send(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: 2\r\nConnection: close\r\n\r\n{}"
            )

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    client = _http.ServiceClient(_http.HttpSettings(trust_env=False), accept="application/json")
    url = f"http://rebound.invalid:{port}/data"
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, serve)
            with pytest.raises(ToolError):  # unpinned: the name does not resolve
                await client.fetch("svc", url)
            client.pin("rebound.invalid", port, "127.0.0.1")
            body, kind = await client.fetch("svc", url)
            tg.cancel_scope.cancel()
    finally:
        await client.aclose()
        await listener.aclose()
    assert (body, kind) == (b"{}", "application/json")
    assert len(heads) == 1 and f"\r\nhost: rebound.invalid:{port}\r\n" in heads[0].lower()


async def test_a_redirect_loop_gives_up() -> None:
    async with servers() as (feed, _):
        feed.routes["/feed.xml"] = (302, "/feed.xml", b"")
        got, _ = await call(feeds(news=f"{feed.url}/feed.xml"), "feed_latest", {"feed": "news"})
    assert got == {**REFUSED, "message": "feed 'news' redirected too many times"}
    assert len(feed.hits) == 4


async def test_a_redirect_to_an_unknown_host_is_refused() -> None:
    async with servers() as (feed, _):
        feed.routes["/feed.xml"] = (302, "http://no-such-host.invalid/x", b"")
        got, _ = await call(feeds(news=f"{feed.url}/feed.xml"), "feed_latest", {"feed": "news"})
    assert got == REFUSED


def test_internal_addresses() -> None:
    for address in (
        "127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.0.1", "169.254.169.254", "0.0.0.0",
        "100.64.0.1", "::1", "fe80::1%eth0", "fd00:ec2::254", "::ffff:127.0.0.1",
        "2002:7f00:1::", "224.0.0.1", "not an address",
    ):  # fmt: skip
        assert _redirects.internal_address(address), address
    for address in ("93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:53c8", "1.1.1.1"):
        assert not _redirects.internal_address(address), address


# -- the MCP source ------------------------------------------------------------------------
MCP_SERVER = Path(__file__).parent / "servers" / "mcp_test_server.py"
HOSTILE_SERVER = Path(__file__).parent / "servers" / "hand_written_server.py"  # no SDK: fast


def _server_texts() -> dict[str, str]:
    """The hostile server's parser-hostile texts (loaded by path: it is a script)."""
    spec = importlib.util.spec_from_file_location("hand_written_server", HOSTILE_SERVER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return dict(module.HOSTILE)


MCP_HOSTILE_TEXTS = _server_texts()
MCP_TEXTS = sorted(MCP_HOSTILE_TEXTS)
MCP_REFUSED = ["big", "items", "deep", "deep_array"]


def rss_bytes() -> int:
    """This process's resident memory (Linux)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@asynccontextmanager
async def mcp_relay(
    tmp_path: Path,
    *,
    attempts: int = 3,
    backoff_s: float = 1.0,
    timeout_s: float = DEADLINE_S,
) -> AsyncIterator[Dispatcher]:
    """``servers/hand_written_server.py --hostile`` over stdio, registered."""
    record = str(tmp_path / "record.jsonl")
    command = [sys.executable, str(HOSTILE_SERVER), "--record", record, "--hostile"]
    with (tmp_path / "server.log").open("a") as log:
        source = McpSource.stdio(
            command,
            McpSourceOptions(
                breaker_key="hostile", timeout_s=timeout_s, backoff_initial_s=backoff_s
            ),
            errlog=log,
        )
        async with source:
            registry = ToolRegistry()
            registry.register(source)
            yield Dispatcher(
                registry,
                DispatcherOptions(
                    keys={"hostile": KeyPolicy(retry=RetryOptions(max_attempts=attempts))}
                ),
            )


async def mcp_call(dispatcher: Dispatcher, tool: str, args: Mapping[str, Any]) -> dict[str, Any]:
    """One call under the watchdog: in time, no stall, an envelope (never an exception)."""
    async with watchdog() as dog:
        started = time.perf_counter()
        result = await dispatcher.dispatch(tool, json.dumps(args))
        elapsed = time.perf_counter() - started
    got = result.to_model()
    assert elapsed < DEADLINE_S + MARGIN_S, f"answered after {elapsed:.2f} s: {str(got)[:200]}"
    assert dog.max_gap < MAX_STALL_S, f"the loop stalled {dog.max_gap * 1000:.0f} ms"
    assert isinstance(got, dict) and isinstance(got.get("ok"), bool)
    return got


# One server and connection for all the kinds of a test: each assertion is about its own
# call (in time, no stall, the answer whole or refused, the connection still serving), not
# about a fresh connection; a failure names its kind.
@pytest.mark.serial  # under the loop watchdog: no stall over 50 ms
async def test_mcp_parser_hostile_text_passes_without_stalling(
    tmp_path: Path, subtests: pytest.Subtests
) -> None:
    async with mcp_relay(tmp_path) as dispatcher:
        for kind in MCP_TEXTS:
            with subtests.test(kind=kind):
                got = await mcp_call(dispatcher, "hostile", {"kind": kind})
                assert got["ok"] is True, (kind, got.get("message"))
                # passed through whole: nothing parses it
                assert got["data"] == MCP_HOSTILE_TEXTS[kind], kind
    assert [e["arguments"]["kind"] for e in mcp_calls(tmp_path)] == MCP_TEXTS


@pytest.mark.serial  # under the loop watchdog: no stall over 50 ms
async def test_mcp_huge_wide_or_deep_answers_are_refused(
    tmp_path: Path, subtests: pytest.Subtests
) -> None:
    async with mcp_relay(tmp_path) as dispatcher:
        for kind in MCP_REFUSED:
            with subtests.test(kind=kind):
                got = await mcp_call(dispatcher, "hostile", {"kind": kind, "mib": 50})
                assert got["ok"] is False, kind
                assert got["error_type"] == "invalid_output", (kind, got)
                assert got["retryable"] is False, kind
                assert "hostile sent an answer" in got["message"], kind
                again = await mcp_call(dispatcher, "hostile", {"kind": "fine"})  # same connection
                assert again["ok"] is True and again["data"] == "fine: fine", (kind, again)
    # one call each (no retry: a refusal is final), one process for them all
    assert [e["arguments"]["kind"] for e in mcp_calls(tmp_path)] == [
        k for kind in MCP_REFUSED for k in (kind, "fine")
    ]
    assert mcp_starts(tmp_path) == 1


def mcp_events(tmp_path: Path) -> list[dict[str, Any]]:
    """What ``mcp_relay(tmp_path)``'s server recorded."""
    lines = (tmp_path / "record.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def mcp_calls(tmp_path: Path) -> list[dict[str, Any]]:
    return [e for e in mcp_events(tmp_path) if e["event"] == "call"]


def mcp_starts(tmp_path: Path) -> int:
    return len([e for e in mcp_events(tmp_path) if e["event"] == "started"])


@pytest.mark.serial  # under the loop watchdog: no stall over 50 ms
async def test_mcp_answer_without_a_leading_id_drops_the_connection(tmp_path: Path) -> None:
    """The id after the result: the reader cannot say whose answer it was, so it drops
    the connection (every waiting call answered at once) and the next call reconnects.
    The reconnect starts a new server process: on a loaded machine that takes seconds and
    can hold the loop for tens of ms, so neither the stall bound nor the deadline of the
    hostile answer applies to it."""
    # no retry on a new connection; a short back-off, waited out below
    async with mcp_relay(tmp_path, attempts=1, backoff_s=0.2, timeout_s=30) as dispatcher:
        got = await mcp_call(dispatcher, "hostile", {"kind": "big_id_last", "mib": 20})
        assert got["ok"] is False and got["error_type"] == "tool_error", got
        assert got["message"] == "hostile server is not reachable"
        await anyio.sleep(0.3)  # the source's back-off (0.2 s)
        again = (await dispatcher.dispatch("hostile", json.dumps({"kind": "fine"}))).to_model()
    assert again["ok"] is True and again["data"] == "fine: fine", again


@pytest.mark.serial  # under the loop watchdog: no stall over 50 ms
async def test_mcp_huge_answer_leaves_other_calls_and_memory_alone(tmp_path: Path) -> None:
    """A 20 MiB answer is refused while it is read: another upstream's calls meanwhile stay
    fast, the loop never stalls, and the memory is given back (the SDK's own reader took
    11.7 s for this, stalled every client and kept ~240 MB)."""
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    # two independent servers: started side by side
    relays = entered_together(mcp_relay(tmp_path), mcp_relay(other_dir))
    async with relays as (hostile, other):
        await mcp_call(other, "hostile", {"kind": "warm"})  # warm both paths up
        await mcp_call(hostile, "hostile", {"kind": "fine"})
        before = rss_bytes()
        answers: list[dict[str, Any]] = []

        async def meanwhile() -> None:
            for n in range(20):
                call = json.dumps({"kind": f"n{n}"})  # answered "fine: n<n>"
                answers.append((await other.dispatch("hostile", call)).to_model())

        async with watchdog() as dog, anyio.create_task_group() as tg:
            tg.start_soon(meanwhile)
            for _ in range(3):
                got = await hostile.dispatch("hostile", json.dumps({"kind": "big", "mib": 20}))
                assert got.to_model()["error_type"] == "invalid_output"
        assert dog.max_gap < MAX_STALL_S, f"the loop stalled {dog.max_gap * 1000:.0f} ms"
        assert [a.get("data") for a in answers] == [f"fine: n{n}" for n in range(20)]
        gc.collect()
        growth = rss_bytes() - before
        assert growth < 60 * 1024 * 1024, f"RSS grew {growth / 2**20:.0f} MiB"
        again = await mcp_call(hostile, "hostile", {"kind": "fine"})
    assert again["ok"] is True


async def test_mcp_http_huge_answer_is_refused(tmp_path: Path, subtests: pytest.Subtests) -> None:
    """Over streamable HTTP, answered as SSE and as JSON: a server each, started at once."""
    ports = {"sse": _free_port(), "json": _free_port()}
    processes: list[anyio.abc.Process] = []
    with (tmp_path / "server.log").open("a") as log:
        try:
            for answers, port in ports.items():
                command = [sys.executable, str(MCP_SERVER), "--record", str(tmp_path / answers)]
                command += ["--http", str(port), *(["--json"] if answers == "json" else [])]
                processes.append(await anyio.open_process(command, stdout=log, stderr=log))
            for answers, port in ports.items():
                await _wait_for_port(port)
                with subtests.test(answers=answers):
                    await _check_http_huge_answer(port)
        finally:
            for process in processes:
                process.kill()
                with anyio.move_on_after(10):
                    await process.wait()


async def _check_http_huge_answer(port: int) -> None:
    source = McpSource.http(
        f"http://127.0.0.1:{port}/mcp",
        McpSourceOptions(breaker_key="big", timeout_s=10, max_message_bytes=2 * 1024 * 1024),
    )
    async with source:
        registry = ToolRegistry()
        registry.register(source)
        dispatcher = Dispatcher(registry)
        started = time.perf_counter()
        got = (await dispatcher.dispatch("big", json.dumps({"mib": 20}))).to_model()
        elapsed = time.perf_counter() - started
        assert got["ok"] is False and got["error_type"] == "invalid_output", got
        assert elapsed < 10, elapsed  # answered, not left to the deadline
        again = (await dispatcher.dispatch("structured", '{"n": 2}')).to_model()
        assert again["ok"] is True and again["data"] == {"n": 2, "doubled": 4}
        assert source.connects == 1  # the refusal kept the session


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _wait_for_port(port: int, limit_s: float = 15.0) -> None:
    with anyio.fail_after(limit_s):
        while True:
            try:
                stream = await anyio.connect_tcp("127.0.0.1", port)
            except OSError:
                await anyio.sleep(0.05)
                continue
            await stream.aclose()
            return


async def test_the_watchdog_sees_the_loop_held_and_not_the_run_queue() -> None:
    """The harness itself: a blocking sleep and a busy loop on the event loop are stalls;
    time waiting for a CPU (run-queue delay) is taken out of the gap."""
    async with watchdog() as held:
        await anyio.sleep(0.02)
        time.sleep(0.1)  # noqa: ASYNC251 -- holds the loop without using a CPU
        await anyio.sleep(0.02)
    assert held.max_gap >= 0.09, held
    async with watchdog() as busy:
        await anyio.sleep(0.02)
        end = time.perf_counter() + 0.1
        while time.perf_counter() < end:  # holds the loop on a CPU
            pass
        await anyio.sleep(0.02)
    assert busy.max_gap >= 0.09 - (busy.max_wall_gap - busy.max_gap), busy
    async with watchdog() as idle:
        await anyio.sleep(0.1)
    assert idle.max_gap <= idle.max_wall_gap and idle.ticks > 0, idle
