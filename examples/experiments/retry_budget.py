"""Experiment: a hard outage seen by 3 dispatcher processes sharing Redis, with and without
a retry budget.

The stand-in upstream (``toolrelay.chaos.upstream``) answers every ``/feeds`` request 503.
``--replicas`` processes each run a dispatcher (breaker storage on one redis-server) and
``--concurrency`` agents calling a read-only tool that fetches the feed, for ``--seconds``.
The tool's breaker is kept closed (``fail_max`` out of reach) so that retries alone decide
the load: ``max_attempts = 3``. Once without a budget, once with ``retry_budget``
(``--budget``, 0.2) and ``retry_budget_min_per_s`` (``--floor``, 1.0). Reported for each
side: model calls, answers (every call must have one), upstream requests per call.

Needs ``redis-server`` on the PATH (or ``--redis URL``). The last line is the report as
JSON. Run: ``python examples/experiments/retry_budget.py [--seconds 10]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import httpx

from toolrelay import (
    AuthContext,
    BreakerOptions,
    BudgetOptions,
    Dispatcher,
    DispatcherOptions,
    KeyPolicy,
    RetryOptions,
    StorageOptions,
    ToolError,
    ToolRegistry,
)
from toolrelay.chaos.upstream import StandInUpstream

KEY = "feeds"
PATH = "/feeds/rss.xml"
MAX_ATTEMPTS = 3


# -- one replica (a child process) ---------------------------------------------------------
async def replica(args: argparse.Namespace) -> dict[str, Any]:
    budget = None if args.budget <= 0 else args.budget
    config = KeyPolicy(
        breaker=BreakerOptions(fail_max=1_000_000),
        retry=RetryOptions(max_attempts=MAX_ATTEMPTS, backoff_initial_s=0.01, backoff_max_s=0.05),
        budget=BudgetOptions(share=budget, min_per_s=args.floor),
    )
    outcomes: dict[str, int] = {}
    calls = 0
    async with httpx.AsyncClient(base_url=args.upstream, timeout=5) as client:
        registry = ToolRegistry()

        @registry.tool(name="fetch_feed", breaker_key=KEY, risk="read", timeout_s=5)
        async def fetch_feed(params: dict[str, Any], ctx: AuthContext) -> int:
            response = await client.get(PATH)
            if response.status_code != 200:
                raise ToolError(f"upstream answered {response.status_code}", retryable=True)
            return len(response.content)

        dispatcher = Dispatcher(
            registry,
            DispatcherOptions(
                keys={KEY: config},
                telemetry=False,
                storage=StorageOptions(url=args.redis, sync_interval_s=0.05),
            ),
            audit=None,
        )
        end = time.monotonic() + args.seconds

        async def agent() -> None:
            nonlocal calls
            while time.monotonic() < end:
                calls += 1
                result = await dispatcher.dispatch("fetch_feed", {})
                outcome = "ok" if result.ok else str(result.error_type)
                outcomes[outcome] = outcomes.get(outcome, 0) + 1
                await anyio.sleep(args.think)

        async with anyio.create_task_group() as tg:
            for _ in range(args.concurrency):
                tg.start_soon(agent)
        await dispatcher.aclose()
    return {"calls": calls, "answers": sum(outcomes.values()), "outcomes": outcomes}


# -- the experiment (the parent) -----------------------------------------------------------
@contextmanager
def redis_server(url: str | None) -> Iterator[str]:
    if url is not None:
        yield url
        return
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed (or pass --redis URL)")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="toolrelay-redis-") as workdir:
        proc = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", workdir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            for _ in range(500):
                try:
                    socket.create_connection(("127.0.0.1", port), 0.1).close()
                    break
                except OSError:
                    time.sleep(0.02)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            proc.kill()
            proc.wait(10)


def run_side(
    up: StandInUpstream, redis_url: str, budget: float, args: argparse.Namespace
) -> dict[str, Any]:
    import redis

    redis.Redis.from_url(redis_url).flushall()
    up.reset_stats()
    command = [
        sys.executable, __file__, "--replica", "--upstream", up.url, "--redis", redis_url,
        "--seconds", str(args.seconds), "--concurrency", str(args.concurrency),
        "--think", str(args.think), "--budget", str(budget), "--floor", str(args.floor),
    ]  # fmt: skip
    procs = [
        subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(args.replicas)
    ]
    replicas = []
    for proc in procs:
        out, _ = proc.communicate(timeout=args.seconds + 60)
        if proc.returncode != 0:
            raise SystemExit(f"a replica failed (exit {proc.returncode})")
        replicas.append(json.loads(out.strip().splitlines()[-1]))
    calls = sum(r["calls"] for r in replicas)
    answers = sum(r["answers"] for r in replicas)
    requests = up.stats["requests"].get(PATH, 0)
    return {
        "retry_budget": budget or None,
        "replicas": replicas,
        "calls": calls,
        "answers": answers,
        "lost": calls - answers,
        "upstream_requests": requests,
        "requests_per_call": round(requests / max(1, calls), 3),
    }


def experiment(args: argparse.Namespace) -> dict[str, Any]:
    with redis_server(args.redis) as url, StandInUpstream(seed=1).run_in_thread() as up:
        up.set_fault("/feeds", "status", status=503)
        off = run_side(up, url, 0.0, args)
        on = run_side(up, url, args.budget, args)
    return {"off": off, "on": on, "max_attempts": MAX_ATTEMPTS, "replicas": args.replicas}


def print_report(report: dict[str, Any]) -> None:
    off, on = report["off"], report["on"]
    print(f"{'':28}{'no budget':>16}{'retry_budget=' + str(on['retry_budget']):>24}")
    for label, field in (
        ("model calls", "calls"),
        ("answers (lost)", "answers"),
        ("upstream requests", "upstream_requests"),
        ("upstream requests / call", "requests_per_call"),
    ):
        cells = [
            f"{side[field]} ({side['lost']})" if field == "answers" else str(side[field])
            for side in (off, on)
        ]
        print(f"{label:28}{cells[0]:>16}{cells[1]:>24}")
    print(
        f"{report['replicas']} replicas, max_attempts={report['max_attempts']}: "
        f"{off['requests_per_call']}× without the budget, {on['requests_per_call']}× with it"
    )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--think", type=float, default=0.01)
    parser.add_argument("--budget", type=float, default=0.2)
    parser.add_argument("--floor", type=float, default=1.0)
    parser.add_argument("--redis", default=None)
    parser.add_argument("--upstream", default=None)
    parser.add_argument("--replica", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    if args.replica:
        result = anyio.run(replica, args)
        print(json.dumps(result))
        return result
    report = experiment(args)
    print_report(report)
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
