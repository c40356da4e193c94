"""Breaker state shared through a real redis-server: replicas, slow and dead Redis.

Every test starts its own redis-server on a free loopback port. No Redis I/O may happen on
the dispatch path: decisions are local, replication runs on the link's own thread.
"""

from __future__ import annotations

import json
import logging
import socket
import statistics
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis as redis_py
from anyio.abc import Process

from helpers import wait_until
from redis_server import RedisServer, free_port
from slow_proxy import SlowProxy
from toolrelay import (
    AuthContext,
    BreakerOptions,
    Dispatcher,
    DispatcherOptions,
    ErrorType,
    KeyPolicy,
    RetryOptions,
    StorageOptions,
    ToolError,
    ToolRegistry,
)
from toolrelay.config import parse_config

pytestmark = [pytest.mark.anyio, pytest.mark.servers]

CONFIG = KeyPolicy(
    breaker=BreakerOptions(fail_max=3, reset_timeout_s=60), retry=RetryOptions(max_attempts=1)
)
REPLICA = Path(__file__).parent / "servers" / "breaker_replica.py"


class Flaky:
    def __init__(self) -> None:
        self.calls = 0
        self.failing = True

    async def __call__(self, args: dict[str, Any], ctx: AuthContext) -> Any:
        self.calls += 1
        if self.failing:
            raise ToolError("upstream 503", retryable=True)
        return {"n": self.calls}


def make(
    url: str, config: KeyPolicy = CONFIG, key: str = "crm", **storage: Any
) -> tuple[Dispatcher, Flaky]:
    """A replica of ``key`` (``config``) sharing its breaker through ``url``; ``storage``:
    more :class:`StorageOptions` (``timeout_s``, ``sync_interval_s``, …)."""
    registry = ToolRegistry()
    flaky = Flaky()
    registry.tool(name="lookup", parameters={"type": "object"}, breaker_key=key)(flaky)  # type: ignore[arg-type]
    options = DispatcherOptions(keys={key: config}, storage=StorageOptions(url=url, **storage))
    dispatcher = Dispatcher(registry, options, audit=None)
    return dispatcher, flaky


async def synced(dispatcher: Dispatcher, key: str = "crm") -> None:
    """Create the key's breaker and wait for its first sync with Redis."""
    dispatcher.breakers.get(key)
    link = dispatcher.storage_link
    assert link is not None
    await wait_until(lambda: link.commands > 0 and link.listening.is_set())


async def until_state(dispatcher: Dispatcher, state: str, key: str = "crm") -> float:
    """Seconds until ``dispatcher`` sees ``state`` (fails after 5 s)."""
    started = time.perf_counter()
    await wait_until(lambda: dispatcher.breakers.state(key) == state)
    return time.perf_counter() - started


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


def remote_state(url: str, key: str = "crm") -> dict[str, str]:
    client = redis_py.Redis.from_url(url, decode_responses=True)
    try:
        return client.hgetall(f"toolrelay:{key}")  # type: ignore[return-value]
    finally:
        client.close()


# -- what replicas agree on ----------------------------------------------------------------------
async def test_a_replica_adopts_an_open_breaker_from_another(redis: RedisServer) -> None:
    here, flaky = make(redis.url)
    there, _ = make(redis.url)
    flaky.failing = False
    await synced(here)
    await synced(there)
    seen: list[tuple[str, str, str]] = []
    here.breakers.add_listener(lambda *t: seen.append(t))
    for _ in range(3):
        await there.dispatch("lookup", {})
    assert there.breakers.state("crm") == "open"
    await until_state(here, "open")
    result = await here.dispatch("lookup", {})
    assert result.error_type is ErrorType.CIRCUIT_OPEN
    assert result.retry_after_s is not None and 55 < result.retry_after_s <= 60
    assert flaky.calls == 0  # the other replica's failures cut this one off
    assert seen == [("crm", "closed", "open")]
    # An operator closing it on one replica closes it on every replica.
    here.breakers.force_close("crm")
    await until_state(there, "closed")
    assert (await there.dispatch("lookup", {})).error_type is ErrorType.TOOL_ERROR
    await here.aclose()
    await there.aclose()


async def test_a_forced_open_holds_on_every_replica(redis: RedisServer) -> None:
    config = KeyPolicy(
        breaker=BreakerOptions(fail_max=3, reset_timeout_s=0.05), retry=RetryOptions(max_attempts=1)
    )
    here, _ = make(redis.url, config)
    there, other = make(redis.url, config)
    other.failing = False
    await synced(here)
    await synced(there)
    here.breakers.force_open("crm")
    await until_state(there, "open")
    await anyio.sleep(0.3)  # six break lengths: a pinned breaker admits no trial anywhere
    answers = [await there.dispatch("lookup", {}) for _ in range(5)]
    assert {a.error_type for a in answers} == {ErrorType.CIRCUIT_OPEN}
    assert other.calls == 0 and there.breakers.get("crm").pinned_open
    late, _ = make(redis.url, config)  # a replica that starts later learns it too
    await synced(late)
    await until_state(late, "open")
    assert late.breakers.get("crm").pinned_open
    here.breakers.force_close("crm")
    await until_state(there, "closed")
    assert (await there.dispatch("lookup", {})).ok
    for d in (here, there, late):
        await d.aclose()


async def test_a_replica_adopting_a_pin_says_an_operator_paused_it(redis: RedisServer) -> None:
    """The pin is shared, and so is the honest answer: the replica that adopted it refuses
    calls as paused by an operator (no trial promised), as the one that pinned it does."""
    config = KeyPolicy(
        breaker=BreakerOptions(fail_max=3, reset_timeout_s=0.05), retry=RetryOptions(max_attempts=1)
    )
    here, _ = make(redis.url, config)
    there, other = make(redis.url, config)
    await synced(here)
    await synced(there)
    here.breakers.force_open("crm")
    await until_state(there, "open")
    assert there.breakers.get("crm").pinned_open
    paused = "lookup is paused: an operator paused crm; calls are refused until it is released"
    for dispatcher in (here, there):
        answer = await dispatcher.dispatch("lookup", {})
        assert answer.error_type is ErrorType.CIRCUIT_OPEN and answer.retryable
        assert answer.message == paused
        assert answer.retry_after_s == pytest.approx(0.05)
        (spec,) = dispatcher.specs(unavailable="mark")
        assert spec["function"]["description"].startswith("[unavailable: paused by an operator] ")
    assert other.calls == 0
    await here.aclose()
    await there.aclose()


@pytest.mark.parametrize(("delay_s", "separately"), [(0.0, False), (0.04, False), (0.04, True)])
async def test_forcing_open_then_closed_at_once_never_rolls_back(
    redis: RedisServer, delay_s: float, separately: bool
) -> None:
    """An operator forces the key open and at once closed again on one replica: the reply
    to the first force (open, pinned) must not take the replica back to open once it has
    closed — whether both forces go to Redis in one pipeline or (``separately``) the close
    is decided while the open is on its way, 40 ms from Redis (a loopback proxy), so the
    first reply arrives on its own. The replica is watched until Redis, the replies and the
    announcements all agree that it is closed."""
    with SlowProxy("127.0.0.1", redis.port, 0.0) as proxy:
        here, _ = make(proxy.url, timeout_s=1.0, sync_interval_s=0.02)
        try:
            await synced(here)
            link = here.storage_link
            assert link is not None
            breaker = here.breakers.get("crm")
            seen: list[tuple[str, str, str]] = []
            here.breakers.add_listener(lambda *t: seen.append(t))
            proxy.delay_s = delay_s
            start = breaker.period
            here.breakers.force_open("crm")
            if separately:  # the open is in flight (taken by the writer) when the close comes
                await wait_until(lambda: link._ops.empty())
            here.breakers.force_close("crm")
            states = [here.breakers.state("crm")]
            pins = [breaker.pinned_open]

            def settled() -> bool:
                states.append(here.breakers.state("crm"))
                pins.append(breaker.pinned_open)
                return remote_state(redis.url).get("gen") == str(start + 2) and not breaker.inbox

            await wait_until(settled)
            commands = link.commands
            # two more round trips (syncs): every reply and announcement has arrived
            await wait_until(lambda: settled() and link.commands >= commands + 2)
            assert seen == [("crm", "closed", "open"), ("crm", "open", "closed")]
            assert "open" not in states and not any(pins), (states, pins)
            assert breaker.state == "closed" and not breaker.pinned_open
            assert breaker.period == start + 2  # in step with Redis's generation
        finally:
            await here.aclose()


async def opened_by_a_failure(here: Dispatcher, url: str) -> None:
    """One failure opens ``here``'s breaker; wait until Redis and ``here`` agree on it."""
    assert (await here.dispatch("lookup", {})).error_type is ErrorType.TOOL_ERROR
    breaker = here.breakers.get("crm")

    def agreed() -> bool:
        gen = remote_state(url).get("gen")
        return here.breakers.state("crm") == "open" and gen == str(breaker.period)

    await wait_until(agreed)


async def settled_pinned(here: Dispatcher, url: str, watch: list[tuple[str, bool]]) -> None:
    """Poll ``here`` (into ``watch``) until Redis has the pin and every reply and
    announcement about it has arrived."""
    link = here.storage_link
    assert link is not None
    breaker = here.breakers.get("crm")

    def settled() -> bool:
        watch.append((here.breakers.state("crm"), breaker.pinned_open))
        state = remote_state(url)
        return state.get("pinned") == "1" and state.get("gen") == str(breaker.period)

    await wait_until(settled)
    commands = link.commands
    await wait_until(lambda: settled() and link.commands >= commands + 2)


async def test_a_pin_is_not_undone_by_a_read_from_before_it(redis: RedisServer) -> None:
    """An operator pins a breaker that failures opened while the replica's periodic read of
    Redis is on its way (held by a paused proxy): that read, from before the pin, arrives
    after it (200 ms before the pin's reply) and must not unpin the replica meanwhile."""
    config = KeyPolicy(
        breaker=BreakerOptions(fail_max=1, reset_timeout_s=60), retry=RetryOptions(max_attempts=1)
    )
    with SlowProxy("127.0.0.1", redis.port, 0.0) as proxy:
        here, _ = make(proxy.url, config, timeout_s=2.0, sync_interval_s=0.02)
        try:
            await synced(here)
            await opened_by_a_failure(here, redis.url)
            seen: list[tuple[str, str, str]] = []
            here.breakers.add_listener(lambda *t: seen.append(t))
            proxy.pause()
            await anyio.sleep(0.1)  # five sync intervals: the next periodic read is held
            here.breakers.force_open("crm")
            proxy.delay_s = 0.2  # the held read comes back at once, the pin 200 ms later
            proxy.resume()
            watch: list[tuple[str, bool]] = []
            await settled_pinned(here, redis.url, watch)
            assert set(watch) == {("open", True)}, watch
            assert seen == []  # open all along: no transition
        finally:
            await here.aclose()


async def test_a_trial_place_asked_for_before_a_pin_does_not_undo_it(redis: RedisServer) -> None:
    """The break is over and a call has asked Redis for a trial place (which moves the key
    to half-open there) when the operator pins the breaker: the place's reply, from before
    the pin, must not take the replica to half-open and back."""
    config = KeyPolicy(
        breaker=BreakerOptions(fail_max=1, reset_timeout_s=0.05), retry=RetryOptions(max_attempts=1)
    )
    with SlowProxy("127.0.0.1", redis.port, 0.0) as proxy:
        here, flaky = make(proxy.url, config, timeout_s=2.0)
        try:
            await synced(here)
            await opened_by_a_failure(here, redis.url)
            await wait_until(lambda: here.breakers.blocked_for("crm") is None)  # break over
            seen: list[tuple[str, str, str]] = []
            here.breakers.add_listener(lambda *t: seen.append(t))
            proxy.pause()
            asked = await here.dispatch("lookup", {})  # asks Redis for a place: held
            assert asked.error_type is ErrorType.CIRCUIT_OPEN
            here.breakers.force_open("crm")
            proxy.resume()
            watch: list[tuple[str, bool]] = []
            await settled_pinned(here, redis.url, watch)
            assert set(watch) == {("open", True)}, watch
            assert seen == []
            assert flaky.calls == 1  # no trial ran
        finally:
            await here.aclose()


async def test_an_observed_transition_resets_no_counters(redis: RedisServer) -> None:
    """Replica B seeing A's transitions must not wipe the failures A counts afterwards."""
    here, flaky = make(redis.url)
    there, _ = make(redis.url)
    await synced(here)
    await synced(there)
    here.breakers.force_open("crm")
    await until_state(there, "open")  # B really observes the open state, then the close
    here.breakers.force_close("crm")
    await anyio.sleep(0.05)
    for _ in range(2):
        await here.dispatch("lookup", {})
    await until_state(there, "closed")  # B observes (and adopts) the transitions now
    there.breakers.snapshot()
    assert (await here.dispatch("lookup", {})).error_type is ErrorType.TOOL_ERROR
    assert here.breakers.state("crm") == "open"  # the third failure still opens it
    assert flaky.calls == 3
    await here.aclose()
    await there.aclose()


async def test_a_grown_break_is_shared(redis: RedisServer) -> None:
    """Failed trials on one replica grow the break (0.1 → 0.2 → 0.4, capped); every replica
    reports the grown break and answers a retry_after_s within it."""
    config = KeyPolicy(
        breaker=BreakerOptions(fail_max=1, reset_timeout_s=0.1, reset_timeout_max_s=0.4),
        retry=RetryOptions(max_attempts=1),
    )
    here, _ = make(redis.url, config)
    there, other = make(redis.url, config)
    other.failing = False
    await synced(here)
    await synced(there)
    assert (await here.dispatch("lookup", {})).error_type is ErrorType.TOOL_ERROR
    await until_state(there, "open")
    assert there.breakers.get("crm").snapshot()["break_s"] == 0.1
    for grown in (0.2, 0.4, 0.4):
        while True:  # the first call past the break asks Redis for the trial place
            before = time.perf_counter()
            result = await here.dispatch("lookup", {})
            if result.error_type is ErrorType.TOOL_ERROR:
                break  # the trial ran and failed: open again, for longer
            await anyio.sleep(0.01)
        mine, theirs = here.breakers.get("crm"), there.breakers.get("crm")
        assert mine.snapshot()["break_s"] == grown
        # B has adopted this open period (it is announced after A's trial fails)
        await wait_until(lambda: theirs.state == "open" and theirs.period == mine.period)  # noqa: B023
        assert theirs.snapshot()["break_s"] == grown
        answer = await there.dispatch("lookup", {})
        assert answer.error_type is ErrorType.CIRCUIT_OPEN
        # at most the grown break, and no less than what is left of it since the trial began
        elapsed = time.perf_counter() - before
        assert answer.retry_after_s is not None
        assert grown - elapsed - 0.005 <= answer.retry_after_s <= grown, (answer, elapsed)
    assert other.calls == 0  # no trial ran there: the place was in Redis
    await here.aclose()
    await there.aclose()


async def test_failures_on_several_replicas_add_up(redis: RedisServer) -> None:
    config = KeyPolicy(
        breaker=BreakerOptions(window="count", window_size=20, minimum_calls=6, failure_rate=0.5),
        retry=RetryOptions(max_attempts=1),
    )
    here, flaky = make(redis.url, config, sync_interval_s=0.02)
    there, other = make(redis.url, config, sync_interval_s=0.02)
    await synced(here)
    await synced(there)
    for _ in range(3):
        await there.dispatch("lookup", {})  # 3 failures there: under minimum_calls alone
    assert there.breakers.state("crm") == "closed"
    # here learns of them at its next sync
    await wait_until(lambda: here.breakers.get("crm").others.calls >= 3)
    for _ in range(2):
        await here.dispatch("lookup", {})
    assert here.breakers.state("crm") == "closed"  # 5 calls in the shared window
    await here.dispatch("lookup", {})
    assert here.breakers.state("crm") == "open"  # 6 calls, all failed
    await until_state(there, "open")
    assert flaky.calls == 3 and other.calls == 3
    await here.aclose()
    await there.aclose()


async def test_replicas_converge_quickly(redis: RedisServer) -> None:
    """The state one replica decides reaches another within a bound (measured in bench/)."""
    here, _ = make(redis.url)
    there, _ = make(redis.url)
    await synced(here)
    await synced(there)
    delays = []
    for index in range(20):
        if index % 2 == 0:
            here.breakers.force_open("crm")
            delays.append(await until_state(there, "open"))
        else:
            here.breakers.force_close("crm")
            delays.append(await until_state(there, "closed"))
    # pub/sub delivers in milliseconds; the periodic sync (0.2 s) bounds a missed message
    assert max(delays) < 1.0, delays
    await here.aclose()
    await there.aclose()


# -- several processes ---------------------------------------------------------------------------
@asynccontextmanager
async def replicas(*argvs: list[str]) -> AsyncIterator[list[Process]]:
    """Start replica processes (``servers/breaker_replica.py``), wait until all are ready."""
    procs: list[Process] = []
    try:
        for argv in argvs:
            procs.append(await anyio.open_process([sys.executable, str(REPLICA), *argv]))
        for proc in procs:
            assert proc.stdout is not None
            with anyio.fail_after(30):
                line = await proc.stdout.receive()
            assert line.strip() == b"ready", line
        yield procs
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


async def go(proc: Process) -> None:
    assert proc.stdin is not None
    await proc.stdin.send(b"go\n")


async def records_of(proc: Process, limit_s: float) -> list[dict[str, Any]]:
    """The JSON lines a replica prints until it exits (successfully)."""
    assert proc.stdout is not None
    chunks = []
    with anyio.fail_after(limit_s):
        async for chunk in proc.stdout:
            chunks.append(chunk)
        assert await proc.wait() == 0
    lines = b"".join(chunks).decode().splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


async def run_replicas(
    url: str, config: dict[str, Any], seconds: float, work_s: float, started: Any
) -> list[dict[str, Any]]:
    """Start three replica processes, run ``started()`` once all are ready, collect their
    calls."""
    argv = [url, json.dumps(config), str(seconds), str(work_s)]
    records: list[dict[str, Any]] = []
    async with replicas(argv, argv, argv) as procs:
        await started()
        for proc in procs:
            await go(proc)
        for proc in procs:
            records += await records_of(proc, seconds + 30)
    return records


async def test_three_processes_agree_on_the_state_quickly(
    redis: RedisServer, record_property: Any
) -> None:
    """One replica process forces the key open and closed in turn; the two others see every
    transition within a bound (the measured delays are printed; docs/breakers.md has them)."""
    transitions = 20
    watch = ["watch", redis.url, str(transitions), "10"]
    async with replicas(watch, watch, ["drive", redis.url, str(transitions), "0.05"]) as procs:
        *watchers, driver = procs
        for proc in watchers:
            await go(proc)
        await anyio.sleep(0.1)  # the watchers are watching
        await go(driver)
        done = await records_of(driver, 30)
        seen = [await records_of(proc, 30) for proc in watchers]
    assert [d["state"] for d in done] == ["open", "closed"] * (transitions // 2)
    assert [d["period"] for d in done] == list(range(1, transitions + 1))
    delays = []
    for watcher in seen:
        for d in done:
            # the first moment this replica had the transition (or a later one) in hand
            first = next((w for w in watcher if w["period"] >= d["period"]), None)
            assert first is not None, (d, watcher)
            if first["period"] == d["period"]:
                assert first["state"] == d["state"], (d, first)
            delays.append(first["at"] - d["at"])
    assert min(delays) > 0  # one clock for all processes: none saw a state before it was set
    assert max(delays) < 2.0, delays  # generous: pub/sub takes milliseconds, a sync 0.2 s
    ms = [1000 * d for d in delays]
    measured = {
        "n": len(ms),
        "p50_ms": round(statistics.median(ms), 2),
        "p99_ms": round(statistics.quantiles(ms, n=100, method="inclusive")[98], 2),
        "max_ms": round(max(ms), 2),
    }
    record_property("convergence_across_processes", measured)
    print("convergence across processes:", measured)


async def test_three_replicas_run_at_most_the_trial_limit(redis: RedisServer) -> None:
    config = {
        "breaker": {"fail_max": 1, "reset_timeout_s": 0.3, "half_open_max_calls": 1},
        "retry": {"max_attempts": 1},
    }
    opener, _ = make(redis.url, parse_config({"keys": {"svc": config}}).keys["svc"], key="svc")
    await synced(opener, "svc")

    async def open_it() -> None:
        await opener.dispatch("lookup", {})
        await wait_until(lambda: remote_state(redis.url, "svc").get("state") == "open")
        await anyio.sleep(0.05)  # the announcement reaches the replicas

    records = await run_replicas(redis.url, config, 2.0, 0.3, open_it)
    ran = sorted((r["start"], r["end"]) for r in records if r["start"] is not None)
    assert ran, "the breaker never closed again"
    first_end = min(end for _, end in ran if end is not None)
    before_close = [start for start, _ in ran if start < first_end]
    assert len(before_close) == 1, before_close  # one trial in all, across three replicas
    assert sum(r["outcome"] == "circuit_open" for r in records) > 3
    assert all(r["outcome"] in ("ok", "circuit_open") for r in records)
    await opener.aclose()


async def test_a_forced_open_holds_in_three_processes(redis: RedisServer) -> None:
    config = {"breaker": {"fail_max": 3, "reset_timeout_s": 0.1}, "retry": {"max_attempts": 1}}
    operator, _ = make(redis.url, parse_config({"keys": {"svc": config}}).keys["svc"], key="svc")
    await synced(operator, "svc")

    async def force() -> None:
        operator.breakers.force_open("svc")
        await wait_until(lambda: remote_state(redis.url, "svc").get("pinned") == "1")
        await anyio.sleep(0.05)

    records = await run_replicas(redis.url, config, 1.0, 0.01, force)
    assert records and all(r["outcome"] == "circuit_open" for r in records)
    assert all(r["start"] is None for r in records)  # ten break lengths, not one trial
    await operator.aclose()


# -- slow, dead and hung Redis -------------------------------------------------------------------
@pytest.mark.serial  # median dispatch under 20 ms
async def test_a_slow_redis_does_not_slow_dispatch(redis: RedisServer) -> None:
    with SlowProxy("127.0.0.1", redis.port, 0.040) as proxy:
        dispatcher, flaky = make(proxy.url, timeout_s=1.0)
        watcher, _ = make(redis.url)
        await synced(dispatcher)
        await synced(watcher)
        flaky.failing = False
        took = []
        for _ in range(200):
            started = time.perf_counter()
            assert (await dispatcher.dispatch("lookup", {})).ok
            took.append(time.perf_counter() - started)
        # One Redis round trip costs 40 ms here; a dispatch that waited on one would show it.
        assert statistics.median(took) < 0.020, statistics.median(took)
        assert dispatcher.storage_up
        flaky.failing = True
        for _ in range(3):
            await dispatcher.dispatch("lookup", {})
        assert dispatcher.breakers.state("crm") == "open"
        await until_state(watcher, "open")  # still replicated, just later
        await dispatcher.aclose()
        await watcher.aclose()


async def test_killing_redis_mid_run_loses_no_answers(
    redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    dispatcher, flaky = make(redis.url, probe_interval_s=0.1, sync_interval_s=0.02)
    await synced(dispatcher)
    flaky.failing = False
    results = []
    for index in range(60):
        if index == 20:
            redis.kill()
            await wait_until(lambda: not dispatcher.storage_up)  # the next sync finds it gone
        if index == 30:
            flaky.failing = True  # the service fails while Redis is gone
        results.append(await dispatcher.dispatch("lookup", {}))
    assert len(results) == 60
    assert all(r.ok for r in results[:30])
    kinds = [r.error_type for r in results[30:]]
    # local counts still open the breaker: three real failures, then fast-fails
    assert kinds[:3] == [ErrorType.TOOL_ERROR] * 3
    assert set(kinds[3:]) == {ErrorType.CIRCUIT_OPEN}
    assert flaky.calls == 33
    assert not dispatcher.storage_up
    warnings = [r for r in caplog.records if "unreachable" in r.getMessage()]
    assert len(warnings) == 1 and "using local breaker state" in warnings[0].getMessage()

    # Redis comes back (empty) on the same port: the link notices at the next probe and
    # hands over the open state it decided alone.
    with RedisServer(port=redis.port) as again:
        await wait_until(lambda: dispatcher.storage_up)
        await wait_until(lambda: remote_state(again.url).get("state") == "open")
        peer, _ = make(again.url)
        await synced(peer)
        await until_state(peer, "open")
        await peer.aclose()
        await dispatcher.aclose()


async def test_unreachable_redis_at_start_still_breaks(caplog: pytest.LogCaptureFixture) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    caplog.set_level(logging.WARNING, logger="toolrelay")
    dispatcher, flaky = make(url)
    kinds = [(await dispatcher.dispatch("lookup", {})).error_type for _ in range(5)]
    assert kinds == [ErrorType.TOOL_ERROR] * 3 + [ErrorType.CIRCUIT_OPEN] * 2
    assert flaky.calls == 3
    await wait_until(lambda: not dispatcher.storage_up)
    assert sum("unreachable" in r.getMessage() for r in caplog.records) == 1
    await dispatcher.aclose()


async def test_a_hung_redis_costs_dispatch_nothing() -> None:
    """A Redis that accepts connections and never answers: calls go on at full speed. (Not
    ``serial``: a median under 20 ms against a 1 s Redis timeout holds on a loaded machine.)"""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.05)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        url = f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
        # closing waits out the writer's command: 1 s, far above any dispatch still
        dispatcher, flaky = make(url, probe_interval_s=30, timeout_s=1.0)
        flaky.failing = False
        took = []
        for _ in range(100):
            started = time.perf_counter()
            assert (await dispatcher.dispatch("lookup", {})).ok
            took.append(time.perf_counter() - started)
        assert statistics.median(took) < 0.020  # not one 1 s Redis timeout on the loop
        flaky.failing = True
        kinds = [(await dispatcher.dispatch("lookup", {})).error_type for _ in range(4)]
        assert kinds == [ErrorType.TOOL_ERROR] * 3 + [ErrorType.CIRCUIT_OPEN]
        dispatcher.close()
    finally:
        stop.set()
        thread.join(5)
        listener.close()
        for conn in accepted:
            conn.close()


def storage_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("toolrelay-breaker-storage")}


async def test_closing_a_linked_dispatcher_logs_no_error(
    redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Closing the link while its listener waits for a message is not a failure."""
    caplog.set_level(logging.DEBUG, logger="toolrelay")
    before = storage_threads()
    dispatcher, flaky = make(redis.url)
    await synced(dispatcher)
    flaky.failing = False
    assert (await dispatcher.dispatch("lookup", {})).ok
    mine = storage_threads() - before
    assert len(mine) == 2  # the writer and the listener
    await dispatcher.aclose()
    await wait_until(lambda: not any(t.is_alive() for t in mine))
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert errors == [], [r.getMessage() for r in errors]


async def test_no_redis_command_per_call(redis: RedisServer) -> None:
    dispatcher, flaky = make(redis.url, sync_interval_s=30)
    flaky.failing = False
    client = redis_py.Redis.from_url(redis.url)
    await synced(dispatcher)

    def commands() -> int:
        stats = client.info("commandstats")
        return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")

    # The link's start-up syncs (the first, then a re-read once it listens) may still be
    # under way on a loaded machine: wait until Redis has heard nothing for a moment.
    before, quiet = commands(), 0
    while quiet < 3:
        await anyio.sleep(0.05)
        now = commands()
        quiet, before = (quiet + 1 if now == before else 0), now
    for _ in range(200):
        assert (await dispatcher.dispatch("lookup", {})).ok
    # Counts are published per sync interval, not per call: 200 calls send nothing (a late
    # start-up sync is a handful of commands, a command per call would be 200).
    assert commands() - before < 10
    client.close()
    await dispatcher.aclose()
