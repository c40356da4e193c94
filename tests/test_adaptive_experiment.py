"""The adaptive concurrency experiment in its short form (``examples/experiments/
adaptive_concurrency.py``): the service unloaded, then 3× its capacity with an adaptive
limit and with a fixed limit of 64, on the same seeded load; all three print. The full
form and its targets (adaptive p99 ≤ 2× unloaded, throughput ≥ 90 % of capacity; fixed
p99 ≥ 5×) are in docs/adaptive-concurrency.md: on a shared machine only the ordering is
asserted here, not the ratios.

Each run is as short as its measurement allows (10 s in all, where one length for the
three took 25 s): the unloaded service answers in 250 ms from its first call; the adaptive
limit has settled after ~1 s (a probe at ``adaptive_min``, then windows of ~0.5 s); the
fixed limit is crowded from the first second on, and each of its calls then takes 2.25 s,
which the run waits out after its end."""

from __future__ import annotations

import anyio
import pytest

from helpers import load_experiment as load
from toolrelay.chaos.experiment import play

RUNS = {  # name: experiment file, agents (None: its own 60), duration_s, warmup_s
    "unloaded": ("adaptive_concurrency_fixed.toml", 10, 1.5, 0.25),
    "adaptive": ("adaptive_concurrency.toml", None, 3.0, 1.0),
    "fixed 64": ("adaptive_concurrency_fixed.toml", None, 2.0, 0.5),
}


@pytest.mark.serial  # p99 ratios
def test_adaptive_limit_beside_a_fixed_one(capsys: pytest.CaptureFixture[str]) -> None:
    example = load("adaptive_concurrency")
    report = {}
    for name, (path, agents, duration_s, warmup_s) in RUNS.items():
        experiment = example.load(path, duration_s, agents)
        experiment.data["settle_s"] = 0.2
        run = anyio.run(play, experiment)
        report[name] = example.summarise(run, warmup_s, example.capacity_per_s(experiment))
    unloaded, adaptive, fixed = report["unloaded"], report["adaptive"], report["fixed 64"]
    for row in report.values():
        row["p99_vs_unloaded"] = row["p99_s"] / unloaded["p99_s"]
    with capsys.disabled():
        print()
        example.print_table(report)
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
