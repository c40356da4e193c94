"""A toolrelay process with a bit of everything, serving /metrics: for Prometheus tests.

python tests/workload.py PORT [SECONDS]
"""

from __future__ import annotations

import random
import sys
import threading
import time
from typing import Any

import anyio

import isolated_tools
from toolrelay import (
    AuthContext,
    BreakerOptions,
    BudgetOptions,
    BulkheadOptions,
    Dispatcher,
    DispatcherOptions,
    Fault,
    HedgeOptions,
    KeyPolicy,
    RetryOptions,
    ToolCall,
    ToolError,
    ToolRegistry,
)
from toolrelay.telemetry import serve_metrics

registry = ToolRegistry()
rng = random.Random(3)
OBJ = {"type": "object", "properties": {"n": {"type": "integer"}}}


@registry.tool(name="flaky", parameters=OBJ, breaker_key="flaky-svc", timeout_s=0.2)
async def flaky(args: dict[str, Any], ctx: AuthContext) -> Any:
    roll = rng.random()
    if roll < 0.45:
        raise ToolError("upstream 503", retryable=True)
    if roll < 0.55:
        await anyio.sleep(1)  # times out
    await anyio.sleep(rng.random() * 0.05)
    return {"ok": True}


@registry.tool(name="steady", parameters=OBJ, breaker_key="steady-svc", timeout_s=1)
async def steady(args: dict[str, Any], ctx: AuthContext) -> Any:
    await anyio.sleep(0.03)
    return {"n": args.get("n", 0)}


@registry.tool(name="legacy", parameters=OBJ, breaker_key="legacy-crm", timeout_s=0.05)
def legacy(args: dict[str, Any], ctx: AuthContext) -> Any:
    time.sleep(rng.choice([0.0, 0.2]))  # sometimes abandoned at the deadline
    return "done"


# isolation="process": a handler that never returns, its worker killed at the deadline
registry.tool(name="hung", parameters=OBJ, breaker_key="legacy-proc", timeout_s=0.2,
              isolation="process")(isolated_tools.hang)  # fmt: skip

tail_rng = random.Random(5)


@registry.tool(name="tail", parameters=OBJ, breaker_key="tail-svc", timeout_s=1)
async def tail(args: dict[str, Any], ctx: AuthContext) -> Any:
    await anyio.sleep(0.3 if tail_rng.random() < 0.2 else 0.005)  # a slow tail: hedged
    return "done"


@registry.tool(name="adaptive", parameters=OBJ, breaker_key="adaptive-svc", timeout_s=1)
async def adaptive(args: dict[str, Any], ctx: AuthContext) -> Any:
    await anyio.sleep(0.01)  # max_concurrent = "adaptive": the limit's gauges
    return "done"


@registry.tool(name="primary", parameters=OBJ, breaker_key="primary-svc", fallback=["backup"])
async def primary(args: dict[str, Any], ctx: AuthContext) -> Any:
    return "primary"  # never runs: its breaker is pinned open, so the fallback answers


@registry.tool(name="backup", parameters=OBJ, breaker_key="backup-svc")
async def backup(args: dict[str, Any], ctx: AuthContext) -> Any:
    return "backup"


async def main(port: int, seconds: float) -> None:
    dispatcher = Dispatcher(
        registry,
        DispatcherOptions(
            keys={
                "flaky-svc": KeyPolicy(
                    breaker=BreakerOptions(fail_max=3, reset_timeout_s=0.5),
                    retry=RetryOptions(max_attempts=2, backoff_initial_s=0.01),
                ),
                "steady-svc": KeyPolicy(bulkhead=BulkheadOptions(max_concurrent=2)),
                "tail-svc": KeyPolicy(
                    hedge=HedgeOptions(after_s=0.05), budget=BudgetOptions(share=0.1, min_per_s=0.0)
                ),
                "adaptive-svc": KeyPolicy(bulkhead=BulkheadOptions(max_concurrent="adaptive")),
            },
            faults=[Fault(kind="latency", tool="steady", latency_s=0.01, rate=0.3)],
            fault_seed=1,
        ),
    )
    dispatcher.breakers.force_open("primary-svc")
    server = serve_metrics(port)
    slot = dispatcher.model_slot(budget_s=2)
    stop_at = time.monotonic() + seconds
    rounds = 0
    try:
        while time.monotonic() < stop_at:
            calls = [
                ToolCall("flaky", "{}"),
                ToolCall("steady", '{"n": 1}'),
                ToolCall("steady", '{"n": 2}'),
                ToolCall("steady", '{"n": 3}'),  # the third exceeds max_concurrent=2
                ToolCall("legacy", "{}"),
                ToolCall("steady", '{"n": "x"}'),
                ToolCall("nope", "{}"),
                ToolCall("tail", "{}"),
                ToolCall("adaptive", "{}"),
                ToolCall("adaptive", "{}"),
                ToolCall("primary", "{}"),
            ]
            if rounds % 5 == 0:  # a kill costs a fork: a few a second is enough
                calls.append(ToolCall("hung", "{}"))
            rounds += 1
            async with slot.hold() as lease:
                await dispatcher.dispatch_many(calls, slot=lease)
            await anyio.sleep(0.02)
    finally:
        server.shutdown()


if __name__ == "__main__":
    threading.excepthook = lambda args: None
    anyio.run(main, int(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 120.0)
