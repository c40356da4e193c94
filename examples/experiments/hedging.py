"""Experiment: hedging against an upstream with a slow tail, side by side with hedging off.

The stand-in upstream (``toolrelay.chaos.upstream``, in a thread of its own) answers
``/feeds/rss.xml`` after ``--base`` seconds (20 ms), or after ``--tail-seconds`` (2 s) for a
share ``--tail`` (5 %) of requests, drawn from one seeded die. A read-only tool fetches
it; ``--calls`` calls run through ``Dispatcher`` with ``--concurrency`` at a time, once
without hedging and once with ``hedge_after_s`` (``--hedge-after``, a number or
``adaptive``) and ``max_hedges`` (``--max-hedges``). Reported for each side: the tool's
p50/p99/max latency, ok answers, upstream requests per call, and for the hedged side the
hedges won, lost and skipped.

The last line is the report as JSON. Run:
``python examples/experiments/hedging.py [--calls 1000] [--hedge-after 0.1]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from typing import Any, Literal

import anyio
import httpx
from prometheus_client import CollectorRegistry

from toolrelay import (
    AuthContext,
    BulkheadOptions,
    Dispatcher,
    DispatcherOptions,
    HedgeOptions,
    KeyPolicy,
    RetryOptions,
    ToolError,
    ToolRegistry,
)
from toolrelay.chaos.upstream import StandInUpstream

KEY = "feeds"
PATH = "/feeds/rss.xml"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


async def run_side(
    up: StandInUpstream, hedge_after: float | Literal["adaptive"] | None, args: argparse.Namespace
) -> dict[str, Any]:
    up.seed(args.seed)  # the same dice for both sides
    up.reset_stats()
    async with httpx.AsyncClient(base_url=up.url, timeout=30) as client:
        registry = ToolRegistry()

        @registry.tool(name="fetch_feed", breaker_key=KEY, risk="read", timeout_s=10)
        async def fetch_feed(params: dict[str, Any], ctx: AuthContext) -> int:
            response = await client.get(PATH)
            if response.status_code != 200:
                raise ToolError(f"upstream answered {response.status_code}", retryable=True)
            return len(response.content)

        config = KeyPolicy(
            retry=RetryOptions(max_attempts=1),
            hedge=HedgeOptions(
                after_s=hedge_after, after_min_s=args.base * 2, max_hedges=args.max_hedges
            ),
            bulkhead=BulkheadOptions(max_concurrent=4 * args.concurrency),
        )
        metrics = CollectorRegistry()
        dispatcher = Dispatcher(
            registry, DispatcherOptions(keys={KEY: config}), audit=None, metrics_registry=metrics
        )
        durations: list[float] = []
        outcomes: dict[str, int] = {}
        todo = iter(range(args.calls))

        async def agent() -> None:
            for _ in todo:
                result = await dispatcher.dispatch("fetch_feed", {})
                durations.append(result.duration_s)
                outcome = "ok" if result.ok else str(result.error_type)
                outcomes[outcome] = outcomes.get(outcome, 0) + 1

        async with anyio.create_task_group() as tg:
            for _ in range(args.concurrency):
                tg.start_soon(agent)
        await dispatcher.aclose()
    requests = up.stats["requests"].get(PATH, 0)

    def hedges(result: str) -> int:
        value = metrics.get_sample_value(
            "toolrelay_hedges_total", {"breaker_key": KEY, "hedge": result}
        )
        return int(value or 0)

    return {
        "hedge_after_s": hedge_after,
        "calls": len(durations),
        "answers": sum(outcomes.values()),
        "outcomes": outcomes,
        "p50_s": round(statistics.median(durations), 4),
        "p99_s": round(percentile(durations, 0.99), 4),
        "max_s": round(max(durations), 4),
        "upstream_requests": requests,
        "requests_per_call": round(requests / len(durations), 4),
        "hedges": {r: hedges(r) for r in ("won", "lost", "skipped")},
    }


async def experiment(args: argparse.Namespace) -> dict[str, Any]:
    hedge_after: float | Literal["adaptive"] = (
        "adaptive" if args.hedge_after == "adaptive" else float(args.hedge_after)
    )
    with StandInUpstream(seed=args.seed).run_in_thread() as up:
        up.set_fault(
            "/feeds", "slow_tail", seconds=args.base, tail=args.tail, tail_seconds=args.tail_seconds
        )
        off = await run_side(up, None, args)
        on = await run_side(up, hedge_after, args)
    return {
        "off": off,
        "on": on,
        "p99_ratio": round(off["p99_s"] / on["p99_s"], 2),
        "extra_requests": round(on["requests_per_call"] / off["requests_per_call"] - 1, 4),
    }


def print_report(report: dict[str, Any]) -> None:
    off, on = report["off"], report["on"]
    rows: list[tuple[str, str, Callable[[dict[str, Any]], str]]] = [
        ("calls / answers", "calls", lambda s: f"{s['calls']} / {s['answers']}"),
        ("ok", "", lambda s: str(s["outcomes"].get("ok", 0))),
        ("p50", "", lambda s: f"{s['p50_s'] * 1000:.1f} ms"),
        ("p99", "", lambda s: f"{s['p99_s'] * 1000:.1f} ms"),
        ("max", "", lambda s: f"{s['max_s'] * 1000:.1f} ms"),
        ("upstream requests / call", "", lambda s: f"{s['requests_per_call']:.3f}"),
        ("hedges won/lost/skipped", "", lambda s: "{won}/{lost}/{skipped}".format(**s["hedges"])),
    ]
    print(f"{'':28}{'hedging off':>18}{'hedge_after_s=' + str(on['hedge_after_s']):>24}")
    for label, _, cell in rows:
        print(f"{label:28}{cell(off):>18}{cell(on):>24}")
    print(
        f"p99 {report['p99_ratio']}× lower with hedging, "
        f"{report['extra_requests'] * 100:.1f} % extra upstream requests"
    )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--base", type=float, default=0.02, help="usual latency (s)")
    parser.add_argument("--tail", type=float, default=0.05, help="share of slow requests")
    parser.add_argument("--tail-seconds", type=float, default=2.0)
    parser.add_argument("--hedge-after", default="0.1", help="seconds, or 'adaptive'")
    parser.add_argument("--max-hedges", type=int, default=2)
    parser.add_argument("--seed", type=int, default=7)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    report = anyio.run(experiment, args)
    print_report(report)
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
