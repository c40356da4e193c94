"""bench/gateway.py runs and reports: its correctness (every server answers every client,
the light load generator included), never its speed."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import anyio
import pytest

from helpers import load_script

ROOT = Path(__file__).resolve().parents[1]
GATEWAY = ROOT / "bench" / "gateway.py"


def load_bench() -> ModuleType:
    return load_script(GATEWAY, "toolrelay_bench_gateway")


def test_every_server_answers_the_sdk_clients_and_the_light_ones() -> None:
    """One short round without mcp-proxy (it would be installed from the registry): the bare
    upstream (SSE answers and JSON answers), toolrelay in front of it and with the tool
    in-process, and a JSON-answer variant, each through the SDK's clients and through the
    light client; a wrong answer would raise."""
    bench = load_bench()
    variants = [("json", "json_response = true")]
    comparison = anyio.run(bench.compare, 1, 16, variants, False)
    expected = ["upstream", "upstream[json]", "toolrelay", "toolrelay-plugin"]
    expected += ["toolrelay[json]", "toolrelay-plugin[json]"]
    assert comparison.servers == expected
    for server in expected:
        for clients in bench.CONCURRENCY:
            (sample,) = comparison.results[server, clients]
            assert sample.calls == 16 and len(sample.latencies) == 16, (server, clients)
        (light,) = comparison.saturated[server]
        assert light.calls == 32 and len(light.latencies) == 32, server
        assert light.cpu_s > 0, server  # the server's own CPU was read
    table = comparison.table()
    assert table.count("| 8 light |") == len(expected)
    assert "saturated" not in table  # no mcp-proxy: no ratio against it


def test_the_saturated_ratio_carries_the_throughput_target() -> None:
    bench = load_bench()
    sample = bench.Sample([0.001], 1.0, 0.5, 100)
    faster = bench.Sample([0.001], 1.0, 0.5, 130)
    results = {
        (name, c): [sample]
        for name in ("mcp-proxy", "toolrelay", "toolrelay-plugin", "upstream", "upstream[json]")
        for c in bench.CONCURRENCY
    }
    saturated = {"mcp-proxy": [sample], "toolrelay": [faster]}
    servers = ["upstream", "upstream[json]", "mcp-proxy", "toolrelay", "toolrelay-plugin"]
    rss = dict.fromkeys(servers, 1.0)
    comparison = bench.Comparison(servers, [""], results, rss, saturated)
    ratios = {r.name: r for r in comparison.ratios()}
    light = ratios["calls/s toolrelay / mcp-proxy, saturated (8 light connections)"]
    assert light.value == pytest.approx(1.3) and light.target == 1.2 and light.passed
    sdk = ratios["calls/s toolrelay / mcp-proxy, 8 SDK clients (client-bound)"]
    assert sdk.target is None and sdk.shown_target == "—"
    saturated["toolrelay"] = [sample]
    comparison = bench.Comparison(servers, [""], results, rss, saturated)
    ratios = {r.name: r for r in comparison.ratios()}
    assert not ratios["calls/s toolrelay / mcp-proxy, saturated (8 light connections)"].passed
