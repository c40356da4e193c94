"""The adaptive concurrency experiment in its short form (``examples/experiments/
adaptive_concurrency.py``): the service unloaded, then 3× its capacity with an adaptive
limit and with a fixed limit of 64, on the same seeded load; all three print. The full
form and its targets (adaptive p99 ≤ 2× unloaded, throughput ≥ 90 % of capacity; fixed
p99 ≥ 5×) are in docs/adaptive-concurrency.md: on a shared machine only the ordering is
asserted here, not the ratios."""

from __future__ import annotations

import pytest

from helpers import load_experiment as load


@pytest.mark.serial  # p99 ratios
def test_adaptive_limit_beside_a_fixed_one(capsys: pytest.CaptureFixture[str]) -> None:
    report = load("adaptive_concurrency").main(["--duration", "7", "--warmup", "2.5"])
    with capsys.disabled():
        print("\n" + capsys.readouterr().out)
    unloaded, adaptive, fixed = report["unloaded"], report["adaptive"], report["fixed 64"]
    for row in (unloaded, adaptive, fixed):
        assert row["invariants_ok"] and row["other_errors"] == 0, row
        assert row["ok"] > 0, row
    # the fixed limit never binds (60 agents): nothing refused, the service crowded 3×
    assert unloaded["overloaded"] == fixed["overloaded"] == 0
    assert fixed["p99_vs_unloaded"] >= 3, fixed  # (60 / 20)² = 9× once crowded
    # the adaptive limit refuses the excess and keeps the latency well below the fixed one
    assert adaptive["overloaded"] > 0
    assert adaptive["p99_s"] < fixed["p99_s"] / 2, report
    assert adaptive["throughput_per_s"] > fixed["throughput_per_s"], report
