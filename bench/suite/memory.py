"""Memory: RSS growth over many dispatches, and the peak with many in flight."""

from __future__ import annotations

import gc
import os
import resource
from collections import Counter as Tally
from typing import Any

import anyio
import anyio.lowlevel

from toolrelay import (
    AuthContext,
    BreakerOptions,
    BulkheadOptions,
    KeyPolicy,
)

from .harness import (
    ARGS,
    CTX,
    Row,
    Settings,
    dispatcher,
    noop_registry,
)


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


async def bench_memory(s: Settings) -> list[Row]:
    registry = noop_registry()
    gate, all_in = anyio.Event(), anyio.Event()
    entered = 0

    @registry.tool(name="parked", parameters={"type": "object"}, timeout_s=300.0,
                   breaker_key="parked")  # fmt: skip
    async def parked(args: dict[str, Any], ctx: AuthContext) -> Any:
        nonlocal entered
        entered += 1
        if entered == s.inflight:
            all_in.set()
        await gate.wait()
        return {}

    d = dispatcher(
        registry,
        keys={
            "parked": KeyPolicy(
                breaker=BreakerOptions(fail_max=10**9),
                bulkhead=BulkheadOptions(max_concurrent=2 * s.inflight),
            )
        },
    )

    async def mix(first: int, count: int) -> Tally[str]:
        """Mostly successes; every 10th call fails validation, every 50th names an
        unknown tool (a new name each time), every call has its own call id; the loop
        yields to the event loop every 100 calls."""
        kinds: Tally[str] = Tally()
        dispatch = d.dispatch
        for i in range(first, first + count):
            if i % 100 == 0:
                await anyio.lowlevel.checkpoint()  # as a host awaiting I/O would
            if i % 50 == 49:
                result = await dispatch(f"missing_{i}", ARGS, CTX, call_id=f"call_{i}")
            elif i % 10 == 9:
                result = await dispatch("noop", '{"city": 5}', CTX, call_id=f"call_{i}")
            else:
                result = await dispatch("noop", ARGS, CTX, call_id=f"call_{i}")
            kinds[str(result.error_type)] += 1
        return kinds

    await mix(0, s.memory_warmup)
    gc.collect()
    before = rss_bytes()
    quarter = s.memory_calls // 4
    marks = []
    kinds: Tally[str] = Tally()
    for q in range(4):
        kinds += await mix(s.memory_warmup + q * quarter, quarter)
        gc.collect()
        marks.append(rss_bytes())
    expected = {"None", "validation_error", "unknown_tool"}
    if set(kinds) != expected:
        raise RuntimeError(f"unexpected answers in the memory run: {dict(kinds)}")
    growth = (marks[-1] - before) / 1e6
    rows = [
        Row(
            "memory",
            f"RSS growth over {4 * quarter:,} dispatches",
            growth,
            unit="MB",
            target="≤ 10 MB",
            passed=growth <= 10,
            context=f"RSS {before / 1e6:.1f} MB after warm-up, then per quarter "
            + " / ".join(f"{x / 1e6:.1f}" for x in marks)
            + " MB",
        )
    ]

    gc.collect()
    idle = rss_bytes()
    results: list[Any] = []

    async def hold() -> None:
        results.append(await d.dispatch("parked", "{}", CTX))

    async with anyio.create_task_group() as tg:
        for _ in range(s.inflight):
            tg.start_soon(hold)
        with anyio.move_on_after(120):
            await all_in.wait()
        if entered < s.inflight:
            raise RuntimeError(f"only {entered} of {s.inflight} calls got in flight")
        loaded = rss_bytes()
        gate.set()
    if sum(1 for r in results if r.ok) != s.inflight:
        raise RuntimeError("parked calls did not all succeed once released")
    rows.append(
        Row(
            "memory",
            f"peak RSS with {s.inflight:,} dispatches in flight",
            peak_rss_bytes() / 1e6,
            unit="MB",
            context=f"RSS {idle / 1e6:.1f} → {loaded / 1e6:.1f} MB: "
            f"{(loaded - idle) / s.inflight / 1024:.1f} KiB per in-flight call",
        )
    )
    return rows
