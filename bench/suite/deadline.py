"""Deadline precision and isolation: floods of hung calls (async and sync, spread and in
one loop iteration, the collector paused, beside a CPU-bound neighbour), each probed by
healthy calls on another key; the checked async flood against the same flood on bare anyio."""

from __future__ import annotations

import gc
import json
import os
import statistics
import threading
from collections.abc import Sequence
from typing import Any

import anyio
import anyio.lowlevel

from toolrelay import (
    AuthContext,
    BreakerOptions,
    BulkheadOptions,
    KeyPolicy,
    ToolRegistry,
)

from .flood import (
    CPU_WAIT_LIMIT_S,
    PRIORITY_ENV,
    BareAnyio,
    Flood,
    Neighbour,
    collector_summary,
    flood,
    set_priority,
    waits,
)
from .harness import (
    ARGS,
    CTX,
    FLOOR_S,
    SCHEMA,
    Row,
    Settings,
    dispatcher,
    ms,
    percentile,
)

BARE_SHARE_LIMIT = 1.3
"""The checked async flood's target: the healthy calls' p99 / unloaded ratio through
toolrelay at most this many times the same ratio of the same flood on bare anyio, in the
same run (toolrelay's own share: what the machine does to the event loop, it does to both)."""


async def bench_deadline(s: Settings) -> list[Row]:
    timeout_s = s.flood_timeout_s
    gates: list[threading.Event] = []  # one per sync flood, set when the flood is over
    lock = threading.Lock()
    running = [0]  # sync handlers running now
    registry = ToolRegistry()
    open_schema = {"type": "object", "properties": {}}

    @registry.tool(name="hang_async", parameters=open_schema, timeout_s=timeout_s,
                   breaker_key="flood")  # fmt: skip
    async def hang_async(args: dict[str, Any], ctx: AuthContext) -> Any:
        await anyio.sleep_forever()

    @registry.tool(name="hang_sync", parameters=open_schema, timeout_s=timeout_s,
                   breaker_key="flood_sync")  # fmt: skip
    def hang_sync(args: dict[str, Any], ctx: AuthContext) -> Any:
        gate = gates[args["flood"]]
        with lock:
            running[0] += 1
        try:
            gate.wait(60)
            return {}
        finally:
            with lock:
                running[0] -= 1

    @registry.tool(name="healthy", parameters=SCHEMA, timeout_s=5.0, breaker_key="healthy")
    async def healthy(args: dict[str, Any], ctx: AuthContext) -> Any:
        await anyio.lowlevel.checkpoint()
        return {"city": args["city"]}

    huge = 10**9
    d = dispatcher(
        registry,
        keys={
            "flood": KeyPolicy(
                breaker=BreakerOptions(fail_max=huge),
                bulkhead=BulkheadOptions(max_concurrent=2 * s.async_flood),
            ),
            # room to spare: a slot can leak (see the "worker slots" row)
            "flood_sync": KeyPolicy(
                breaker=BreakerOptions(fail_max=huge),
                bulkhead=BulkheadOptions(max_concurrent=10 * s.sync_flood),
            ),
            # the probe is open loop: after a stall it may have many calls in flight
            "healthy": KeyPolicy(
                breaker=BreakerOptions(fail_max=huge),
                bulkhead=BulkheadOptions(max_concurrent=100_000),
            ),
        },
    )
    # before any thread is started: the worker threads inherit it
    priority = set_priority(os.environ.get(PRIORITY_ENV, "realtime") != "normal")
    for _ in range(s.warmup):
        await d.dispatch("healthy", ARGS, CTX)

    async def floods(
        tool: str, n: int, count: int, spread_s: float = 0.0, collector: bool = True, on: Any = d
    ) -> list[Flood]:
        runs = []
        for _ in range(count):
            gc.collect()
            gates.append(threading.Event())
            args = json.dumps({"flood": len(gates) - 1})
            runs.append(
                await flood(on, tool, n, timeout_s, args, spread_s=spread_s, collector=collector)
            )
            gates[-1].set()
            for _ in range(1000):  # every released handler ends (10 s at most)
                await anyio.sleep(0.01)
                if not running[0]:
                    break
            await anyio.sleep(0.05)
        return runs

    async def paired(n: int, count: int) -> tuple[list[Flood], list[Flood]]:
        """``count`` checked async floods through toolrelay, each beside the same flood on
        bare anyio (the order alternating pair by pair)."""
        ours: list[Flood] = []
        bare: list[Flood] = []
        for index in range(count):
            pair = [(ours, d), (bare, BareAnyio(timeout_s))]
            for runs, on in pair if index % 2 == 0 else reversed(pair):
                runs += await floods("hang_async", n, 1, s.flood_spread_s, on=on)
        return ours, bare

    def rows_for(
        label: str,
        runs: list[Flood],
        limit: float,
        checked: bool = True,
        bare: list[Flood] | None = None,
    ) -> list[Row]:
        """Lateness and healthy-call rows; ``checked=False``: the same figures, as info.
        A checked target is in force in a full run whose floods the other processes on the
        machine left alone (see ``CPU_WAIT_LIMIT_S``). With ``bare`` (the same floods on
        bare anyio, pair by pair), the healthy row is toolrelay's own share: its ratio over
        bare anyio's, per pair."""
        p99 = statistics.median(r.p99 for r in runs)
        everything = [x for r in runs for x in r.lateness]
        of = f"median of {len(runs)} floods (p99s " if len(runs) > 1 else "one flood ("
        left_alone = all(
            r.cpu_wait_s is None or r.cpu_wait_s <= CPU_WAIT_LIMIT_S for r in [*runs, *(bare or [])]
        )
        in_force = not s.quick and left_alone
        why = "" if in_force or not checked else (
            "; not checked: a quick run's one flood" if s.quick else
            f"; not checked: the event loop waited over {ms(CPU_WAIT_LIMIT_S)} for a CPU"
        )  # fmt: skip
        lateness = Row(
            "deadline",
            f"{label}: p99 answer − deadline",
            p99 * 1e3,
            unit="ms",
            target=f"≤ {limit * 1e3:g} ms" if checked else "",
            passed=p99 <= limit if checked else None,
            context=f"p50 {ms(percentile(everything, 50))}, max {ms(max(everything))}, "
            f"launching took {ms(statistics.median(r.launch_s for r in runs))}; {of}"
            + ", ".join(f"{r.p99 * 1e3:.2f}" for r in runs)
            + f" ms){why}",
            in_force=in_force,
        )
        probe = statistics.median(r.probe_p99 for r in runs)
        after = statistics.median(r.probe_p99_after_launch for r in runs)
        base = statistics.median(r.unloaded_p99 for r in runs)
        ratio = statistics.median(r.ratio for r in runs)
        healthy = Row(
            "deadline",
            f"{label}: healthy p99 / unloaded",
            ratio,
            target="≤ 2×" if checked else "",
            passed=ratio <= 2 if checked else None,
            context=f"p99 {ms(probe)} during the flood (~{runs[0].probes} probes; "
            f"{ms(after)} once all were launched), {ms(base)} unloaded just before; "
            + (f"per flood {', '.join(f'{r.ratio:.2f}' for r in runs)}; " if len(runs) > 1 else "")
            + f"both floored at {FLOOR_S * 1e3:g} ms; {collector_summary(runs)}; "
            f"{waits(runs)}; {priority} priority{why}",
            in_force=in_force,
        )
        if bare is None:
            return [lateness, healthy]
        shares = [a.ratio / b.ratio for a, b in zip(runs, bare, strict=True)]
        share = statistics.median(shares)
        alone = statistics.median(r.ratio for r in bare)
        relative = Row(
            "deadline",
            f"{label}: healthy p99 / unloaded, toolrelay / bare anyio",
            share,
            target=f"≤ {BARE_SHARE_LIMIT:g}×",
            passed=share <= BARE_SHARE_LIMIT,
            context=f"toolrelay {ratio:.2f}× (p99 {ms(probe)} during the flood, {ms(base)} "
            f"unloaded just before), bare anyio {alone:.2f}× (p99 "
            f"{ms(statistics.median(r.probe_p99 for r in bare))}, "
            f"{ms(statistics.median(r.unloaded_p99 for r in bare))} unloaded just before), "
            "the same flood with `anyio.fail_after` around the handler; "
            + (f"per pair {', '.join(f'{x:.2f}' for x in shares)}; " if len(runs) > 1 else "")
            + f"all floored at {FLOOR_S * 1e3:g} ms; {collector_summary(runs)}; "
            f"{waits([*runs, *bare])}; {priority} priority{why}",
            in_force=in_force,
        )
        return [lateness, relative]

    # The checked floods arrive over flood_spread_s (10,000 calls/s for 1,000 calls); the
    # stress floods start every call in one event-loop iteration, which stalls the whole
    # process for the launch (any asyncio program would), so they are reported, not
    # checked; the diagnosis repeats the checked floods with the garbage collector paused.
    spread = s.flood_spread_s
    async_runs, bare_runs = await paired(s.async_flood, s.floods)
    # the first sync flood starts the key's worker threads, the next ones find them waiting
    cold = await floods("hang_sync", s.sync_flood, 1, spread)
    warm = await floods("hang_sync", s.sync_flood, s.floods, spread)
    async_burst = await floods("hang_async", s.async_flood, s.floods)
    sync_burst = await floods("hang_sync", s.sync_flood, s.floods)
    diagnosed = []
    for tool, n, kind in (("hang_async", s.async_flood, "async"),
                          ("hang_sync", s.sync_flood, "sync")):  # fmt: skip
        runs = await floods(tool, n, s.floods, spread, collector=False)
        label = f"{n} hung {kind} calls, collector paused"
        diagnosed.append(rows_for(label, runs, 0.0, checked=False)[1])  # its healthy row
    # every handler has returned by now, so every worker slot should be free again
    await anyio.sleep(0.2)
    held = d.workers.live().get("flood_sync", 0)
    calls = s.sync_flood * (1 + s.floods)
    rows = [
        *rows_for(f"{s.async_flood} hung async calls", async_runs, 0.005, bare=bare_runs),
        *rows_for(f"{s.sync_flood} hung sync calls, new threads", cold, 0.020),
        *rows_for(f"{s.sync_flood} hung sync calls, warm threads", warm, 0.020),
        *rows_for(
            f"stress: {s.async_flood} hung async calls in one loop iteration",
            async_burst,
            0.005,
            checked=False,
        ),
        *rows_for(
            f"stress: {s.sync_flood} hung sync calls in one loop iteration",
            sync_burst,
            0.020,
            checked=False,
        ),
        *diagnosed,
        Row(
            "deadline",
            "sync worker slots still held once every handler returned",
            held,
            unit="slots",
            target="0",
            passed=held == 0,
            context=f"after {calls} timed-out sync calls; abandoned count "
            f"{d.workers.abandoned().get('flood_sync', 0)} (a call timed out before a worker "
            "thread picked it up never runs, and its slot is never given back)",
        ),
    ]
    rows += await neighbour_rows(s, floods, priority, async_runs)
    return rows


async def neighbour_rows(
    s: Settings, floods: Any, priority: str, alone: Sequence[Flood]
) -> list[Row]:
    """The checked async flood again beside a CPU-bound process, and beside it the same
    flood without toolrelay: with the neighbour on the other CPU at the checked floods'
    priority (is a busy second core felt?), then on the event loop's own CPU with both at
    the normal priority (what a half share of one CPU does). Reported, not checked."""
    if not hasattr(os, "sched_setaffinity"):
        return []
    cpus = sorted(os.sched_getaffinity(0))
    mine, label = cpus[0], f"{s.async_flood} hung async calls, a CPU-bound neighbour"
    quiet = statistics.median(r.unloaded_p99 for r in alone)
    places = [("on the other CPU", cpus[1], priority)] if len(cpus) > 1 else []
    places.append(("on the event loop's CPU", mine, "normal"))
    if s.quick:  # a smoke run: one neighbour (a CPU burnt for ~1.5 s each), the sharper one
        places = places[-1:]
    os.sched_setaffinity(0, {mine})
    rows = []
    try:
        for where, cpu, level in places:
            if level == "normal":
                set_priority(False)
            with Neighbour(cpu):
                await anyio.sleep(0.2)  # it is spinning
                ours = await floods("hang_async", s.async_flood, s.floods, s.flood_spread_s)
                bare = await floods(
                    "hang_async",
                    s.async_flood,
                    s.floods,
                    s.flood_spread_s,
                    on=BareAnyio(s.flood_timeout_s),
                )
            probe = statistics.median(r.probe_p99 for r in ours)
            rows.append(
                Row(
                    "deadline",
                    f"{label} {where}: healthy p99 / unloaded",
                    statistics.median(r.ratio for r in ours),
                    context=f"p99 {ms(probe)} during the flood "
                    f"({max(probe, FLOOR_S) / max(quiet, FLOOR_S):.2f}× the unloaded p99 "
                    f"without the neighbour), {ms(statistics.median(r.unloaded_p99 for r in ours))}"
                    " unloaded beside it; the same flood without toolrelay (anyio.fail_after "
                    f"around the handler) {statistics.median(r.ratio for r in bare):.2f}×; the "
                    f"flood's CPU time {ms(statistics.median(r.cpu_s for r in ours))}, "
                    f"without toolrelay {ms(statistics.median(r.cpu_s for r in bare))}; "
                    f"{waits(ours)}; {level} priority, event loop on CPU {mine}, the "
                    f"neighbour on CPU {cpu} in its own session",
                )
            )
    finally:
        os.sched_setaffinity(0, set(cpus))
    return rows
