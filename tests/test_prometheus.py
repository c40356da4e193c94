"""A real Prometheus scrapes real toolrelay processes; every dashboard query returns data."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import textwrap
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from conftest import need_binary
from redis_server import RedisServer, free_port
from test_serve_mcp import (
    TOKEN,
    HttpServer,
    http_session,
    launch_http_server,
    stop_http_server,
    wait_for_http_server,
)
from toolrelay.catalog import dumps, lock_of
from toolrelay.chaos.upstream import StandInUpstream

pytestmark = pytest.mark.servers

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "dashboards" / "toolrelay.json"
ALERTS = ROOT / "dashboards" / "alerts.yml"
SUBSTITUTIONS = {
    "$__rate_interval": "30s",
    "${datasource}": "",
    "$datasource": "",
    "$job": "toolrelay",
    "$instance": ".*",
}

# A second target: tests/workload.py has consecutive-window breakers only, so the
# failure-rate window gauges (and a break that can grow) come from this one.
RATE_WORKLOAD = textwrap.dedent(
    """
    import random, sys, threading, time
    import anyio, redis
    from toolrelay import (BreakerOptions, Dispatcher, DispatcherOptions, KeyPolicy,
                           RetryOptions, StorageOptions, ToolError, ToolRegistry)
    from toolrelay.telemetry import serve_metrics

    registry = ToolRegistry()
    rng = random.Random(5)

    @registry.tool(name="search", parameters={"type": "object"}, breaker_key="search-api")
    async def search(args, ctx):
        roll = rng.random()
        if roll < 0.4:
            raise ToolError("upstream 503", retryable=True)
        await anyio.sleep(0.03 if roll < 0.6 else 0.001)
        return {"hits": []}

    @registry.tool(name="ledger", parameters={"type": "object"}, breaker_key="ledger")
    async def ledger(args, ctx):
        time.sleep(0.03)  # a blocking async handler: it holds the event loop
        return {}

    async def main(port, seconds):
        search_api = KeyPolicy(
            breaker=BreakerOptions(window="count", window_size=20, minimum_calls=10,
                                   failure_rate=0.5, slow_call_s=0.02, slow_call_rate=0.8,
                                   reset_timeout_s=0.2, reset_timeout_max_s=0.8),
            retry=RetryOptions(max_attempts=1))
        # a value no toolrelay wrote, in the shared state of the ledger key
        redis.Redis.from_url(url).hset("toolrelay:ledger", mapping={"gen": "1", "state": "?"})
        options = DispatcherOptions(
            keys={"search-api": search_api},
            storage=StorageOptions(url=url, sync_interval_s=0.05),
        )
        dispatcher = Dispatcher(registry, options, audit=None)
        server = serve_metrics(port)
        stop_at = time.monotonic() + seconds
        try:
            while time.monotonic() < stop_at:
                await dispatcher.dispatch("search", "{}")
                await dispatcher.dispatch("ledger", "{}")
                await anyio.sleep(0.01)
        finally:
            server.shutdown()

    url = sys.argv[3]
    anyio.run(main, int(sys.argv[1]), float(sys.argv[2]))
    """
)


def dashboard_queries() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, value in SUBSTITUTIONS.items():
                expr = expr.replace(variable, value)
            assert "$" not in expr, expr
            queries.append((panel["title"], expr))
    return queries


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def get(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as response:
            return json.loads(response.read())

    def query(self, expr: str) -> list[Any]:
        answer = self.get("/api/v1/query", query=expr)
        assert answer["status"] == "success", (expr, answer)
        return list(answer["data"]["result"])


CATALOG = """
[serve.catalog]
lock = "tools.lock"
on_new = "warn"
max_description_chars = 20
[serve.catalog.deprecated.pid]
since = "2026-01-01"
sunset = "2999-01-01"
use = "structured"
"""


async def call_deprecated(url: str) -> None:
    async with http_session(url) as (session, _):
        assert (await session.call_tool("pid", {})).meta is not None


def start_gateway(tmp: Path, upstream_url: str, extra: str, admin_port: int) -> HttpServer:
    """test_serve_mcp's HTTP gateway, with its admin API on ``admin_port``: Prometheus can
    be told where to scrape it before it is up, and both start at once."""
    return wait_for_http_server(*launch_http_server(tmp, upstream_url, extra, "", admin_port))


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    binary = need_binary("prometheus")
    tmp = tmp_path_factory.mktemp("prometheus")
    target_port, rate_port, web_port = free_port(), free_port(), free_port()
    admin_port = free_port()
    workload = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "workload.py"), str(target_port), "120"]
    )
    redis = RedisServer().start()  # the rate workload's breaker storage, one key poisoned
    rate_workload = subprocess.Popen(
        [sys.executable, "-c", RATE_WORKLOAD, str(rate_port), "120", redis.url]
    )
    config = tmp / "prometheus.yml"
    config.write_text(
        # Scrapes twice a second: the eight scrapes awaited below take 4 s, not 8.
        "global: {scrape_interval: 500ms, scrape_timeout: 500ms, evaluation_interval: 500ms}\n"
        f"rule_files: ['{ALERTS}']\n"
        "scrape_configs:\n"
        "  - job_name: toolrelay\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{target_port}', "
        f"'127.0.0.1:{rate_port}']}}]\n"
        "  - job_name: toolrelay-gateway\n"
        f"    authorization: {{credentials: '{TOKEN}'}}\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{admin_port}'], "
        "labels: {job: toolrelay}}]\n"
    )
    # Prometheus first: it takes seconds before its first scrape, the gateway as long to start.
    server = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{web_port}",
            "--log.level=error",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    # A third target: the MCP gateway, whose own metrics (sessions) are on its admin API.
    stack = contextlib.ExitStack()
    upstream = stack.enter_context(StandInUpstream().run_in_thread())
    # with an upstream MCP server, for the upstream panels
    mcp_server = [sys.executable, str(ROOT / "tests" / "servers" / "mcp_test_server.py")]
    mcp_server += ["--record", str(tmp / "mcp-calls.jsonl")]
    upstreams = f'[serve.upstreams.test]\ncommand = {json.dumps(mcp_server)}\nbreaker_key = "mcp"\n'
    # and a tool catalog: a lock of no tools (each one new, offered: on_new = "warn"), short
    # descriptions (each longer one flagged), one deprecated tool (called once, below)
    (tmp / "tools.lock").write_text(dumps(lock_of([])))
    upstreams += CATALOG
    prom = Prometheus(f"http://127.0.0.1:{web_port}")
    try:
        gateway = start_gateway(tmp, upstream.url, upstreams, admin_port)
        stack.callback(stop_http_server, gateway)
        assert gateway.admin.url == f"http://127.0.0.1:{admin_port}", gateway.admin.url
        anyio.run(call_deprecated, gateway.mcp_url)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                # eight successful scrapes of each target (the gateway may start after the
                # first scrapes: those count 0)
                samples = prom.query('sum_over_time(up{job="toolrelay"}[1m])')
                if len(samples) == 3 and all(float(s["value"][1]) >= 8 for s in samples):
                    break
            except OSError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail("Prometheus never scraped the workload")
        yield prom
    finally:
        for proc in (server, workload, rate_workload):
            proc.terminate()
            proc.wait(20)
        stack.close()
        redis.kill()


def test_targets_are_up(prometheus: Prometheus) -> None:
    ups = prometheus.query('up{job="toolrelay"}')
    assert [up["value"][1] for up in ups] == ["1", "1", "1"]


def test_breaker_window_gauges_are_scraped(prometheus: Prometheus) -> None:
    """Computed at scrape time: a rate in 0-1 for the count-window key, none for the
    consecutive-window keys, and a break for every key."""
    rates = prometheus.query('toolrelay_breaker_failure_rate{job="toolrelay"}')
    assert [r["metric"]["breaker_key"] for r in rates] == ["search-api"]
    assert 0 <= float(rates[0]["value"][1]) <= 1
    breaks = prometheus.query('toolrelay_breaker_break_duration_seconds{job="toolrelay"}')
    assert {"search-api", "flaky-svc", "steady-svc"} <= {b["metric"]["breaker_key"] for b in breaks}
    (top,) = prometheus.query('toolrelay_breaker_break_duration_max_seconds{job="toolrelay"}')
    assert float(top["value"][1]) == 0.8


@pytest.mark.parametrize(("title", "expr"), dashboard_queries())
def test_dashboard_query_returns_data(prometheus: Prometheus, title: str, expr: str) -> None:
    result = prometheus.query(expr)
    assert result, f"panel {title!r}: no data for {expr}"


def test_template_variables_have_values(prometheus: Prometheus) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    checked = []
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if variable.get("type") != "query":
            continue
        checked.append(variable["name"])
        text = query if isinstance(query, str) else query.get("query", "")
        match = re.match(r"label_values\((.*),\s*(\w+)\)", text)
        assert match, text
        selector = match.group(1)
        for name, value in SUBSTITUTIONS.items():
            selector = selector.replace(name, value)
        values = prometheus.get(f"/api/v1/label/{match.group(2)}/values", **{"match[]": selector})[
            "data"
        ]
        assert values, variable["name"]
    assert {"job", "instance"} <= set(checked)


def test_alert_rules_load_and_evaluate(prometheus: Prometheus) -> None:
    groups = prometheus.get("/api/v1/rules")["data"]["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert len(rules) >= 6
    assert all(rule["health"] == "ok" for rule in rules), [
        (r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"
    ]


def test_the_instance_selector_splits_a_fleet_and_panels_add_it_up(prometheus: Prometheus) -> None:
    """Three processes of job ``toolrelay`` (a fleet, told apart by ``instance``): a panel
    with every instance selected adds theirs up in one series; selecting one instance
    narrows it to that replica's."""
    at = str(time.time())

    def value(expr: str) -> float:
        answer = prometheus.get("/api/v1/query", query=expr, time=at)["data"]["result"]
        assert len(answer) == 1, (expr, answer)  # aggregated across instances: one series
        return float(answer[0]["value"][1])

    panel = dict(dashboard_queries())["Tool calls"]  # $instance = ".*": every replica
    instances = {r["metric"]["instance"] for r in prometheus.query("toolrelay_tool_calls_total")}
    assert len(instances) >= 2
    each = [value(panel.replace('instance=~".*"', f'instance=~"{i}"')) for i in sorted(instances)]
    # a replica whose workload ended before the rate window shows 0; two still calling suffice
    assert sum(v > 0 for v in each) >= 2, each
    assert value(panel) == pytest.approx(sum(each))
    (info,) = prometheus.query('toolrelay_config_info{job="toolrelay"}')  # the gateway's
    assert re.fullmatch(r"[0-9a-f]{64}", info["metric"]["hash"])
