"""A fleet behind HAProxy beside one replica called directly (issue 31): 1, 2 and 3
``toolrelay serve`` replicas sharing one redis-server, each fleet as deploy/ describes it
(tests/fleet.py starts it; the ``echo`` tool of bench/gateway_echo.py in process).

The load is the gateway bench's light client (:class:`.gateway.clients.LightSession`: h11,
JSON-RPC by hand, a 2025-era session each, which HAProxy balances at ``initialize`` and then
keeps on its replica), 8 sessions calling back to back. Per configuration: calls/s, p50 and
p99, the replicas' CPU per call (all replicas together, from /proc), HAProxy's CPU per call,
and Redis commands per call (``INFO commandstats``: all the replicas sent during the run over
the calls, and beyond what they send idle, which is the periodic count sync). Then breaker
convergence: the ``echo`` breaker forced open (and reset) through replica 1's admin API,
until replicas 2 and 3 show it (their admin API polled), p99 over the transitions.

On 2 cores the calls/s cannot grow with replicas (the client, HAProxy and the replicas share
them); the CPU per call and the convergence are what carry to a bigger machine.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx

from .gateway.clients import Sample, light_sessions, saturate
from .gateway.servers import HERE, TICKS, Server
from .harness import Row, Settings, percentile

TESTS = HERE.parent / "tests"
SESSIONS = 8
IDLE_S = 1.0
TOOLS = """
[plugins.echo]
module = "gateway_echo"
"""


def _fleet_module() -> Any:
    if str(TESTS) not in sys.path:
        sys.path.append(str(TESTS))  # last: nothing of the bench's is shadowed
    import fleet

    return fleet


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def redis_commands(url: str) -> int:
    """Commands Redis has served, ``INFO`` itself left out."""
    import redis

    with contextlib.closing(redis.Redis.from_url(url)) as client:
        stats: dict[str, Any] = client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")


@contextlib.contextmanager
def running_fleet(size: int) -> Iterator[Any]:
    fleet = _fleet_module()
    haproxy = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/sbin")
    redis_server = shutil.which("redis-server")
    if haproxy is None or redis_server is None:
        raise LookupError("haproxy and redis-server are needed")
    with tempfile.TemporaryDirectory(prefix="toolrelay-fleet-") as workdir:
        paths = [str(HERE), str(fleet.TESTS), os.environ.get("PYTHONPATH", "")]
        env = {"PYTHONPATH": os.pathsep.join(p for p in paths if p)}
        with fleet.Fleet(
            Path(workdir), haproxy, redis_server, TOOLS, size=size, tokens=False, env=env
        ) as running:
            yield running


async def measure(fleet: Any, port: int, calls: int, idle_s: float = IDLE_S) -> dict[str, float]:
    """``calls`` calls over 8 light sessions to ``port`` (HAProxy's or a replica's)."""
    server = Server(f"fleet:{port}", [], port, tool="echo")
    server.proc = fleet.replicas[0].proc  # (the Sample's own CPU figure: not used here)
    async with light_sessions(server, SESSIONS) as light:
        await saturate(server, light, SESSIONS * 10)  # warm: connections, breakers, caches
        idle = redis_commands(fleet.redis.url)
        await anyio.sleep(idle_s)  # what the replicas send with no call at all
        idle = (redis_commands(fleet.redis.url) - idle) / idle_s
        pids = [r.pid for r in fleet.replicas]
        lb = fleet.lb.pid
        gateway, proxy = sum(cpu_s(p) for p in pids), cpu_s(lb)
        commands = redis_commands(fleet.redis.url)
        sample: Sample = await saturate(server, light, calls)
        commands = redis_commands(fleet.redis.url) - commands
        if commands < 0:
            raise RuntimeError("Redis restarted during the run")
        gateway = sum(cpu_s(p) for p in pids) - gateway
        proxy = cpu_s(lb) - proxy
    n = sample.calls
    return {
        "rate": n / sample.wall_s,
        "p50_ms": 1000 * percentile(sample.latencies, 50),
        "p99_ms": 1000 * percentile(sample.latencies, 99),
        "gateway_cpu_ms": 1000 * gateway / n,
        "lb_cpu_ms": 1000 * proxy / n if port == fleet.port else 0.0,
        "redis_per_call": commands / n,
        "redis_per_s": commands / sample.wall_s,
        "redis_idle_per_s": idle,
        "redis_calls_per_call": max(0.0, commands - idle * sample.wall_s) / n,
    }


def convergence_ms(fleet: Any, transitions: int) -> list[float]:
    """Force ``echo`` open (then reset) through replica 1; how long until every other
    replica's admin API shows it, each transition."""
    fleet_module = _fleet_module()
    headers = {"Authorization": f"Bearer {fleet_module.ADMIN_TOKEN}"}
    first, *others = fleet.replicas
    delays: list[float] = []
    with httpx.Client(headers=headers, timeout=10) as http:
        for n in range(transitions):
            action, state = ("open", "open") if n % 2 == 0 else ("reset", "closed")
            http.post(f"{first.admin_url}/breakers/echo/{action}").raise_for_status()
            began = time.monotonic()
            waiting = list(others)
            while waiting:
                for replica in list(waiting):
                    view = http.get(f"{replica.admin_url}/breakers/echo").json()
                    if view["state"] == state:
                        delays.append(1000 * (time.monotonic() - began))
                        waiting.remove(replica)
                if time.monotonic() - began > 5:
                    raise RuntimeError(f"the breaker did not reach {state} on {waiting}")
            time.sleep(0.02)
        if transitions % 2:
            http.post(f"{first.admin_url}/breakers/echo/reset").raise_for_status()
    return delays


async def bench_fleet(s: Settings) -> list[Row]:
    """1, 2 and 3 replicas behind HAProxy beside one replica called directly."""
    sizes = (1, 3) if s.quick else (1, 2, 3)
    calls = SESSIONS * (25 if s.quick else 500)
    transitions = 4 if s.quick else 100
    figures: dict[str, dict[str, float]] = {}
    delays: list[float] = []
    try:
        for size in sizes:
            with running_fleet(size) as fleet:
                if size == 1:
                    port = fleet.replicas[0].port
                    figures["direct"] = await measure(fleet, port, calls)
                figures[f"{size} behind HAProxy"] = await measure(fleet, fleet.port, calls)
                if size == 3:
                    delays = await anyio.to_thread.run_sync(convergence_ms, fleet, transitions)
    except LookupError as exc:
        return [Row("fleet", "fleet behind HAProxy", status=f"skipped ({exc})")]
    return fleet_rows(figures, delays, s.quick)


def fleet_rows(figures: dict[str, dict[str, float]], delays: list[float], quick: bool) -> list[Row]:
    direct = figures["direct"]
    rows = []
    for name, f in figures.items():
        context = (
            f"p50 {f['p50_ms']:.2f} ms, p99 {f['p99_ms']:.2f} ms, replicas' CPU "
            f"{f['gateway_cpu_ms']:.2f} ms/call, HAProxy CPU {f['lb_cpu_ms']:.3f} ms/call, "
            f"Redis commands {f['redis_per_call']:.4f}/call ({f['redis_per_s']:.0f}/s)"
        )
        rows.append(
            Row(
                "fleet",
                f"fleet: {name}, {SESSIONS} light sessions",
                f["rate"],
                unit="calls/s",
                context=context,
            )
        )
    for name, f in figures.items():
        if name == "direct":
            continue
        rows.append(
            Row(
                "fleet",
                f"fleet: {name} / one replica direct, calls/s",
                f["rate"] / direct["rate"],
                context="2 cores: capped, see the note",
            )
        )
        rows.append(
            Row(
                "fleet",
                f"fleet: {name} / one replica direct, replicas' CPU a call",
                f["gateway_cpu_ms"] / direct["gateway_cpu_ms"],
            )
        )
        rows.append(
            Row("fleet", f"fleet: {name} / one replica direct, p99", f["p99_ms"] / direct["p99_ms"])
        )
        rows.append(Row("fleet", f"fleet: {name}, HAProxy CPU a call", f["lb_cpu_ms"], unit="ms"))
        extra = f["redis_calls_per_call"]
        rows.append(
            Row(
                "fleet",
                f"fleet: {name}, Redis commands a call, beyond the idle sync",
                extra,
                unit="/call",
                target="≤ 0.05",
                passed=extra <= 0.05,
                in_force=not quick,
                context=f"{f['redis_per_call']:.3f}/call in all; {f['redis_per_s']:.0f}/s "
                f"under load, {f['redis_idle_per_s']:.0f}/s idle (the periodic count sync)",
            )
        )
    if delays:
        p99 = (
            statistics.quantiles(delays, n=100, method="inclusive")[98]
            if len(delays) > 1
            else delays[0]
        )
        rows.append(
            Row(
                "fleet",
                "fleet: breaker convergence across 3 replicas, p99",
                p99,
                unit="ms",
                target="≤ 200 ms",
                passed=p99 <= 200,
                in_force=not quick,
                context=f"p50 {statistics.median(delays):.1f} ms, max {max(delays):.1f} ms, "
                f"{len(delays)} observations (admin API polled)",
            )
        )
    return rows
