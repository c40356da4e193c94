"""One dispatcher process sharing its breakers through Redis, for the multi-replica tests.

    python breaker_replica.py REDIS_URL CONFIG_JSON SECONDS WORK_S
    python breaker_replica.py watch REDIS_URL UNTIL_PERIOD TIMEOUT_S
    python breaker_replica.py drive REDIS_URL TRANSITIONS PAUSE_S

Each mode creates the breaker of key ``svc``, waits for its first sync with Redis, prints
``ready`` and waits for a line on stdin. Then:

- (calls) it calls the tool ``work`` (an async handler that takes ``WORK_S`` and succeeds)
  from three concurrent loops for ``SECONDS``, and prints one JSON line per call: when the
  handler started and ended (``time.time()``, null if it did not run) and the outcome;
- ``watch`` reads the key's state every millisecond, as a call would, until it has seen
  period ``UNTIL_PERIOD`` (or for ``TIMEOUT_S``), and prints one JSON line per change it
  saw: ``at`` (``time.monotonic()``), ``period``, ``state``;
- ``drive`` forces the key open and closed in turn, ``TRANSITIONS`` times, ``PAUSE_S``
  apart, and prints one JSON line per transition: ``at`` (``time.monotonic()`` just before
  the force), the ``period`` it started and the ``state``.

``time.monotonic()`` is ``CLOCK_MONOTONIC``, one clock for every process on the machine
(Linux), so the watchers' and the driver's times compare.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import anyio

from toolrelay import (
    AuthContext,
    Dispatcher,
    DispatcherOptions,
    KeyPolicy,
    StorageOptions,
    ToolRegistry,
)
from toolrelay.config import parse_config


def linked(registry: ToolRegistry, url: str, config: KeyPolicy) -> Dispatcher:
    return Dispatcher(
        registry,
        DispatcherOptions(keys={"svc": config}, telemetry=False, storage=StorageOptions(url=url)),
        audit=None,
    )


async def ready(dispatcher: Dispatcher) -> None:
    """Create the breaker, wait for the link's first sync, say ``ready``, wait for ``go``."""
    dispatcher.breakers.get("svc")
    link = dispatcher.storage_link
    assert link is not None
    for _ in range(1000):  # until it listens and its first sync has read the state
        if link.commands and link.listening.is_set():
            break
        await anyio.sleep(0.01)
    print("ready", flush=True)
    await anyio.to_thread.run_sync(sys.stdin.readline)


def calls(url: str, config_json: str, seconds: str, work_s: str) -> list[dict[str, Any]]:
    registry = ToolRegistry()
    records: list[dict[str, Any]] = []

    @registry.tool(name="work", parameters={"type": "object"}, breaker_key="svc")
    async def work(args: dict[str, Any], ctx: AuthContext) -> str:
        record = records[args["i"]]
        record["start"] = time.time()
        await anyio.sleep(float(work_s))
        record["end"] = time.time()
        return "done"

    async def loop(until: float) -> None:
        while time.time() < until:
            record: dict[str, Any] = {"start": None, "end": None}
            records.append(record)
            result = await dispatcher.dispatch("work", {"i": len(records) - 1})
            record["outcome"] = "ok" if result.ok else str(result.error_type)
            await anyio.sleep(0.005)

    async def run() -> None:
        await ready(dispatcher)
        # Told to go once the key is open in Redis: call once this replica has heard it (a
        # loaded machine's pub/sub message can take longer than the test's pause; calls
        # made before it are a closed breaker's, not trials)
        for _ in range(500):
            if dispatcher.breakers.state("svc") != "closed":
                break
            await anyio.sleep(0.01)
        until = time.time() + float(seconds)
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(loop, until)
        await dispatcher.aclose()

    policy = parse_config({"keys": {"svc": json.loads(config_json)}}).keys["svc"]
    dispatcher = linked(registry, url, policy)
    anyio.run(run)
    return records


def watch(url: str, until_period: str, timeout_s: str) -> list[dict[str, Any]]:
    dispatcher = linked(ToolRegistry(), url, KeyPolicy())
    seen: list[dict[str, Any]] = []

    async def run() -> None:
        await ready(dispatcher)
        breaker = dispatcher.breakers.get("svc")
        last = (breaker.state, breaker.period)  # state first: it takes in what was announced
        deadline = time.monotonic() + float(timeout_s)
        while last[1] < int(until_period) and time.monotonic() < deadline:
            await anyio.sleep(0.001)
            now = (breaker.state, breaker.period)
            if now != last:
                seen.append({"at": time.monotonic(), "state": now[0], "period": now[1]})
                last = now
        await dispatcher.aclose()

    anyio.run(run)
    return seen


def drive(url: str, transitions: str, pause_s: str) -> list[dict[str, Any]]:
    dispatcher = linked(ToolRegistry(), url, KeyPolicy())
    done: list[dict[str, Any]] = []

    async def run() -> None:
        await ready(dispatcher)
        breaker = dispatcher.breakers.get("svc")
        for index in range(int(transitions)):
            at = time.monotonic()
            if index % 2 == 0:
                dispatcher.breakers.force_open("svc")
            else:
                dispatcher.breakers.force_close("svc")
            done.append({"at": at, "state": breaker.known, "period": breaker.period})
            await anyio.sleep(float(pause_s))
        await dispatcher.aclose()

    anyio.run(run)
    return done


def main() -> None:
    mode, *args = sys.argv[1:]
    if mode == "watch":
        records = watch(*args)
    elif mode == "drive":
        records = drive(*args)
    else:
        records = calls(mode, *args)
    for record in records:
        print(json.dumps(record))


if __name__ == "__main__":
    main()
