"""bench/suite/fleet.py runs and reports: its correctness, never its speed (a fleet of two
replicas, a few calls direct and through HAProxy, two breaker transitions)."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import pytest

from conftest import need_binary

BENCH = Path(__file__).resolve().parents[1] / "bench"
pytestmark = pytest.mark.servers


def test_the_fleet_bench_measures_every_figure() -> None:
    need_binary("haproxy")
    need_binary("redis-server")
    if str(BENCH) not in sys.path:
        sys.path.append(str(BENCH))
    from suite import BENCHES
    from suite.fleet import SESSIONS, convergence_ms, fleet_rows, measure, running_fleet

    assert "fleet" in BENCHES

    async def run() -> tuple[dict[str, dict[str, float]], list[float]]:
        with running_fleet(2) as fleet:
            direct = await measure(fleet, fleet.replicas[0].port, SESSIONS * 4, 0.2)
            behind = await measure(fleet, fleet.port, SESSIONS * 4, 0.2)
            delays = await anyio.to_thread.run_sync(convergence_ms, fleet, 2)
        return {"direct": direct, "2 behind HAProxy": behind}, delays

    figures, delays = anyio.run(run)
    for f in figures.values():
        assert f["rate"] > 0 and f["p99_ms"] >= f["p50_ms"] > 0
        assert f["gateway_cpu_ms"] >= 0 and f["redis_per_call"] >= f["redis_calls_per_call"] >= 0
    assert figures["direct"]["lb_cpu_ms"] == 0
    assert len(delays) == 2 and all(0 < d < 5000 for d in delays)  # one other replica, twice
    names = [row.name for row in fleet_rows(figures, delays, quick=True)]
    assert "fleet: 2 behind HAProxy / one replica direct, replicas' CPU a call" in names
    assert "fleet: breaker convergence across 3 replicas, p99" in names
