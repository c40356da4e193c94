"""Health of the upstream MCP servers behind ``toolrelay serve`` (issue 19).

Real upstream processes, killed, stopped and restarted under a real gateway: ``/readyz``
turns not ready and ready again, ``toolrelay_mcp_upstream_up`` and the connection-failure
counter follow, and the periodic ``ping`` notices a dead or hung upstream and brings it back
without any client's call. An optional upstream that is down does not make it not ready.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client

from redis_server import free_port
from test_serve_mcp import TOKEN, HttpServer, start_http_server, stop_http_server
from toolrelay.chaos.upstream import StandInUpstream

ROOT = Path(__file__).resolve().parent.parent
MCP_TEST_SERVER = ROOT / "tests" / "servers" / "mcp_test_server.py"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


def http_upstream(port: int, record: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, str(MCP_TEST_SERVER), "--record", str(record), "--http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/mcp", timeout=1)
            return proc
        except httpx.TransportError:
            time.sleep(0.05)
    proc.kill()
    raise AssertionError("the HTTP upstream did not start")


def running(record: Path) -> set[int]:
    """The pids of the stdio upstreams started with ``--record record`` (not zombies)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(record).encode() in argv and b"--http" not in argv:
            found.add(int(entry.name))
    return found


def readyz(server: HttpServer) -> tuple[int, dict[str, Any]]:
    response = httpx.get(server.admin.url + "/readyz", headers=ADMIN, timeout=10)
    return response.status_code, response.json()


def states(body: dict[str, Any]) -> dict[str, str]:
    return {u["name"]: u["state"] for u in body.get("upstreams", [])}


def metric(server: HttpServer, name: str, upstream: str) -> float:
    text = httpx.get(server.admin.url + "/metrics", headers=ADMIN, timeout=10).text
    for line in text.splitlines():
        if line.startswith(f'{name}{{upstream="{upstream}"}} '):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} for {upstream}")


def wait_for(check: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def upstream() -> Iterator[StandInUpstream]:
    with StandInUpstream().run_in_thread() as up:
        yield up


@pytest.fixture(scope="module")
def gateway(
    upstream: StandInUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[HttpServer, dict[str, Any]]]:
    """A gateway over a stdio upstream (``local``), an HTTP one (``remote``, a process of
    the module's) and an optional one nobody serves (``spare``), pinging every 0.5 s. The
    tests that use it share it (a start costs seconds of CPU): each leaves it ready, every
    upstream connected again."""
    tmp_path = tmp_path_factory.mktemp("gateway")
    port = free_port()
    records = {"local": tmp_path / "local.jsonl", "remote": tmp_path / "remote.jsonl"}
    remote = http_upstream(port, records["remote"])
    command = [sys.executable, str(MCP_TEST_SERVER), "--record", str(records["local"])]
    extra = f"""
[serve.upstreams.local]
command = {json.dumps(command)}
breaker_key = "mcp-local"
prefix = "local"
connect_timeout_s = 3
[serve.upstreams.remote]
url = "http://127.0.0.1:{port}/mcp"
breaker_key = "mcp-remote"
prefix = "remote"
connect_timeout_s = 3
[serve.upstreams.spare]
url = "http://127.0.0.1:{free_port()}/mcp"
breaker_key = "mcp-spare"
optional = true
connect_timeout_s = 1
"""
    server = start_http_server(tmp_path, upstream.url, extra, serve_extra="ping_interval_s = 0.5\n")
    procs = {"remote": remote}
    try:
        yield server, {"records": records, "port": port, "procs": procs}
    finally:
        try:
            stop_http_server(server)
        finally:
            for proc in procs.values():
                proc.kill()
                proc.wait(10)


def pid_through_the_gateway(server: HttpServer, tool: str) -> int | None:
    """A client's ``tools/call`` of the upstream's ``pid`` tool: its pid, or None (an error)."""

    async def call() -> int | None:
        async with Client(server.mcp_url, cache=None) as client:
            result = await client.call_tool(tool, {})
        if result.is_error:
            return None
        assert isinstance(result.structured_content, dict), result
        return int(result.structured_content["pid"])

    return anyio.run(call)


def test_failures_inside_clients_calls_are_counted_with_no_ping(
    upstream: StandInUpstream, tmp_path: Path
) -> None:
    """A connection lost in a client's call, and reconnects that fail inside clients' calls,
    are counted where they happen: no ping runs, no scrape sees the upstream down (it is
    connected again by the next one), and the counter still has every failure the gateway
    logged."""
    down = tmp_path / "down"  # while it exists, the upstream exits at once
    script = (
        "import os, runpy, sys\n"
        f"if os.path.exists({str(down)!r}): sys.exit(1)\n"
        f"sys.argv = [{str(MCP_TEST_SERVER)!r}, '--record', {str(tmp_path / 'r.jsonl')!r}]\n"
        f"runpy.run_path({str(MCP_TEST_SERVER)!r}, run_name='__main__')\n"
    )
    extra = f"""
[serve.upstreams.flaky]
command = {json.dumps([sys.executable, "-c", script])}
breaker_key = "mcp-flaky"
prefix = "flaky"
[breakers.mcp-flaky]
max_attempts = 1
fail_max = 100
"""
    server = start_http_server(
        tmp_path, upstream.url, extra, serve_extra="ping_interval_s = 3600\n"
    )
    failures = "toolrelay_mcp_upstream_connection_failures_total"
    try:
        first = pid_through_the_gateway(server, "flaky__pid")
        assert first is not None and metric(server, failures, "flaky") == 0
        down.touch()
        os.kill(first, signal.SIGKILL)
        assert pid_through_the_gateway(server, "flaky__pid") is None  # lost in this call
        time.sleep(1.2)  # the back-off
        assert pid_through_the_gateway(server, "flaky__pid") is None  # its reconnect fails
        down.unlink()
        wait_for(lambda: pid_through_the_gateway(server, "flaky__pid") is not None, "back")

        status, body = readyz(server)
        assert status == 200 and states(body) == {"flaky": "connected"}
        assert metric(server, "toolrelay_mcp_upstream_up", "flaky") == 1
        log = server.errlog.read_text()
        lost = log.count("MCP server flaky is not reachable")
        failed = log.count("could not connect to MCP server flaky")
        assert lost == 1 and failed == 1, log
        assert metric(server, failures, "flaky") == lost + failed
        (flaky,) = body["upstreams"]
        assert flaky["failures"] == lost + failed and flaky["last_error"]
    finally:
        stop_http_server(server)


def test_readyz_and_metrics_follow_an_http_upstream_killed_and_restarted(
    gateway: tuple[HttpServer, dict[str, Any]],
) -> None:
    server, env = gateway
    status, body = readyz(server)
    assert status == 200 and body["ready"] is True, body
    assert states(body) == {"local": "connected", "remote": "connected", "spare": "down"}
    spare = next(u for u in body["upstreams"] if u["name"] == "spare")
    assert spare["optional"] is True and spare["last_error"]
    assert metric(server, "toolrelay_mcp_upstream_up", "remote") == 1
    failures = metric(server, "toolrelay_mcp_upstream_connection_failures_total", "remote")

    env["procs"]["remote"].kill()
    env["procs"]["remote"].wait(10)
    wait_for(lambda: readyz(server)[0] == 503, "not ready after the upstream died")
    status, body = readyz(server)
    assert body["ready"] is False and "remote" in body["reason"] and "local" not in body["reason"]
    assert states(body)["remote"] != "connected" and states(body)["local"] == "connected"
    assert metric(server, "toolrelay_mcp_upstream_up", "remote") == 0
    assert metric(server, "toolrelay_mcp_upstream_up", "local") == 1
    now = metric(server, "toolrelay_mcp_upstream_connection_failures_total", "remote")
    assert now > failures

    env["procs"]["remote"] = http_upstream(env["port"], env["records"]["remote"])
    wait_for(lambda: readyz(server)[0] == 200, "ready again after the upstream came back")
    assert states(readyz(server)[1])["remote"] == "connected"
    assert metric(server, "toolrelay_mcp_upstream_up", "remote") == 1


def test_ping_notices_a_hung_stdio_upstream_and_replaces_it(
    gateway: tuple[HttpServer, dict[str, Any]],
) -> None:
    server, env = gateway
    wait_for(lambda: readyz(server)[0] == 200, "ready")
    (hung,) = running(env["records"]["local"])
    os.kill(hung, signal.SIGSTOP)  # alive, holding its pipes, answering nothing
    try:
        wait_for(lambda: readyz(server)[0] == 503, "not ready with a hung upstream")
        _, body = readyz(server)
        assert "local" in body["reason"]
        local = next(u for u in body["upstreams"] if u["name"] == "local")
        assert local["failures"] >= 1 and "ping" in local["last_error"]
        assert metric(server, "toolrelay_mcp_upstream_up", "local") == 0
        # the gateway stops the hung process and starts a new one, with no call to prompt it
        wait_for(lambda: readyz(server)[0] == 200, "ready with a new upstream process")
        assert running(env["records"]["local"]) - {hung}
        assert metric(server, "toolrelay_mcp_upstream_up", "local") == 1
        # and the hung one is killed, not left behind
        wait_for(lambda: hung not in running(env["records"]["local"]), "the hung one gone")
    finally:
        if Path(f"/proc/{hung}").exists():
            os.kill(hung, signal.SIGKILL)
