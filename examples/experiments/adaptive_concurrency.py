"""Experiment: adaptive concurrency beside a fixed limit of 64, on a service whose latency
grows with its in-flight requests (capacity 20, 250 ms unloaded), under 3× that load.

Runs three chaos experiments on the stand-in upstream's ``load`` fault:

- *unloaded*: ``adaptive_concurrency_fixed.toml`` with 10 agents (half the capacity): the
  service's own p99;
- *adaptive*: ``adaptive_concurrency.toml`` (60 agents, ``max_concurrent = "adaptive"``);
- *fixed 64*: ``adaptive_concurrency_fixed.toml`` (60 agents, ``max_concurrent = 64``).

For each: p99 of the ok answers' latency (after ``--warmup`` seconds), throughput of ok
answers against the service's capacity (20 / 0.25 s = 80 per second), and the answers
refused ``overloaded``. The agents honour ``retry_after_s``; the service time is long
enough that the host's CPU, which the agents, the dispatcher and the stand-in upstream
share, is not the bottleneck. The last line is the report as JSON. Run:
``python examples/experiments/adaptive_concurrency.py [--duration 20]``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import anyio

from toolrelay.chaos.experiment import Experiment, Run, play

HERE = Path(__file__).resolve().parent


def load(name: str, duration_s: float, agents: int | None = None) -> Experiment:
    experiment = Experiment.load(HERE / name)
    experiment.data["duration_s"] = duration_s
    for fault in experiment.data["faults"]:
        fault["until_s"] = duration_s  # the load fault lasts the whole run
    if agents is not None:
        experiment.data["workload"]["agents"] = agents
    return experiment


def capacity_per_s(experiment: Experiment) -> float:
    """What the service answers a second at best: ``capacity`` calls per ``seconds``."""
    fault = experiment.data["faults"][0]
    return float(fault["capacity"] / fault["seconds"])


def summarise(report: Run, warmup_s: float, capacity: float) -> dict[str, Any]:
    answers = [a for a in report.timeline.answers if a.started_s >= warmup_s]
    ok = sorted(a.latency_s for a in answers if a.outcome == "ok")
    span = report.duration_s - warmup_s
    return {
        "name": report.name,
        "ok": len(ok),
        "overloaded": sum(a.outcome == "overloaded" for a in answers),
        "other_errors": sum(a.outcome not in ("ok", "overloaded") for a in answers),
        "p50_s": ok[len(ok) // 2] if ok else None,
        "p99_s": ok[min(len(ok) - 1, int(len(ok) * 0.99))] if ok else None,
        "throughput_per_s": len(ok) / span,
        "capacity_share": len(ok) / span / capacity,
        "invariants_ok": report.ok,
    }


def measure(duration_s: float = 20.0, warmup_s: float = 3.0) -> dict[str, Any]:
    runs = {
        "unloaded": load("adaptive_concurrency_fixed.toml", duration_s, agents=10),
        "adaptive": load("adaptive_concurrency.toml", duration_s),
        "fixed 64": load("adaptive_concurrency_fixed.toml", duration_s),
    }
    out = {
        name: summarise(anyio.run(play, e), warmup_s, capacity_per_s(e)) for name, e in runs.items()
    }
    unloaded = out["unloaded"]["p99_s"]
    for row in out.values():
        row["p99_vs_unloaded"] = row["p99_s"] / unloaded if row["p99_s"] and unloaded else None
    return out


def print_table(out: dict[str, Any]) -> None:
    print(f"{'':10} {'p50 ms':>8} {'p99 ms':>8} {'p99 ×':>6} {'ok/s':>7} {'capacity':>8} "
          f"{'overloaded':>10} {'errors':>6}")  # fmt: skip
    for name, r in out.items():
        print(
            f"{name:10} {r['p50_s'] * 1000:8.0f} {r['p99_s'] * 1000:8.0f} "
            f"{r['p99_vs_unloaded']:6.2f} {r['throughput_per_s']:7.1f} "
            f"{r['capacity_share']:8.0%} {r['overloaded']:10d} {r['other_errors']:6d}"
        )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    args = parser.parse_args(argv)
    out = measure(args.duration, args.warmup)
    print_table(out)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
