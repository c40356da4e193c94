"""Hot reload of ``toolrelay serve``: SIGHUP, ``POST /reload`` and the file watch.

Every test runs a real ``python -m toolrelay serve`` and talks to it with the MCP SDK's
client; the config file is rewritten between steps, as an operator would, and the
sessions opened before a reload are used after it (same ``Mcp-Session-Id``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp.types as types
import pytest
from mcp import ClientSession

from test_serve_mcp import (
    OPS_TOKEN,
    ROOT,
    SUPPORT_TOKEN,
    TOKEN,
    WEATHER,
    HttpServer,
    Notifications,
    config_text,
    http_session,
    names,
    start_http_server,
    stdio_session,
    stop_http_server,
)
from toolrelay.chaos.upstream import StandInUpstream

SUPPORT = """
[serve.http.clients.support]
token_env = "SUPPORT_TOKEN"
profile = "support"
"""
OPS = """
[serve.http.clients.ops]
token_env = "OPS_TOKEN"
profile = "all"
"""
SEARXNG = """
[keys.searxng.breaker]
fail_max = 1
reset_timeout_s = 600
"""
NARROW = 'allow = ["weather_current"]'
WIDE = 'allow = ["weather_current", "weather_forecast"]'
TEST_SERVER = [sys.executable, str(ROOT / "tests" / "servers" / "mcp_test_server.py")]


def upstream_table(record: Path) -> str:
    """``[serve.upstreams.test]``: the SDK test server over stdio, its tools as ``up__*``."""
    command = [*TEST_SERVER, "--record", str(record)]
    return f"""
[serve.upstreams.test]
command = {json.dumps(command)}
breaker_key = "mcp-test"
prefix = "up"
timeout_s = 10
"""


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


def write(
    path: Path, upstream_url: str, *, transport: str, extra: str = "", serve: str = ""
) -> None:
    """The config file as ``start_http_server`` writes it, then changed by the test."""
    text = config_text(upstream_url, transport=transport, extra=extra)
    path.write_text(text.replace("[serve]\n", "[serve]\n" + serve, 1))


def narrowed(path: Path, narrow: bool) -> None:
    """Change the ``support`` profile: only ``weather_current`` (or both weather tools)."""
    text = path.read_text()
    path.write_text(text.replace(WIDE, NARROW) if narrow else text.replace(NARROW, WIDE))


async def reload(server: HttpServer) -> dict[str, Any]:
    result: dict[str, Any] = await server.admin.call("POST", "/reload")
    return result


async def running(server: HttpServer) -> tuple[str, list[str]]:
    """The config hash ``/readyz`` reports, and those ``toolrelay_config_info`` is 1 for."""
    async with httpx.AsyncClient(timeout=10) as http:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        ready = (await http.get(server.admin.url + "/readyz", headers=headers)).json()
        metrics = (await http.get(server.admin.url + "/metrics", headers=headers)).text
    info = re.findall(r'^toolrelay_config_info\{hash="([0-9a-f]+)"\} 1\.0$', metrics, re.M)
    return ready["config_hash"], info


async def refused(server: HttpServer) -> httpx.Response:
    async with httpx.AsyncClient(timeout=30) as http:
        return await http.post(
            server.admin.url + "/reload", headers={"Authorization": f"Bearer {TOKEN}"}
        )


async def changed(notes: Notifications) -> None:
    with anyio.fail_after(10):
        await notes.changed.wait()
    notes.rearm()


async def works(session: ClientSession, tool: str, args: dict[str, Any]) -> bool:
    """Did the call succeed (its data is passed through as it is)?"""
    return not (await session.call_tool(tool, args)).is_error


async def envelope(session: ClientSession, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    """The answer envelope of a failed call (as structured content, or as its text)."""
    result = await session.call_tool(tool, args)
    assert result.is_error, result
    if result.structured_content is not None:
        return dict(result.structured_content)
    assert isinstance(result.content[0], types.TextContent)
    found: dict[str, Any] = json.loads(result.content[0].text)
    return found


@pytest.fixture
def server(upstream: StandInUpstream, tmp_path: Path) -> Iterator[HttpServer]:
    started = start_http_server(tmp_path, upstream.url, SUPPORT + OPS + SEARXNG)
    yield started
    stop_http_server(started)


@pytest.mark.anyio
async def test_profiles_breakers_and_faults_change_live(
    server: HttpServer, upstream: StandInUpstream, tmp_path: Path
) -> None:
    config, admin = tmp_path / "toolrelay.toml", server.admin
    async with (
        http_session(server.mcp_url, SUPPORT_TOKEN) as (support, notes),
        http_session(server.mcp_url, OPS_TOKEN) as (ops, _),
    ):
        assert names(await support.list_tools()) == WEATHER
        assert await works(ops, "weather_current", {"city": "Oslo"})  # its breaker exists
        # an open breaker of a key whose settings do not change
        await admin.call("PUT", "/faults", {"kind": "error", "breaker_key": "searxng"})
        assert not await works(ops, "web_search", {"query": "x"})
        assert (await admin.call("GET", "/breakers/searxng"))["state"] == "open"
        await admin.call("DELETE", "/faults")

        # POST /reload: a narrower profile, another key's threshold, a fault from the file
        narrowed(config, True)
        text = config.read_text().replace("fail_max = 2", "fail_max = 3")
        config.write_text(text + '\n[[faults]]\nkind = "error"\ntool = "weather_forecast"\n')
        report = await reload(server)
        assert {"profiles.support.allow", "keys.open-meteo.breaker.fail_max", "faults"} <= set(
            report["changed"]
        )
        assert report["profiles"] == ["support"] and report["breakers"] == ["open-meteo"]
        await changed(notes)
        assert names(await support.list_tools()) == {"weather_current"}
        assert await works(support, "weather_current", {"city": "Oslo"})
        searxng = await admin.call("GET", "/breakers/searxng")
        assert searxng["state"] == "open" and searxng["retry_after_s"] > 500
        forecast = await envelope(ops, "weather_forecast", {"city": "Oslo"})
        assert forecast["error_type"] == "tool_error" and forecast["message"] == "injected fault"
        # the new threshold counts: two failures keep open-meteo closed, the third opens it
        await admin.call("POST", "/breakers/open-meteo/close")  # the forecast's failure
        fault = {"kind": "exception", "breaker_key": "open-meteo"}  # counted, never retried
        await admin.call("PUT", "/faults", fault)
        for _ in range(2):
            assert not await works(ops, "weather_current", {"city": "Oslo"})
        assert (await admin.call("GET", "/breakers/open-meteo"))["state"] == "closed"
        assert not await works(ops, "weather_current", {"city": "Oslo"})
        assert (await admin.call("GET", "/breakers/open-meteo"))["state"] == "open"
        await admin.call("POST", "/breakers/open-meteo/reset")
        await changed(notes)  # the support list lost and got back weather_current

        # SIGHUP: the profile back, the file's fault gone (with the admin-added one)
        narrowed(config, False)
        config.write_text(config.read_text().split("\n[[faults]]")[0])
        server.proc.send_signal(signal.SIGHUP)
        await changed(notes)  # (or a late one of the breaker's two: wait for the list)
        with anyio.fail_after(10):
            while names(await support.list_tools()) != WEATHER:  # noqa: ASYNC110 - polls
                await anyio.sleep(0.05)
        assert (await admin.call("GET", "/faults"))["faults"] == []
        assert await works(support, "weather_forecast", {"city": "Oslo"})
    assert "reloaded" in server.errlog.read_text()


@pytest.mark.anyio
async def test_client_tokens_and_upstreams_are_added_and_removed(
    upstream: StandInUpstream, tmp_path: Path
) -> None:
    config = tmp_path / "toolrelay.toml"
    upstream_conf = upstream_table(tmp_path / "calls.jsonl")
    server = start_http_server(tmp_path, upstream.url, SUPPORT)
    try:
        async with httpx.AsyncClient(timeout=30) as http:
            ops_post = await http.post(
                server.mcp_url, json={}, headers={"Authorization": f"Bearer {OPS_TOKEN}"}
            )
        assert ops_post.status_code == 401
        async with http_session(server.mcp_url, SUPPORT_TOKEN) as (support, _):
            write(config, upstream.url, transport="http", extra=SUPPORT + OPS + upstream_conf)
            report = await reload(server)
            assert {"serve.http.clients.ops", "serve.upstreams.test"} <= set(report["changed"])
            async with http_session(server.mcp_url, OPS_TOKEN) as (ops, notes):
                assert {"up__structured", "web_search"} <= names(await ops.list_tools())
                doubled = await ops.call_tool("up__structured", {"n": 4})
                assert doubled.structured_content == {"n": 4, "doubled": 8}
                ready = await server.admin.call("GET", "/readyz")
                assert [u["name"] for u in ready["upstreams"]] == ["test"]
                assert names(await support.list_tools()) == WEATHER  # the same session

                # the upstream and the support client go away
                write(config, upstream.url, transport="http", extra=OPS)
                report = await reload(server)
                assert {"serve.http.clients.support", "serve.upstreams.test"} <= set(
                    report["changed"]
                )
                await changed(notes)
                listed = names(await ops.list_tools())
                assert "web_search" in listed and not any(n.startswith("up__") for n in listed)
                gone = await envelope(ops, "up__structured", {"n": 1})
                assert gone["error_type"] == "unknown_tool"
                assert "upstreams" not in await server.admin.call("GET", "/readyz")
            with pytest.raises(Exception):  # noqa: B017, PT011 - the SDK's error for a 401
                with anyio.fail_after(10):
                    await support.list_tools()
    finally:
        stop_http_server(server)


@pytest.mark.anyio
async def test_a_bad_file_is_refused_and_the_old_config_keeps_serving(
    server: HttpServer, tmp_path: Path
) -> None:
    config = tmp_path / "toolrelay.toml"
    good = config.read_text()
    in_force = hashlib.sha256(config.read_bytes()).hexdigest()
    assert await running(server) == (in_force, [in_force])
    async with http_session(server.mcp_url, SUPPORT_TOKEN) as (support, _):
        config.write_text(good + "\n[breakers.x\n")  # not TOML
        answer = await refused(server)
        assert answer.status_code == 422
        assert answer.json()["error"] == "invalid_config"
        assert "not valid TOML" in answer.json()["message"]

        config.write_text(good.replace("fail_max = 2", "fail_max = 0"))  # not a valid value
        answer = await refused(server)
        assert answer.status_code == 422 and "fail_max" in answer.json()["message"]

        config.write_text(good.replace("[serve.http]\nport = 0", "[serve.http]\nport = 1"))
        answer = await refused(server)
        assert answer.status_code == 400 and answer.json()["error"] == "restart_required"
        assert "serve.http.port" in answer.json()["message"]

        config.write_text(good.replace('profile = "support"', 'profile = "nobody"'))
        server.proc.send_signal(signal.SIGHUP)  # the same refusal, through the signal
        with anyio.fail_after(10):
            while server.errlog.read_text().count("reload refused") < 4:  # noqa: ASYNC110
                await anyio.sleep(0.05)

        # nothing was applied: the old config serves the same session
        assert names(await support.list_tools()) == WEATHER
        assert await works(support, "weather_current", {"city": "Oslo"})
        assert (await server.admin.call("GET", "/breakers/open-meteo"))["state"] == "closed"
    lines = [line for line in server.errlog.read_text().splitlines() if "reload refused" in line]
    assert len(lines) == 4 and all("the old config keeps serving" in line for line in lines)
    assert "nobody" in lines[-1]
    # in a fleet, this replica shows it runs the old config, not the file's
    assert await running(server) == (in_force, [in_force])
    config.write_text(good.replace("fail_max = 2", "fail_max = 3"))
    assert (await reload(server))["changed"]  # a good reload converges
    now = hashlib.sha256(config.read_bytes()).hexdigest()
    assert now != in_force and await running(server) == (now, [now])


@pytest.mark.anyio
async def test_reload_under_load_answers_every_call(
    upstream: StandInUpstream, tmp_path: Path
) -> None:
    """100 calls in flight across a reload that changes a profile and a breaker, and
    removes the upstream 20 of them are calling: every call is answered."""
    config = tmp_path / "toolrelay.toml"
    upstream_conf = upstream_table(tmp_path / "calls.jsonl")
    slow = '\n[[faults]]\nkind = "latency"\nbreaker_key = "{}"\nlatency_s = 5.0\n'
    extra = OPS + upstream_conf + slow.format("open-meteo") + slow.format("mcp-test")
    server = start_http_server(tmp_path, upstream.url, extra)
    bulkhead = "[keys.open-meteo.bulkhead]\nmax_concurrent = 100\n"
    text = config.read_text().replace("[profiles.support]\n", bulkhead + "[profiles.support]\n")
    config.write_text(text)  # before any call: the bulkhead's size is fixed at its first call
    await reload(server)
    results: list[types.CallToolResult] = []
    errors: list[BaseException] = []
    try:
        async with (
            http_session(server.mcp_url, OPS_TOKEN) as (first, _),
            http_session(server.mcp_url, OPS_TOKEN) as (second, _),
        ):
            assert "up__structured" in names(await first.list_tools())

            async def call(session: ClientSession, tool: str, args: dict[str, Any]) -> None:
                try:
                    results.append(await session.call_tool(tool, args))
                except Exception as exc:
                    errors.append(exc)

            async with anyio.create_task_group() as tg:
                for i in range(100):
                    session = first if i % 2 else second
                    if i % 5 == 0:
                        tg.start_soon(call, session, "up__structured", {"n": i})
                    else:
                        tg.start_soon(call, session, "weather_forecast", {"city": "Oslo"})
                with anyio.fail_after(30):  # every call is in flight (5 s of latency each)
                    while await server.admin.metric("toolrelay_tool_inflight") < 100:  # noqa: ASYNC110
                        await anyio.sleep(0.02)
                text = config.read_text().replace("fail_max = 2", "fail_max = 4")
                config.write_text(text.replace(upstream_conf, "").replace(WIDE, NARROW))
                report = await reload(server)
                assert "serve.upstreams.test" in report["changed"]
            assert errors == []
            assert len(results) == 100
            bad = [r.content for r in results if r.is_error]
            assert bad == []  # the removed upstream answered its calls in flight
            # the sessions go on, under the new config
            assert "up__structured" not in names(await first.list_tools())
            assert await works(second, "web_search", {"query": "x"})
    finally:
        stop_http_server(server)


def _pid_of(config: Path) -> int:
    """The ``toolrelay serve`` process the SDK's stdio client spawned with ``config``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(config).encode() in argv and b"serve" in argv:
            return int(entry.name)
    raise AssertionError("no toolrelay serve process found")


@pytest.mark.anyio
@pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="no SIGHUP here")
async def test_stdio_reloads_on_sighup_and_on_a_changed_file(
    upstream: StandInUpstream, tmp_path: Path
) -> None:
    config = tmp_path / "toolrelay.toml"
    write(config, upstream.url, transport="stdio", extra=SEARXNG)
    async with stdio_session(config, tmp_path, "--profile", "support") as (session, admin, notes):
        assert names(await session.list_tools()) == WEATHER
        narrowed(config, True)
        os.kill(_pid_of(config), signal.SIGHUP)
        await changed(notes)
        assert names(await session.list_tools()) == {"weather_current"}
        assert await works(session, "weather_current", {"city": "Oslo"})
        # reload_watch_s: the file is watched from now on (itself a live setting)
        text = config.read_text().replace("[serve]\n", "[serve]\nreload_watch_s = 0.2\n", 1)
        config.write_text(text)
        os.kill(_pid_of(config), signal.SIGHUP)
        with anyio.fail_after(10):
            while (tmp_path / "serve.err").read_text().count("reloaded") < 2:  # noqa: ASYNC110
                await anyio.sleep(0.05)
        narrowed(config, False)
        await changed(notes)
        assert names(await session.list_tools()) == WEATHER
        assert (await admin.call("GET", "/breakers"))["breakers"]


@pytest.mark.anyio
async def test_a_fifo_or_a_huge_file_at_the_config_path_freezes_nothing(
    upstream: StandInUpstream, tmp_path: Path
) -> None:
    server = start_http_server(tmp_path, upstream.url, SUPPORT, "reload_watch_s = 0.1\n")
    config = tmp_path / "toolrelay.toml"
    good = config.read_text()
    try:
        config.unlink()
        os.mkfifo(config)  # nobody ever writes to it: reading it would wait forever
        await anyio.sleep(0.5)  # the file watch has looked at it a few times
        async with httpx.AsyncClient(timeout=5) as http:
            assert (await http.get(server.admin.url + "/healthz")).status_code == 200
            answer = await http.post(
                server.admin.url + "/reload", headers={"Authorization": f"Bearer {TOKEN}"}
            )
            assert answer.status_code == 422, answer.text
            assert "not a regular file" in answer.json()["message"]

            config.unlink()
            config.write_text(good + "#" * (1 << 20) + "\n")  # valid TOML, over 1 MiB
            answer = await http.post(
                server.admin.url + "/reload", headers={"Authorization": f"Bearer {TOKEN}"}
            )
            assert answer.status_code == 422, answer.text
            assert "larger than 1048576 bytes" in answer.json()["message"]

        config.write_text(good)
        assert (await reload(server))["changed"] == []
    finally:
        stop_http_server(server)
    refusals = [line for line in server.errlog.read_text().splitlines() if "refused" in line]
    assert any("not a regular file" in line for line in refusals)  # the watch said so too
