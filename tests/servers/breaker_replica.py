"""One dispatcher process sharing its breakers through Redis, for the multi-replica tests.

    python breaker_replica.py REDIS_URL CONFIG_JSON SECONDS WORK_S

Creates the breaker of key ``svc``, waits for its first sync with Redis, prints ``ready``,
waits for a line on stdin, then calls the tool ``work`` (an async handler that takes
``WORK_S`` and succeeds) from three concurrent loops for ``SECONDS``. Prints one JSON line
per call: when the handler started and ended (``time.time()``, null if it did not run)
and the outcome.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import anyio

from toolrelay import AuthContext, BreakerConfig, Dispatcher, ToolRegistry


def main() -> None:
    url, config_json, seconds, work_s = sys.argv[1:5]
    config = BreakerConfig(**json.loads(config_json))
    registry = ToolRegistry()
    calls: list[dict[str, Any]] = []

    @registry.tool(name="work", parameters={"type": "object"}, breaker_key="svc")
    async def work(args: dict[str, Any], ctx: AuthContext) -> str:
        record = calls[args["i"]]
        record["start"] = time.time()
        await anyio.sleep(float(work_s))
        record["end"] = time.time()
        return "done"

    async def loop(until: float) -> None:
        while time.time() < until:
            record: dict[str, Any] = {"start": None, "end": None}
            calls.append(record)
            result = await dispatcher.dispatch("work", {"i": len(calls) - 1})
            record["outcome"] = "ok" if result.ok else str(result.error_type)
            await anyio.sleep(0.005)

    async def run() -> None:
        dispatcher.breakers.get("svc")
        link = dispatcher.storage_link
        assert link is not None
        for _ in range(1000):  # until it listens and its first sync has read the state
            if link.commands and link.listening.is_set():
                break
            await anyio.sleep(0.01)
        print("ready", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)
        until = time.time() + float(seconds)
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(loop, until)
        await dispatcher.aclose()

    dispatcher = Dispatcher(
        registry, breakers={"svc": config}, breaker_storage=url, telemetry=False, audit=None
    )
    anyio.run(run)
    for record in calls:
        print(json.dumps(record))


if __name__ == "__main__":
    main()
