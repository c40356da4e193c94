"""The stand-in upstream: real formats, every fault kind, seeded rates, a robust admin."""

from __future__ import annotations

import json
import socket
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator

import anyio
import httpx
import pytest

from toolrelay import cli
from toolrelay.chaos.upstream import FAULT_KINDS, FaultError, StandInUpstream

pytestmark = pytest.mark.anyio

FORECAST = {
    "latitude": "59.91",
    "longitude": "10.75",
    "current": "temperature_2m,precipitation,wind_speed_10m,weather_code",
    "daily": "temperature_2m_max,temperature_2m_min,precipitation_sum,weather_code",
    "forecast_days": "3",
    "timezone": "Europe/Oslo",
}


@pytest.fixture
async def upstream() -> AsyncIterator[StandInUpstream]:
    async with StandInUpstream(host="127.0.0.1", port=0) as up:
        yield up


@pytest.fixture
async def client(upstream: StandInUpstream) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=upstream.url, timeout=5, trust_env=False) as c:
        yield c


# -- the real services' formats ---------------------------------------------------------
async def test_forecast_is_shaped_like_open_meteo(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/forecast", params=FORECAST)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert {"latitude", "longitude", "timezone", "utc_offset_seconds", "elevation"} <= set(body)
    assert (body["timezone"], body["utc_offset_seconds"]) == ("Europe/Oslo", 7200)
    assert body["current_units"] == {
        "time": "iso8601",
        "interval": "seconds",
        "temperature_2m": "°C",
        "precipitation": "mm",
        "wind_speed_10m": "km/h",
        "weather_code": "wmo code",
    }
    assert set(body["current"]) == {"time", "interval", *FORECAST["current"].split(",")}
    assert body["current"]["time"] == "2025-06-01T14:00"  # the fixed clock, in Oslo
    assert body["daily"]["time"] == ["2025-06-01", "2025-06-02", "2025-06-03"]
    for name in FORECAST["daily"].split(","):
        assert len(body["daily"][name]) == 3
    again = await client.get("/v1/forecast", params=FORECAST)
    assert again.json() == body  # deterministic
    elsewhere = await client.get("/v1/forecast", params=FORECAST | {"latitude": "-33.87"})
    assert elsewhere.json()["current"] != body["current"]


async def test_forecast_refuses_what_open_meteo_refuses(client: httpx.AsyncClient) -> None:
    missing = await client.get("/v1/forecast", params={"longitude": "10"})
    assert missing.status_code == 400
    assert missing.json() == {"error": True, "reason": "Parameter 'latitude' is missing"}
    assert (await client.get("/v1/forecast?latitude=91&longitude=0")).status_code == 400
    assert (await client.get("/v1/forecast?latitude=1&longitude=1&current=x")).status_code == 400
    zone = await client.get("/v1/forecast?latitude=1&longitude=1&timezone=Mars/Olympus")
    assert zone.status_code == 400


async def test_geocoding(client: httpx.AsyncClient) -> None:
    oslo = (await client.get("/v1/search", params={"name": "oslo", "count": "1"})).json()
    (place,) = oslo["results"]
    assert (place["name"], place["country"], place["timezone"]) == (
        "Oslo",
        "Norway",
        "Europe/Oslo",
    )
    assert isinstance(place["latitude"], float) and isinstance(place["longitude"], float)
    nowhere = (await client.get("/v1/search", params={"name": "Atlantis"})).json()
    assert "results" not in nowhere  # as the real API answers


async def test_searxng_always_has_answers_and_infoboxes(client: httpx.AsyncClient) -> None:
    body = (await client.get("/search", params={"q": "anyio", "format": "json"})).json()
    assert body["query"] == "anyio" and body["number_of_results"] == len(body["results"]) > 0
    first = body["results"][0]
    assert {"title", "url", "content", "engine", "engines", "score", "category"} <= set(first)
    assert body["answers"] and body["infoboxes"]
    for key in ("suggestions", "corrections", "unresponsive_engines"):
        assert body[key] == []
    assert (await client.get("/search", params={"q": "anyio"})).status_code == 403
    assert (await client.get("/search", params={"format": "json"})).status_code == 400


@pytest.mark.parametrize(
    ("path", "item_tag"), [("/feeds/rss.xml", "item"), ("/feeds/atom.xml", "entry")]
)
async def test_feeds_are_well_formed(client: httpx.AsyncClient, path: str, item_tag: str) -> None:
    response = await client.get(path)
    assert "xml" in response.headers["content-type"]
    root = ET.fromstring(response.content)
    items = [el for el in root.iter() if el.tag.rsplit("}", 1)[-1] == item_tag]
    assert len(items) == 5


async def test_unknown_path_and_method(client: httpx.AsyncClient) -> None:
    assert (await client.get("/nope")).status_code == 404
    wrong = await client.post("/v1/forecast", json={})
    assert (wrong.status_code, wrong.headers["allow"]) == (405, "GET")
    head = await client.head("/feeds/rss.xml")
    assert head.status_code == 200 and head.content == b""
    assert (await client.get("/feeds/rss.xml")).status_code == 200  # connection still fine


# -- faults -----------------------------------------------------------------------------
async def test_status_and_rate_limit_faults(
    upstream: StandInUpstream, client: httpx.AsyncClient
) -> None:
    upstream.set_fault("/v1", "status", status=503, retry_after=7)
    unavailable = await client.get("/v1/search?name=Oslo")
    assert (unavailable.status_code, unavailable.headers["retry-after"]) == (503, "7")
    upstream.set_fault("/v1", "status", status=502)
    bad_gateway = await client.get("/v1/search?name=Oslo")
    assert bad_gateway.status_code == 502 and "retry-after" not in bad_gateway.headers
    upstream.set_fault("/v1", "rate_limit")
    limited = await client.get("/v1/search?name=Oslo")
    assert (limited.status_code, limited.headers["retry-after"]) == (429, "1")
    date = "Wed, 21 Oct 2065 07:28:00 GMT"
    upstream.set_fault("/v1", "rate_limit", retry_after=date)
    assert (await client.get("/v1/search?name=Oslo")).headers["retry-after"] == date
    assert (await client.get("/search?q=x&format=json")).status_code == 200  # other paths
    assert upstream.stats["faults"] == {"status": 2, "rate_limit": 2}


async def test_malformed_bodies(upstream: StandInUpstream, client: httpx.AsyncClient) -> None:
    upstream.set_fault("/", "malformed")
    response = await client.get("/v1/search?name=Oslo")
    assert response.status_code == 200
    with pytest.raises(json.JSONDecodeError):
        response.json()
    feed = await client.get("/feeds/rss.xml")
    assert feed.status_code == 200 and "xml" in feed.headers["content-type"]
    with pytest.raises(ET.ParseError):
        ET.fromstring(feed.content)


async def test_delay_and_slow_body(upstream: StandInUpstream, client: httpx.AsyncClient) -> None:
    expected = (await client.get("/feeds/atom.xml")).content
    for kind in ("delay", "slow_body"):
        upstream.set_fault("/feeds", kind, seconds=0.3)
        started = time.perf_counter()
        response = await client.get("/feeds/atom.xml")
        assert response.content == expected, kind
        assert time.perf_counter() - started >= 0.25, kind


async def test_slow_body_arrives_in_pieces(
    upstream: StandInUpstream, client: httpx.AsyncClient
) -> None:
    upstream.set_fault("/feeds", "slow_body", seconds=0.5)
    async with client.stream("GET", "/feeds/rss.xml") as response:
        pieces = [chunk async for chunk in response.aiter_raw()]
    assert len(pieces) > 3


async def test_truncated_reset_and_hang(
    upstream: StandInUpstream, client: httpx.AsyncClient
) -> None:
    upstream.set_fault("/v1/search", "truncated")
    with pytest.raises(httpx.RemoteProtocolError, match="complete message body"):
        await client.get("/v1/search?name=Oslo")
    upstream.set_fault("/v1/search", "reset")
    with pytest.raises((httpx.ReadError, httpx.RemoteProtocolError)):
        await client.get("/v1/search?name=Oslo")
    upstream.set_fault("/v1/search", "hang")
    started = time.perf_counter()
    with pytest.raises(httpx.ReadTimeout):
        await client.get("/v1/search?name=Oslo", timeout=0.3)
    assert time.perf_counter() - started < 5
    upstream.clear_faults()
    assert (await client.get("/v1/search?name=Oslo")).status_code == 200
    assert upstream.stats == {
        "requests": {"/v1/search": 4},
        "faults": {"truncated": 1, "reset": 1, "hang": 1},
    }


async def test_reset_sends_rst() -> None:
    async with StandInUpstream() as up:
        up.set_fault("/", "reset")
        stream = await anyio.connect_tcp("127.0.0.1", up.port)
        async with stream:
            await stream.send(b"GET /v1/search?name=Oslo HTTP/1.1\r\nHost: x\r\n\r\n")
            with pytest.raises(anyio.BrokenResourceError):  # ECONNRESET, not a clean EOF
                await stream.receive()


async def test_most_specific_prefix_wins_and_clearing_one(
    upstream: StandInUpstream, client: httpx.AsyncClient
) -> None:
    upstream.set_fault("/", "status", status=500)
    upstream.set_fault("/v1/search", "status", status=404)
    assert (await client.get("/v1/search?name=Oslo")).status_code == 404
    assert (await client.get("/v1/forecast?latitude=1&longitude=1")).status_code == 500
    upstream.clear_faults("/v1/search")
    assert (await client.get("/v1/search?name=Oslo")).status_code == 500
    assert [f.path for f in upstream.faults] == ["/"]


async def _codes(client: httpx.AsyncClient, n: int) -> list[int]:
    return [(await client.get("/v1/search?name=Oslo")).status_code for _ in range(n)]


async def test_rates_are_seeded_and_reproducible(
    upstream: StandInUpstream, client: httpx.AsyncClient
) -> None:
    upstream.set_fault("/v1", "status", rate=0.5, status=500)
    upstream.seed(7)
    first = await _codes(client, 40)
    assert {200, 500} == set(first)
    assert 8 <= first.count(500) <= 32
    upstream.seed(7)
    assert await _codes(client, 40) == first
    async with StandInUpstream(seed=7) as other, httpx.AsyncClient(base_url=other.url) as c:
        other.set_fault("/v1", "status", rate=0.5, status=500)
        assert await _codes(c, 40) == first
    upstream.set_fault("/v1", "status", rate=0.0, status=500)
    assert set(await _codes(client, 10)) == {200}
    response = await client.post("/_admin/seed", json={"seed": 7})
    assert response.json() == {"seed": 7}
    upstream.set_fault("/v1", "status", rate=0.5, status=500)
    assert await _codes(client, 40) == first


# -- admin --------------------------------------------------------------------------------
async def test_admin_round_trip(upstream: StandInUpstream, client: httpx.AsyncClient) -> None:
    fault = {"path": "/v1/forecast", "fault": "delay", "rate": 0.25, "seconds": 2}
    created = await client.post("/_admin/faults", json=fault)
    assert created.status_code == 200
    assert created.json() == {"fault": {**fault, "rate": 0.25, "seconds": 2.0}}
    await client.post("/_admin/faults", json={"path": "/search", "fault": "rate_limit"})
    listed = (await client.get("/_admin/faults")).json()["faults"]
    assert listed == [
        {"path": "/search", "fault": "rate_limit", "rate": 1.0, "retry_after": "1"},
        {"path": "/v1/forecast", "fault": "delay", "rate": 0.25, "seconds": 2.0},
    ]
    remaining = await client.delete("/_admin/faults", params={"path": "/search"})
    assert [f["path"] for f in remaining.json()["faults"]] == ["/v1/forecast"]
    assert (await client.delete("/_admin/faults")).json() == {"faults": []}
    await client.get("/v1/search?name=x")
    stats = (await client.get("/_admin/stats")).json()
    assert stats == {"requests": {"/v1/search": 1}, "faults": {}}  # admin calls not counted
    assert (await client.delete("/_admin/stats")).json() == {"requests": {}, "faults": {}}


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"path": "/v1", "fault": "explode"}', "'fault' must be one of"),
        (b'{"fault": "hang"}', "'path'"),
        (b'{"path": "v1", "fault": "hang"}', "'path'"),
        (b'{"path": "/_admin", "fault": "hang"}', "admin"),
        (b'{"path": "/", "fault": "hang", "rate": 2}', "'rate'"),
        (b'{"path": "/", "fault": "hang", "rate": "often"}', "'rate'"),
        (b'{"path": "/", "fault": "hang", "rate": NaN}', "'rate'"),
        (b'{"path": "/", "fault": "hang", "rate": true}', "'rate'"),
        (b'{"path": "/", "fault": "delay", "seconds": -1}', "'seconds'"),
        (b'{"path": "/", "fault": "delay", "seconds": 1e9}', "'seconds'"),
        (b'{"path": "/", "fault": "status", "status": 200}', "'status'"),
        (b'{"path": "/", "fault": "status", "status": "500"}', "'status'"),
        (b'{"path": "/", "fault": "hang", "seconds": 1}', "takes no parameter 'seconds'"),
        (b'{"path": "/", "fault": "rate_limit", "retry_after": "1\\r\\nX-Evil: 1"}', "retry_after"),
        (b'{"path": "/", "fault": "rate_limit", "retry_after": -5}', "retry_after"),
        (b'{"path": "/", "fault": "rate_limit", "retry_after": []}', "retry_after"),
        (b"[" * 50_000, "not valid JSON"),
        (b" " * 70_000, "too large"),
    ],
)
async def test_bad_admin_input_is_a_clear_400(
    upstream: StandInUpstream, client: httpx.AsyncClient, body: bytes, needle: str
) -> None:
    response = await client.post("/_admin/faults", content=body)
    assert response.status_code == 400
    assert needle in response.json()["error"]
    assert upstream.faults == []
    assert (await client.get("/v1/search?name=Oslo")).status_code == 200  # still serving


async def test_other_admin_mistakes(client: httpx.AsyncClient) -> None:
    assert (await client.put("/_admin/faults", json={})).status_code == 405
    assert (await client.post("/_admin/stats")).status_code == 405
    assert (await client.get("/_admin/seed")).status_code == 405
    bad_seed = await client.post("/_admin/seed", json={"seed": "x"})
    assert (bad_seed.status_code, bad_seed.json()) == (400, {"error": "'seed' must be an integer"})
    assert (await client.get("/_admin/nothing")).status_code == 404


async def test_oversized_request_body_is_refused(upstream: StandInUpstream) -> None:
    stream = await anyio.connect_tcp("127.0.0.1", upstream.port)
    async with stream:
        await stream.send(
            b"POST /_admin/faults HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000\r\n\r\n"
        )
        reply = await stream.receive()
    assert reply.startswith(b"HTTP/1.1 413 ")


async def test_python_api_validates_like_admin(upstream: StandInUpstream) -> None:
    with pytest.raises(FaultError, match="'rate'"):
        upstream.set_fault("/", "delay", rate=1.5)
    with pytest.raises(ValueError, match="'fault' must be one of"):
        upstream.set_fault("/", "teleport")
    assert set(FAULT_KINDS) == {
        "delay",
        "slow_body",
        "hang",
        "reset",
        "status",
        "rate_limit",
        "malformed",
        "truncated",
        "slow_tail",
        "load",
    }


async def test_garbage_on_the_wire_gets_400_and_server_survives(upstream: StandInUpstream) -> None:
    stream = await anyio.connect_tcp("127.0.0.1", upstream.port)
    async with stream:
        await stream.send(b"\x16\x03\x01 definitely not http\r\n\r\n")
        reply = await stream.receive()
    assert reply.startswith(b"HTTP/1.1 400")
    async with httpx.AsyncClient(base_url=upstream.url) as c:
        assert (await c.get("/v1/search?name=Oslo")).status_code == 200


async def test_serve_static_overrides_a_route(
    upstream: StandInUpstream, client: httpx.AsyncClient
) -> None:
    upstream.serve_static("/feeds/rss.xml", b"<rss/>", "application/rss+xml")
    response = await client.get("/feeds/rss.xml")
    assert (response.content, response.headers["content-type"]) == (
        b"<rss/>",
        "application/rss+xml",
    )
    with pytest.raises(ValueError, match="_admin"):
        upstream.serve_static("/_admin/faults", b"", "text/plain")


async def test_hanging_connection_ends_with_the_server() -> None:
    with anyio.fail_after(5):
        async with StandInUpstream() as up:
            up.set_fault("/", "hang")
            stream = await anyio.connect_tcp("127.0.0.1", up.port)
            await stream.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            await anyio.sleep(0.05)
        # leaving the block cancelled the hanging handler; the client sees the close
        with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
            await stream.receive()
        await stream.aclose()


# -- lifecycle ----------------------------------------------------------------------------
def _port_open(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_run_in_thread_for_sync_callers() -> None:
    before = set(threading.enumerate())
    upstream = StandInUpstream(seed=3)
    with upstream.run_in_thread() as up:
        assert up is upstream
        assert httpx.get(f"{up.url}/v1/search?name=Berlin").json()["results"][0]["name"] == (
            "Berlin"
        )
        up.set_fault("/v1", "status", status=503)
        assert httpx.get(f"{up.url}/v1/search?name=Berlin").status_code == 503
        assert up.stats["faults"] == {"status": 1}
        port = up.port
    # the loop thread is joined (threads other tests left may end meanwhile: count only new ones)
    assert [t for t in threading.enumerate() if t not in before] == []
    assert not _port_open(port)  # and the listener closed


async def test_listener_closes_on_exit() -> None:
    async with StandInUpstream() as up:
        port = up.port
        assert _port_open(port)
    assert not _port_open(port)
    with pytest.raises(RuntimeError, match="not running"):
        _ = up.url


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.1", "example.org"])
def test_only_loopback_by_default(host: str) -> None:
    with pytest.raises(ValueError, match="admin endpoint has no authentication"):
        StandInUpstream(host=host)
    assert cli.main(["chaos", "upstream", "--host", host, "--port", "0"]) == 2


def test_main_reports_a_busy_port(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        assert cli.main(["chaos", "upstream", "--port", str(busy.getsockname()[1])]) == 1
    assert "cannot listen" in capsys.readouterr().err


async def test_slow_tail_delays_a_share_of_requests(
    upstream: StandInUpstream, client: httpx.AsyncClient
) -> None:
    upstream.set_fault("/feeds", "slow_tail", seconds=0.0, tail=0.25, tail_seconds=0.3)
    slow = 0
    for _ in range(40):
        started = anyio.current_time()
        assert (await client.get("/feeds/rss.xml")).status_code == 200
        slow += anyio.current_time() - started >= 0.3
    assert 3 <= slow <= 20  # about a quarter, from the seeded dice
    with pytest.raises(FaultError, match="'tail'"):
        upstream.set_fault("/feeds", "slow_tail", tail=2)
    with pytest.raises(FaultError, match="takes no parameter 'tail'"):
        upstream.set_fault("/feeds", "delay", tail=0.5)
