"""Drive one dispatch scenario in a loop, for a profiler to watch.

    python bench/hotpath.py SCENARIO [--seconds 10] [--cprofile [--top 30]]
    py-spy record -r 2000 -f raw -o out.txt -- .venv/bin/python bench/hotpath.py ok-api

Scenarios (the same tools and dispatchers as bench/run.py):

- ``ok-api``: a successful no-op dispatch, metrics on, tracing API only;
- ``ok-sdk``: the same with an OTel SDK provider recording spans;
- ``ok-off``: the same with telemetry off;
- ``fastfail``: an open breaker's answer, metrics on, tracing API only;
- ``timeouts``: floods of 1,000 concurrent calls to a hung async tool (timeout 0.2 s);
- ``sync-timeouts``: floods of 200 concurrent calls to a hung sync tool (timeout 0.2 s).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run as bench
from toolrelay import (
    AuthContext,
    BreakerOptions,
    BulkheadOptions,
    Dispatcher,
    KeyPolicy,
)

SCENARIOS = ("ok-api", "ok-sdk", "ok-off", "fastfail", "timeouts", "sync-timeouts")


def build(scenario: str) -> tuple[Dispatcher, str, int, threading.Event]:
    """The dispatcher, the tool to call and how many calls make one batch."""
    registry = bench.noop_registry()
    registry.tool(name="noop_open", parameters=bench.SCHEMA, breaker_key="down")(bench.noop)
    release = threading.Event()

    @registry.tool(name="hang_async", timeout_s=0.2, breaker_key="flood")
    async def hang_async(args: dict[str, Any], ctx: AuthContext) -> Any:
        await anyio.sleep_forever()

    @registry.tool(name="hang_sync", timeout_s=0.2, breaker_key="flood_sync")
    def hang_sync(args: dict[str, Any], ctx: AuthContext) -> Any:
        release.wait(60)
        return {}

    tracing = {"ok-sdk": "sdk", "ok-off": "off"}.get(scenario, "api")
    d = bench.dispatcher(
        registry,
        tracing=tracing,
        keys={
            "down": KeyPolicy(breaker=BreakerOptions(reset_timeout_s=3600)),
            "flood": KeyPolicy(
                breaker=BreakerOptions(fail_max=10**9),
                bulkhead=BulkheadOptions(max_concurrent=2000),
            ),
            "flood_sync": KeyPolicy(
                breaker=BreakerOptions(fail_max=10**9), bulkhead=BulkheadOptions(max_concurrent=256)
            ),
        },
    )
    d.breakers.force_open("down")
    if scenario == "timeouts":
        return d, "hang_async", 1000, release
    if scenario == "sync-timeouts":
        return d, "hang_sync", 200, release
    return d, ("noop_open" if scenario == "fastfail" else "noop"), 2000, release


async def drive(scenario: str, seconds: float) -> int:
    d, tool, batch, release = build(scenario)
    args = "{}" if tool.startswith("hang") else bench.ARGS
    done = 0
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        if tool.startswith("hang"):
            async with anyio.create_task_group() as tg:
                for _ in range(batch):
                    tg.start_soon(d.dispatch, tool, args, bench.CTX)
            release.set()
            await anyio.sleep(0.05)
            release.clear()
        else:
            for _ in range(batch):
                await d.dispatch(tool, args, bench.CTX, call_id="call_1")
            await anyio.lowlevel.checkpoint()
        done += batch
    return done


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("scenario", choices=SCENARIOS)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--cprofile", action="store_true", help="print cProfile's top costs")
    parser.add_argument("--top", type=int, default=30)
    opts = parser.parse_args()
    profiler = cProfile.Profile() if opts.cprofile else None
    if profiler is not None:
        profiler.enable()
    started = time.perf_counter()
    done = anyio.run(drive, opts.scenario, opts.seconds)
    took = time.perf_counter() - started
    if profiler is not None:
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(opts.top)
    print(f"{opts.scenario}: {done} calls in {took:.1f} s ({took / done * 1e6:.1f} µs per call)")


if __name__ == "__main__":
    main()
