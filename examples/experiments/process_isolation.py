"""Experiment: sync calls that never return, in thread mode and in process mode, side by side.

A sync tool hangs forever (``time.sleep(3600)``). ``--calls`` of them are dispatched at once
with a ``--timeout`` deadline, once with ``isolation="thread"`` and once with
``isolation="process"``, each after a warm-up that leaves a warm worker per call (so the
flood measures the deadline, not worker starts). Reported for each mode:

- how many calls were answered ``timeout``, and the deadline lateness (answer time minus
  the deadline: p50, p99, max);
- what is left behind once every call is answered: worker threads still running (thread
  mode abandons them) and worker processes still alive (process mode kills them);
- the cost of a call on a warm worker (``--overhead-calls`` sequential trivial calls), and
  in process mode the cost of a call that needs a fresh worker (after the kills).

The last line is the report as JSON. Run:
``python examples/experiments/process_isolation.py [--calls 200] [--timeout 1.0]``.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import anyio

from toolrelay import (
    AuthContext,
    BreakerOptions,
    BulkheadOptions,
    Dispatcher,
    DispatcherOptions,
    KeyPolicy,
    RetryOptions,
    ToolRegistry,
)
from toolrelay.contract import Isolation

ANY = {"type": "object"}
KEY = "legacy-service"


def hang(args: dict[str, Any], ctx: AuthContext) -> None:
    """A blocking call that never returns (a wedged driver, a socket without a timeout)."""
    time.sleep(3600)


def quick(args: dict[str, Any], ctx: AuthContext) -> int:
    return int(args.get("n", 0))


def live_worker_processes() -> int:
    """Worker processes still alive: children of this process's forkserver (Linux /proc)."""
    me = os.getpid()

    def parent_and_state(pid: str) -> tuple[int, str]:
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat.rsplit(")", 1)[1].split()
        return int(fields[1]), fields[0]

    table: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                table[int(entry.name)] = parent_and_state(entry.name)
            except (OSError, ValueError, IndexError):
                continue
    children = {pid for pid, (ppid, _) in table.items() if ppid == me}
    return sum(1 for ppid, state in table.values() if ppid in children and state != "Z")


def worker_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("toolrelay-worker["))


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def run_mode(
    mode: Isolation, calls: int, deadline_s: float, overhead_calls: int
) -> dict[str, Any]:
    registry = ToolRegistry()
    registry.tool(name="hang", parameters=ANY, timeout_s=deadline_s, breaker_key=KEY,
                  isolation=mode)(hang)  # fmt: skip
    registry.tool(name="quick", parameters=ANY, timeout_s=30, breaker_key=KEY,
                  isolation=mode)(quick)  # fmt: skip
    breakers = {
        KEY: KeyPolicy(
            breaker=BreakerOptions(fail_max=10**9),
            retry=RetryOptions(max_attempts=1),
            bulkhead=BulkheadOptions(max_concurrent=calls),
        )
    }
    dispatcher = Dispatcher(registry, DispatcherOptions(telemetry=False, keys=breakers))
    report: dict[str, Any] = {"mode": mode, "calls": calls, "timeout_s": deadline_s}

    # warm-up: one worker per call (started concurrently, kept idle for reuse)
    async with anyio.create_task_group() as tg:
        for _ in range(calls):
            tg.start_soon(dispatcher.dispatch, "quick", {"n": 1})

    # per-call cost on a warm worker
    started = time.perf_counter()
    for n in range(overhead_calls):
        result = await dispatcher.dispatch("quick", {"n": n})
        assert result.ok, result.to_model()
    report["warm_call_us"] = round((time.perf_counter() - started) / overhead_calls * 1e6, 1)

    # the flood of calls that never return
    lateness: list[float] = []
    outcomes: list[str | None] = []

    async def one() -> None:
        began = anyio.current_time()
        result = await dispatcher.dispatch("hang", {})
        lateness.append(anyio.current_time() - began - deadline_s)
        outcomes.append(result.error_type)

    async with anyio.create_task_group() as tg:
        for _ in range(calls):
            tg.start_soon(one)
    report["answered_timeout"] = outcomes.count("timeout")
    report["lateness_ms"] = {
        "p50": round(quantile(lateness, 0.5) * 1e3, 1),
        "p99": round(quantile(lateness, 0.99) * 1e3, 1),
        "max": round(max(lateness) * 1e3, 1),
    }
    report["threads_left"] = worker_threads()
    report["processes_left"] = live_worker_processes()
    report["abandoned_threads"] = sum(dispatcher.workers.abandoned().values())
    report["killed_processes"] = sum(dispatcher.processes.killed().values())

    # the key after the flood: still usable (process mode: a fresh worker is started)
    began = time.perf_counter()
    after = await dispatcher.dispatch("quick", {"n": 7})
    report["call_after_flood_ms"] = round((time.perf_counter() - began) * 1e3, 1)
    report["usable_after_flood"] = after.to_model()
    await dispatcher.aclose()
    return report


def show(report: dict[str, Any]) -> None:
    late = report["lateness_ms"]
    print(
        f"{report['mode']} mode: {report['answered_timeout']}/{report['calls']} answered timeout; "
        f"deadline lateness p50 {late['p50']} ms, p99 {late['p99']} ms, max {late['max']} ms; "
        f"left behind: {report['threads_left']} worker threads, "
        f"{report['processes_left']} worker processes "
        f"(abandoned {report['abandoned_threads']}, killed {report['killed_processes']}); "
        f"warm call {report['warm_call_us']} µs; "
        f"call after the flood {report['call_after_flood_ms']} ms"
    )


async def main(calls: int, deadline_s: float, overhead_calls: int) -> dict[str, Any]:
    process = await run_mode("process", calls, deadline_s, overhead_calls)
    show(process)
    thread = await run_mode("thread", calls, deadline_s, overhead_calls)
    show(thread)
    return {
        "thread": thread,
        "process": process,
        "overhead_ratio": round(process["warm_call_us"] / thread["warm_call_us"], 2),
    }


if __name__ == "__main__":  # workers import this script as their main module: keep it guarded
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--timeout", type=float, default=1.0)
    parser.add_argument("--overhead-calls", type=int, default=2000)
    parser.add_argument("--backend", default="asyncio", choices=["asyncio", "trio"])
    options = parser.parse_args()
    result = anyio.run(main, options.calls, options.timeout, options.overhead_calls,
                       backend=options.backend)  # fmt: skip
    print(f"per-call cost on a warm worker: process mode = {result['overhead_ratio']}x thread mode")
    print(json.dumps(result))  # (thread mode's abandoned threads are daemons: exit anyway)
