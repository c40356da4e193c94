"""bench/gateway.py runs and reports: its correctness (every server answers every client,
the light load generator included), never its speed."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import anyio
import pytest

from helpers import load_script

ROOT = Path(__file__).resolve().parents[1]
GATEWAY = ROOT / "bench" / "gateway.py"


def load_bench() -> ModuleType:
    return load_script(GATEWAY, "toolrelay_bench_gateway")


@pytest.fixture
def frozen_heap() -> Iterator[None]:
    """The test process's objects (every test module, imported at collection) moved out of
    the collector's reach meanwhile: the bench collects before each of its ~50 samples, as
    in its own process, where that costs a millisecond; over a pytest-xdist worker's heap it
    cost 0.3 s each."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@pytest.mark.usefixtures("frozen_heap")
def test_every_server_answers_the_sdk_clients_and_the_light_ones() -> None:
    """One short round without mcp-proxy (it would be installed from the registry): the bare
    upstream (SSE answers and JSON answers), toolrelay in front of it and with the tool
    in-process, and a JSON-answer variant, each through the SDK's clients and through the
    light client; a wrong answer would raise."""
    bench = load_bench()
    variants = [("json", "json_response = true")]
    comparison = anyio.run(bench.compare, 1, 8, variants, False)  # 8: one call per client
    expected = ["upstream", "upstream[json]", "toolrelay", "toolrelay-plugin"]
    expected += ["toolrelay[json]", "toolrelay-plugin[json]"]
    assert comparison.servers == expected
    for server in expected:
        for clients in bench.CONCURRENCY:
            (sample,) = comparison.results[server, clients]
            assert sample.calls == 8 and len(sample.latencies) == 8, (server, clients)
        (light,) = comparison.saturated[server]
        assert light.calls == 16 and len(light.latencies) == 16, server
        assert light.cpu_s >= 0, server
    # the servers' own CPU was read (a few ms each: the sum, as /proc counts in 10 ms ticks)
    assert sum(light.cpu_s for (light,) in comparison.saturated.values()) > 0
    table = comparison.table()
    assert table.count("| 8 light |") == len(expected)
    assert "mcp-proxy" not in table  # no mcp-proxy: no ratio against it
    assert "toolrelay-plugin[json] / upstream[json], saturated" in table
    # the rows beyond tools/call: every bare upstream serves them, with every notification
    for server in ("upstream", "upstream[json]"):
        for operation in bench.OPERATIONS:
            (sample,) = comparison.operations[server, operation]
            assert sample.calls == 8, (server, operation)
        assert f"| {server} | resources/read |" in table
    # SSE answers carry the notifications; a JSON answer (one body) cannot
    assert set(comparison.progress["upstream"]) == {bench.PROGRESS_STEPS}
    assert set(comparison.progress["upstream[json]"]) == {0}
    assert ("toolrelay-plugin", "resources/read") in comparison.refused  # it has none


def test_the_saturated_ratio_carries_the_throughput_target() -> None:
    bench = load_bench()
    sample = bench.Sample([0.001], 1.0, 0.5, 100)
    faster = bench.Sample([0.001], 1.0, 0.5, 130)
    results = {
        (name, c): [sample]
        for name in ("mcp-proxy", "toolrelay", "toolrelay-plugin", "upstream", "upstream[json]")
        for c in bench.CONCURRENCY
    }
    saturated = {"mcp-proxy": [sample], "toolrelay": [faster], "toolrelay-plugin": [sample]}
    saturated |= {"upstream": [sample], "upstream[json]": [sample]}
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


def test_the_plugin_is_judged_against_the_bare_server_where_the_server_sets_the_rate() -> None:
    """With 8 SDK clients the client costs more than either server: those rows are context;
    the 1-client rows and the saturated rows carry the 1.05x target."""
    bench = load_bench()
    fast = bench.Sample([0.001] * 10, 1.0, 0.5, 100)
    slow = bench.Sample([0.002] * 10, 2.0, 0.5, 100)  # half the rate, twice the p50
    servers = ["upstream", "upstream[json]", "toolrelay", "toolrelay-plugin"]
    results = {(name, c): [fast] for name in servers for c in bench.CONCURRENCY}
    results["toolrelay-plugin", 8] = [slow]
    saturated = {name: [fast] for name in servers}
    comparison = bench.Comparison(servers, [""], results, dict.fromkeys(servers, 1.0), saturated)
    ratios = {r.name: r for r in comparison.ratios()}
    sdk = ratios["p50 toolrelay-plugin / upstream[json], 8 SDK clients (client-bound)"]
    assert sdk.value == pytest.approx(2.0) and sdk.target is None and sdk.passed
    rate = ratios["calls/s upstream[json] / toolrelay-plugin, 8 SDK clients (client-bound)"]
    assert rate.value == pytest.approx(2.0) and rate.target is None
    one = ratios["calls/s upstream[json] / toolrelay-plugin, 1 client(s)"]
    assert one.target == 1.05 and one.passed
    light = "toolrelay-plugin / upstream[json], saturated (8 light connections)"
    assert ratios[f"p50 {light}"].passed and ratios[f"p50 {light}"].target == 1.05
    saturated["toolrelay-plugin"] = [slow]
    comparison = bench.Comparison(servers, [""], results, dict.fromkeys(servers, 1.0), saturated)
    ratios = {r.name: r for r in comparison.ratios()}
    assert not ratios[f"p50 {light}"].passed
    assert not ratios[
        "calls/s upstream[json] / toolrelay-plugin, saturated (8 light connections)"
    ].passed
    # Without the saturated rounds, the 8-SDK-client rows are all there is: they are judged.
    comparison = bench.Comparison(servers, [""], results, dict.fromkeys(servers, 1.0))
    ratios = {r.name: r for r in comparison.ratios()}
    assert not ratios["p50 toolrelay-plugin / upstream[json], 8 SDK clients (client-bound)"].passed


def test_against_runs_every_configuration_again_from_the_other_tree(tmp_path: Path) -> None:
    """``--against TREE``: the default and each variant once more, each with ``TREE``'s src/
    and plugins/ first on the gateway's path, and the before/after ratio rows in the table."""
    bench = load_bench()
    tree = (tmp_path / "base").resolve()
    variants = bench.against(tree, [("json", "json_response = true")])
    assert [name for name, _ in variants] == ["@base", "json@base"]
    prelude, toml = variants[1][1].split("\n", 1)
    paths = [str(tree / "src"), str(tree / "plugins")]
    assert prelude == f"!import sys; sys.path[:0] = {paths!r}" and toml == "json_response = true"

    new = bench.Sample([0.001] * 10, 1.0, 0.5, 120, 0.4)
    old = bench.Sample([0.002] * 10, 1.0, 0.5, 100, 0.5)
    servers = ["upstream", "upstream[json]", "toolrelay[json]", "toolrelay-plugin[json]"]
    servers += ["toolrelay[json@base]", "toolrelay-plugin[json@base]"]
    samples = {name: [old if "@" in name else new] for name in servers}
    results = {(name, c): samples[name] for name in servers for c in bench.CONCURRENCY}
    comparison = bench.Comparison(servers, ["json", "json@base"], results, {}, samples)
    ratios = {r.name: r for r in comparison.ratios() if r.label == "json@base"}
    rate = ratios["calls/s toolrelay[json] / toolrelay[json@base], saturated"]
    assert rate.value == pytest.approx(1.2) and rate.target is None and rate.passed
    cpu = ratios["CPU/call toolrelay-plugin[json] / toolrelay-plugin[json@base], saturated"]
    assert cpu.value == pytest.approx((0.9 / 120) / (1.0 / 100))
    p50 = ratios["p50 toolrelay[json] / toolrelay[json@base], 8 client(s)"]
    assert p50.value == pytest.approx(0.5)
